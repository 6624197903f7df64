"""Finds and loads libshardps.so and declares the C ABI (worker/c_api.h) to ctypes.

Search order, first hit wins:
  1. $SHARDPS_LIBRARY: the library file, or a directory holding it (when set, nothing else
     is tried);
  2. this package's directory (a library copied next to the modules);
  3. the build tree this package sits in (<repo>/python/shardps -> <repo>/build/worker),
     or $SHARDPS_BUILD_DIR/worker;
  4. installed prefixes: the lib directories of sys.prefix and of the prefix this package
     is installed under;
  5. the system's search path (ldconfig cache, LD_LIBRARY_PATH).
When none loads, LibraryNotFoundError lists every path tried and why it failed.
"""

import ctypes
import ctypes.util
import os
import sys

_NAMES = ("libshardps.so", "libshardps.so.0.1")


class LibraryNotFoundError(OSError):
    """libshardps.so could not be loaded; the message lists the paths tried."""


class _Partition(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("num_elements", ctypes.c_uint64), ("server", ctypes.c_uint32)]


class _Stats(ctypes.Structure):
    _fields_ = [("bytes_pushed", ctypes.c_uint64), ("bytes_pulled", ctypes.c_uint64), ("requests", ctypes.c_uint64)]


def _candidate_dirs():
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here]
    build = os.environ.get("SHARDPS_BUILD_DIR")
    if build:
        dirs.append(os.path.join(build, "worker"))
    repo = os.path.dirname(os.path.dirname(here))
    dirs.append(os.path.join(repo, "build", "worker"))
    # <prefix>/lib/pythonX.Y/site-packages/shardps -> <prefix>/lib
    install_prefix = os.path.abspath(os.path.join(here, "..", "..", "..", ".."))
    for prefix in (sys.prefix, install_prefix, "/usr/local"):
        for lib in ("lib", "lib64", os.path.join("lib", "x86_64-linux-gnu")):
            dirs.append(os.path.join(prefix, lib))
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _candidates():
    explicit = os.environ.get("SHARDPS_LIBRARY")
    if explicit:  # an explicit choice is the only one: never load another library silently
        if os.path.isdir(explicit):
            yield from (os.path.join(explicit, n) for n in _NAMES)
        else:
            yield explicit
        return
    for d in _candidate_dirs():
        for n in _NAMES:
            yield os.path.join(d, n)
    found = ctypes.util.find_library("shardps")
    if found:
        yield found
    yield _NAMES[0]  # dlopen's own search: LD_LIBRARY_PATH, ld.so.cache


_loaded = None


def load():
    """The loaded library (loaded once per process)."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        _declare(lib)
        lib.shardps_loaded_from = path
        return lib
    raise LibraryNotFoundError(
        "cannot load libshardps.so; build it (tools/build.sh makes build/worker/libshardps.so) and, for a "
        "package installed with pip, set SHARDPS_LIBRARY to that file (or PREFIX/lib/libshardps.so of a "
        "`cmake --install`) or install it where it is looked for: `cmake --install build --prefix %s`. Tried:\n  "
        % _install_prefix() + "\n  ".join(tried))


def _install_prefix():
    """Where `cmake --install` puts a library this package finds: a venv's own prefix, else
    /usr/local (never the system interpreter's /usr, which the distribution owns)."""
    return sys.prefix if sys.prefix != sys.base_prefix else "/usr/local"


def _declare(lib):
    c = ctypes
    err = [c.c_char_p, c.c_size_t]
    w = c.c_void_p
    sigs = {
        "shardps_version": ([], c.c_char_p),
        "shardps_status_name": ([c.c_int], c.c_char_p),
        "shardps_worker_create": ([c.c_char_p, c.c_uint32, c.c_double, c.POINTER(c.c_void_p)] + err, c.c_int),
        "shardps_worker_create_secure": ([c.c_char_p, c.c_uint32, c.c_double, c.c_char_p, c.POINTER(c.c_void_p)]
                                         + err, c.c_int),
        "shardps_worker_destroy": ([w], None),
        "shardps_fail": ([w, c.c_char_p] + err, c.c_int),
        "shardps_declare_tensor": ([w, c.c_char_p, c.POINTER(c.c_int64), c.c_size_t] + err, c.c_int),
        "shardps_declare_tensor_codec": ([w, c.c_char_p, c.POINTER(c.c_int64), c.c_size_t, c.c_int, c.c_char_p]
                                         + err, c.c_int),
        "shardps_define_done": ([w] + err, c.c_int),
        "shardps_reset_declared": ([w] + err, c.c_int),
        "shardps_init_tensor": ([w, c.c_char_p, c.c_void_p, c.c_size_t, c.c_double] + err, c.c_int),
        "shardps_barrier": ([w, c.c_char_p] + err, c.c_int),
        "shardps_barrier_timeout": ([w, c.c_char_p, c.c_double] + err, c.c_int),
        "shardps_push": ([w, c.c_char_p, c.c_void_p, c.c_size_t, c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_pull": ([w, c.c_char_p, c.c_void_p, c.c_size_t, c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_skip_round": ([w, c.c_char_p, c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_push_pull": ([w, c.c_char_p, c.c_void_p, c.c_void_p, c.c_size_t, c.POINTER(c.c_uint64)] + err,
                              c.c_int),
        "shardps_push_pull_cuda": ([w, c.c_char_p, c.c_void_p, c.c_void_p, c.c_size_t, c.c_int, c.c_void_p,
                                    c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_push_pull_typed": ([w, c.c_char_p, c.c_void_p, c.c_void_p, c.c_size_t, c.c_int,
                                     c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_push_pull_mean_gradient": ([w, c.c_char_p, c.c_void_p, c.c_void_p, c.c_size_t,
                                             c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_wait": ([w, c.c_uint64, c.c_double] + err, c.c_int),
        "shardps_wait_any": ([w, c.POINTER(c.c_uint64), c.c_size_t, c.c_double, c.POINTER(c.c_size_t)] + err,
                             c.c_int),
        "shardps_rank": ([w, c.POINTER(c.c_uint32)] + err, c.c_int),
        "shardps_world_size": ([w, c.POINTER(c.c_uint32)] + err, c.c_int),
        "shardps_num_servers": ([w, c.POINTER(c.c_uint32)] + err, c.c_int),
        "shardps_consistency": ([w, c.POINTER(c.c_int)] + err, c.c_int),
        "shardps_update_mode": ([w, c.POINTER(c.c_int)] + err, c.c_int),
        "shardps_rejoin_round": ([w, c.POINTER(c.c_uint64)] + err, c.c_int),
        "shardps_rejoin_passed_barrier": ([w, c.c_char_p, c.POINTER(c.c_int)] + err, c.c_int),
        "shardps_config_text": ([w, c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)] + err, c.c_int),
        "shardps_config_field": ([w, c.c_char_p, c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)] + err, c.c_int),
        "shardps_partitions": ([w, c.c_char_p, c.POINTER(_Partition), c.c_size_t, c.POINTER(c.c_size_t)] + err,
                               c.c_int),
        "shardps_stats": ([w, c.POINTER(_Stats)] + err, c.c_int),
    }
    for name, (args, result) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = result
