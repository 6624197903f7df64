"""One ShardPS worker over the C ABI (worker/c_api.h).

Buffers are contiguous and on the CPU: torch tensors, numpy arrays or writable
buffer-protocol objects of format 'f' (push_pull_cuda takes CUDA tensors instead). They are float32,
except that push_pull also takes the float16 or bfloat16 buffers of a tensor defined with that dtype
(numpy float16, buffer format 'e'). They are passed to the library as they are (no copy)
and borrowed until the request's handle is waited on (whatever the wait returns); a Handle
keeps them alive until then.

Thread safety: a Worker may be used from several threads (the C++ worker serialises what
needs it); define() must complete before any data request.

Signals: a blocking wait returns to Python at least every _SLICE seconds, so Ctrl-C
(KeyboardInterrupt) interrupts it; the interrupted request's buffers are kept for the
worker's lifetime, like those of a timed-out one. A process forked after the Worker was
made cannot use it (its connections belong to the parent): every call raises RuntimeError
there, and the child's exit leaves the parent's worker alone.
"""

import ctypes
import os
import time
import traceback

from . import _library
from .errors import check, DeadlineExceededError, ShardPSError

_ERR_LEN = 1024
_FLOAT32 = 1  # SHARDPS_FLOAT32
DTYPES = {"float32": 1, "float16": 2, "bfloat16": 3}  # SHARDPS_FLOAT32, ...
_ITEM_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}
_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}
_FORMATS = {"f": "float32", "e": "float16"}

# The longest a blocking wait stays in the library before Python checks for signals.
_SLICE = 0.25

# Forks this process is the child of: a Worker made before the last one belongs to another
# process. Compared on every call, where os.getpid() would be a system call each time.
_forks = 0


def _count_fork():
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)

CONSISTENCY_NAMES = {1: "sync", 2: "async", 3: "ssp"}
UPDATE_MODE_NAMES = {0: "on_server", 1: "sum_only"}


def _buffer(obj, writable, what, dtypes=("float32",)):
    """(address, element count, dtype name, object to keep alive) of a CPU buffer whose dtype
    is one of `dtypes`."""
    module = type(obj).__module__ or ""
    if module.startswith("torch"):
        if obj.device.type != "cpu":
            raise TypeError("%s is on %s; ShardPS takes CPU tensors (copy it with .cpu())" % (what, obj.device))
        dtype = _TORCH_DTYPES.get(str(obj.dtype))
        if dtype not in dtypes:
            raise TypeError("%s has dtype %s; ShardPS takes %s here (convert with .float())"
                            % (what, obj.dtype, " or ".join(dtypes)))
        if not obj.is_contiguous():
            raise ValueError("%s is not contiguous (use .contiguous())" % what)
        return obj.data_ptr(), obj.numel(), dtype, obj
    if module.startswith("numpy"):
        if str(obj.dtype) not in dtypes:
            raise TypeError("%s has dtype %s; ShardPS takes %s here" % (what, obj.dtype, " or ".join(dtypes)))
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError("%s is not C-contiguous" % what)
        if writable and not obj.flags["WRITEABLE"]:
            raise ValueError("%s is read-only" % what)
        return obj.ctypes.data, obj.size, str(obj.dtype), obj
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError("%s must be a torch tensor, a numpy array or a buffer of %s, got %s"
                        % (what, " or ".join(dtypes), type(obj).__name__)) from None
    dtype = _FORMATS.get(view.format)
    if dtype not in dtypes or not view.c_contiguous:
        raise TypeError("%s must be a contiguous buffer of %s (format %s), got format %r"
                        % (what, " or ".join(dtypes), " or ".join(f for f, d in _FORMATS.items() if d in dtypes),
                           view.format))
    if view.readonly:
        raise ValueError("%s is read-only; pass a writable buffer" % what)
    array = (ctypes.c_char * view.nbytes).from_buffer(obj)
    return ctypes.addressof(array), view.nbytes // view.itemsize, dtype, (obj, array)


def _name(name, what="tensor name"):
    """`name` as the C ABI takes it: UTF-8 bytes without a NUL, which would cut it short."""
    encoded = name.encode()
    if b"\0" in encoded:
        raise ValueError("%s %r contains a NUL character" % (what, name))
    return encoded


def _refused(error, handle):
    """Whether `error` is the library's refusal to wait on `handle`, which another thread waits
    on (ABORTED): that thread's wait ends it; the refused call leaves it, and its buffers, alone."""
    return error.status == "ABORTED" and not handle.done


class Handle:
    """An outstanding request; wait() once."""

    def __init__(self, worker, ident, what, keep):
        self._worker, self.id, self.what, self._keep = worker, ident, what, keep
        self.done = False

    def wait(self, timeout=None):
        self._worker.wait(self, timeout)

    def __del__(self):
        # Dropped without a wait: the request may still read its gradient or write its
        # weights, so its buffers live as long as the worker.
        if not self.done and self._keep is not None:
            self._worker._orphans.append(self._keep)


class Completions:
    """Outstanding handles of one worker, completed one wait_any() at a time in the order
    they finish (Worker.completions). The handle array handed to the library is built once:
    a completed handle's place is taken by the last one, so completing n requests costs
    O(n) besides the waits, where n calls of Worker.wait_any cost O(n^2)."""

    def __init__(self, worker, handles):
        self._worker = worker
        self._handles = list(handles)
        for h in self._handles:
            worker._check_outstanding(h)
        self._ids = (ctypes.c_uint64 * len(self._handles))(*[h.id for h in self._handles])

    def __len__(self):
        return len(self._handles)

    @property
    def handles(self):
        """The handles not yet completed (in no particular order)."""
        return list(self._handles)

    def wait_any(self, timeout=None):
        """Worker.wait_any over the handles not yet completed; the one it returns, or whose
        error it raises, leaves the set."""
        count = len(self._handles)
        index = ctypes.c_size_t(count)
        worker = self._worker
        deadline = time.monotonic() + worker._timeout(timeout)
        try:
            while True:
                left = max(deadline - time.monotonic(), 0.0)
                code, err = worker._raw("shardps_wait_any", worker._live(), self._ids, count, min(left, _SLICE),
                                        ctypes.byref(index))
                if index.value < count or left <= _SLICE or worker._status(code) != "DEADLINE_EXCEEDED":
                    check(worker._lib, code, err, "shardps_wait_any")
                    break
        except ShardPSError as e:
            e.handle = self._take(index.value) if index.value < count else None
            if e.handle is not None:
                worker._retire(e.handle, released=True)
            raise
        done = self._take(index.value)
        worker._retire(done, released=True)
        return done

    def _take(self, i):
        taken, last = self._handles[i], self._handles.pop()
        if i < len(self._handles):
            self._handles[i], self._ids[i] = last, self._ids[len(self._handles)]
        return taken



def ends_cleanly(exc_type, exc):
    """Whether a script ending on this (None: no exception) ended as it was meant to: sys.exit()
    or sys.exit(0), or a KeyboardInterrupt (Ctrl-C, a launcher's SIGINT), which stops a job as
    `shardps train` takes SIGINT. Its worker leaves the job rather than failing it."""
    if exc_type is None or issubclass(exc_type, KeyboardInterrupt):
        return True
    return issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0)


def describe_exception(exc_type, exc, tb):
    """One line for the scheduler: the exception, its message and where it was raised."""
    where = ""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if frames:
        last = frames[-1]
        where = " (%s:%d in %s)" % (os.path.basename(last.filename), last.lineno, last.name)
    text = str(exc) if exc is not None else ""
    return "uncaught %s%s%s" % (exc_type.__name__, ": " + text if text else "", where)

class Worker:
    """A worker of a running cluster. Creating one registers with the scheduler and returns
    once every server and worker has registered (or fails after rendezvous_timeout seconds,
    saying who is missing). `timeout` is the default for every later blocking call."""

    def __init__(self, scheduler, rank, rendezvous_timeout=60.0, timeout=60.0, security_config=None):
        """security_config: a config file whose security { } block reaches a secured
        cluster (README "Security"); None: plain."""
        self._lib = _library.load()
        self._ptr = None
        self._pid, self._forks = os.getpid(), _forks
        if not 0 <= int(rank) < 2 ** 32:
            raise ValueError("rank %d is not in [0, 2^32)" % int(rank))
        self.timeout = float(timeout)
        self._shapes, self._dtypes = {}, {}
        self._orphans = []
        ptr = ctypes.c_void_p()
        self._call("shardps_worker_create_secure", scheduler.encode(), int(rank), float(rendezvous_timeout),
                   security_config.encode() if security_config else None, ctypes.byref(ptr))
        self._ptr = ptr

    # ---- plumbing ----
    def _call(self, fn, *args):
        code, err = self._raw(fn, *args)
        check(self._lib, code, err, fn)

    def _raw(self, fn, *args):
        """(status code, message) of C function `fn`."""
        err = ctypes.create_string_buffer(_ERR_LEN)
        code = getattr(self._lib, fn)(*args, err, _ERR_LEN)
        return code, err.value

    def _status(self, code):
        return self._lib.shardps_status_name(code).decode()

    def _query(self, fn, ctype):
        value = ctype()
        self._call(fn, self._live(), ctypes.byref(value))
        return value.value

    def _live(self):
        if self._ptr is None:
            raise ValueError("the worker is closed")
        if self._forks != _forks:
            raise RuntimeError("this ShardPS worker was made in process %d; process %d, forked from it, cannot "
                               "use it (make a Worker in the child, or fork before shardps.init())"
                               % (self._pid, os.getpid()))
        return self._ptr

    def close(self, error=None):
        """Leaves the job (the C++ worker's destructor); further calls raise ValueError. In a
        forked child it only forgets the parent's worker. `error`: why the job stops, when it
        stops on one; the scheduler then lists this worker as failed with it, not as left."""
        if self._ptr is not None:
            if self._forks == _forks:
                if error:
                    self._raw("shardps_fail", self._ptr, str(error).encode("utf-8", "replace"))
                self._lib.shardps_worker_destroy(self._ptr)
            self._ptr = None
            self._orphans.clear()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(error=None if ends_cleanly(exc_type, exc) else describe_exception(exc_type, exc, tb))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- what the scheduler handed this worker ----
    @property
    def rank(self):
        return self._query("shardps_rank", ctypes.c_uint32)

    @property
    def size(self):
        """The number of workers in the job."""
        return self._query("shardps_world_size", ctypes.c_uint32)

    @property
    def num_servers(self):
        """The servers in the job as this worker last saw it: those its newest shard map lists as
        live (neither declared dead nor left). A server that joined the running job as one more
        counts once a map listing it reached the worker, whether it holds partitions yet or not.
        Before the tensors are defined: the config's num_servers."""
        return self._query("shardps_num_servers", ctypes.c_uint32)

    @property
    def consistency(self):
        """"sync", "async" or "ssp"."""
        return CONSISTENCY_NAMES[self._query("shardps_consistency", ctypes.c_int)]

    @property
    def staleness(self):
        """SSP's bound: how many rounds a worker may run ahead of the slowest (0 unless
        consistency is "ssp")."""
        return int(self.config_field("staleness")) if self.consistency == "ssp" else 0

    @property
    def update_mode(self):
        """"on_server" (servers run the optimizer) or "sum_only" (the worker library does)."""
        return UPDATE_MODE_NAMES[self._query("shardps_update_mode", ctypes.c_int)]

    @property
    def rejoin_round(self):
        """0 for a worker that joined at the start. For one whose rank had been removed from the
        running job (its process killed, or it left) and that registered again: the round its
        updates start at (sync, SSP; async has no common rounds and says 1); the job trained
        without it until then. Such a worker pulls the current weights
        (shardps.torch.broadcast_parameters does so) and, in sync, skips the steps already taken."""
        return self._query("shardps_rejoin_round", ctypes.c_uint64)

    def passed_before_rejoin(self, barrier):
        """True when the job had passed the barrier named `barrier` before this worker rejoined
        it (never for a worker there from the start). Barriers are reusable: entering such a
        barrier again would wait for every other worker to enter it once more."""
        passed = ctypes.c_int()
        self._call("shardps_rejoin_passed_barrier", self._live(), _name(barrier, "barrier name"),
                   ctypes.byref(passed))
        return passed.value != 0

    def config_text(self):
        """The cluster configuration, protobuf text (proto/config.proto)."""
        needed = ctypes.c_size_t()
        err = ctypes.create_string_buffer(_ERR_LEN)
        self._lib.shardps_config_text(self._live(), None, 0, ctypes.byref(needed), err, _ERR_LEN)
        out = ctypes.create_string_buffer(needed.value)
        self._call("shardps_config_text", self._live(), out, needed.value, ctypes.byref(needed))
        return out.value.decode()

    def config_field(self, path):
        """One field of the cluster configuration by the path `--set` takes, e.g.
        "optimizer.learning_rate": a scalar as text (an unset field reads as its default;
        enums by name), a message as protobuf text, compression.tensor_codecs as
        "name=spec" lines. An unknown path raises InvalidArgumentError naming the fields."""
        path = path.encode()
        needed = ctypes.c_size_t()
        code, err = self._raw("shardps_config_field", self._live(), path, None, 0, ctypes.byref(needed))
        if self._status(code) != "OUT_OF_RANGE":
            check(self._lib, code, err, "shardps_config_field")
        out = ctypes.create_string_buffer(needed.value)
        self._call("shardps_config_field", self._live(), path, out, needed.value, ctypes.byref(needed))
        return out.value.decode()

    def stats(self):
        s = _library._Stats()
        self._call("shardps_stats", self._live(), ctypes.byref(s))
        return {"bytes_pushed": s.bytes_pushed, "bytes_pulled": s.bytes_pulled, "requests": s.requests}

    # ---- tensors ----
    def define(self, tensors):
        """Declares every tensor of the job and waits until every server serves them; the same
        list in the same order on every worker. Once per worker. Each entry is
        (name, shape[, dtype[, codec]]): dtype "float32" (default), "float16" or "bfloat16" is
        the element type of the buffers push_pull will take for it (values travel as float32
        or in the codec); codec a codec spec ("fp16", "onebit", "topk:ratio=0.01", ...) for its
        pushed gradients, None: the cluster config's. An unknown dtype raises ValueError; a
        codec the cluster cannot use raises InvalidArgumentError naming the tensor."""
        if self._shapes:
            raise ValueError("tensors are already defined on this worker")
        # A failed define (refused shape, timeout) may simply be called again.
        self._call("shardps_reset_declared", self._live())
        shapes, dtypes = {}, {}
        for entry in tensors:
            entry = tuple(entry)
            if not 2 <= len(entry) <= 4:
                raise ValueError("tensor entry %r is not (name, shape[, dtype[, codec]])" % (entry,))
            name, shape, dtype, codec = entry + ("float32", None)[len(entry) - 2:]
            if dtype not in DTYPES:
                raise ValueError("tensor %r: dtype %r is not one of %s" % (name, dtype, ", ".join(DTYPES)))
            shape = [int(d) for d in shape]
            dims = (ctypes.c_int64 * len(shape))(*shape)
            self._call("shardps_declare_tensor_codec", self._live(), _name(name), dims, len(shape), DTYPES[dtype],
                       _name(codec, "codec") if codec else None)
            shapes[name], dtypes[name] = shape, dtype
        self._call("shardps_define_done", self._live())
        self._shapes, self._dtypes = shapes, dtypes

    @property
    def tensors(self):
        """{name: shape} of the defined tensors."""
        return dict(self._shapes)

    @property
    def dtypes(self):
        """{name: dtype name} of the defined tensors."""
        return dict(self._dtypes)

    def partitions(self, name):
        """[(offset, num_elements, server), ...] of `name` in shard-map order."""
        count = ctypes.c_size_t()
        err = ctypes.create_string_buffer(_ERR_LEN)
        self._lib.shardps_partitions(self._live(), _name(name), None, 0, ctypes.byref(count), err, _ERR_LEN)
        out = (_library._Partition * count.value)()
        self._call("shardps_partitions", self._live(), _name(name), out, count.value, ctypes.byref(count))
        return [(p.offset, p.num_elements, p.server) for p in out]

    def _elements(self, name):
        """The element count of tensor `name`; KeyError naming the defined ones if it is not."""
        if name not in self._shapes:
            raise KeyError("tensor %r is not defined on this worker (defined: %s)"
                           % (name, ", ".join(sorted(self._shapes)) or "none"))
        expected = 1
        for d in self._shapes[name]:
            expected *= d
        return expected

    def _checked(self, name, obj, writable, what):
        expected = self._elements(name)
        ptr, n, _, keep = _buffer(obj, writable, "%s of %r" % (what, name))
        if n != expected:
            raise ValueError("%s of %r has %d elements; the tensor is declared with shape %s (%d elements)"
                             % (what, name, n, self._shapes[name], expected))
        return ptr, n, keep

    def init_tensor(self, name, values, timeout=None):
        """Sets the initial weights of `name` (one worker does this, before any update)."""
        ptr, n, _ = self._checked(name, values, False, "values")
        self._call("shardps_init_tensor", self._live(), _name(name), ptr, n, self._timeout(timeout))

    def barrier(self, name, timeout=None):
        """Returns once every worker still in the job has entered the barrier `name`; with
        `timeout` (seconds) raises DeadlineExceededError naming the missing ranks after it."""
        if timeout is None:
            self._call("shardps_barrier", self._live(), _name(name, "barrier name"))
        else:
            self._call("shardps_barrier_timeout", self._live(), _name(name, "barrier name"), float(timeout))

    def push(self, name, grad):
        g, n, keep = self._checked(name, grad, False, "gradient")
        return self._start("shardps_push", name, (g, n), keep)

    def skip_round(self, name):
        """Takes this worker's part in its next round of `name` without a gradient (a frozen
        parameter), so the tensor's rounds keep pace with the rest of the model's: sync
        checkpoints wait for every partition's round. A round no worker pushed a gradient to
        applies no optimizer step; in one others pushed to, this worker counts as a zero.
        Returns a handle to wait on. FailedPreconditionError where no round waits for pushes
        (async; ssp applied on arrival): push nothing for a frozen parameter there."""
        self._elements(name)
        return self._start("shardps_skip_round", name, (), None)

    def pull(self, name, out):
        w, n, keep = self._checked(name, out, True, "weights")
        return self._start("shardps_pull", name, (w, n), keep)

    def push_pull(self, name, grad, out):
        """Pushes `grad` and fills `out` with the weights that include it (sync), or the
        latest weights (async). With update_mode sum_only, `out` must hold the current
        weights: the library applies the configured optimizer to it in place. Both buffers
        have the dtype the tensor was defined with (float16 and bfloat16 go zero-copy to the
        library, which converts them); another dtype or size raises InvalidArgumentError."""
        self._elements(name)
        g, n, dtype, keep_g = _buffer(grad, False, "gradient of %r" % name, tuple(DTYPES))
        w, n_out, dtype_out, keep_w = _buffer(out, True, "weights of %r" % name, tuple(DTYPES))
        if (n, dtype) != (n_out, dtype_out):
            raise ValueError("gradient and weights of %r differ: %d %s and %d %s elements"
                             % (name, n, dtype, n_out, dtype_out))
        nbytes = n * _ITEM_SIZES[dtype]
        return self._start("shardps_push_pull_typed", name, (g, w, nbytes, DTYPES[dtype]), (keep_g, keep_w))

    def push_pull_mean_gradient(self, name, grad, out):
        """Sum-only mode, for a job that steps its own optimizer: pushes `grad` (float32) and
        fills `out` (float32, another buffer) with the round's gradient averaged over the
        workers. Raises ShardPSError (FAILED_PRECONDITION) when the servers run the optimizer."""
        g, n, keep_g = self._checked(name, grad, False, "gradient")
        m, _, keep_m = self._checked(name, out, True, "mean gradient")
        return self._start("shardps_push_pull_mean_gradient", name, (g, m, n), (keep_g, keep_m))

    def push_pull_cuda(self, name, grad, out, stream=None):
        """push_pull for float32 tensors in CUDA memory (torch tensors, or objects with
        data_ptr(), numel() and element_size()), without a CPU tensor in between: the library
        copies the gradient and the current weights to pinned host memory in the order of
        `stream` (a cudaStream_t as an int, e.g. torch.cuda.current_stream().cuda_stream;
        None: the default stream), and wait() copies the new weights back into `out` in that
        order. Both tensors must stay alive until wait() returns. Raises UnimplementedError
        when the library was built without CUDA."""
        expected = self._elements(name)
        for what, t in (("gradient", grad), ("weights", out)):
            if t.element_size() != _ITEM_SIZES["float32"] or not t.is_contiguous():
                raise ValueError("%s of %r must be a contiguous float32 CUDA tensor" % (what, name))
        if grad.numel() != expected or out.numel() != expected:
            raise ValueError("gradient and weights of %r must have %d elements (shape %s), got %d and %d"
                             % (name, expected, self._shapes[name], grad.numel(), out.numel()))
        nbytes = expected * _ITEM_SIZES["float32"]
        args = (ctypes.c_void_p(grad.data_ptr()), ctypes.c_void_p(out.data_ptr()), nbytes, _FLOAT32,
                ctypes.c_void_p(stream or 0))
        return self._start("shardps_push_pull_cuda", name, args, (grad, out))

    def _start(self, fn, name, args, keep):
        ident = ctypes.c_uint64()
        self._call(fn, self._live(), _name(name), *args, ctypes.byref(ident))
        return Handle(self, ident.value, "%s(%s)" % (fn[len("shardps_"):], name), keep)

    def wait(self, handle, timeout=None):
        """Blocks until the request completes; raises ShardPSError (DeadlineExceededError at the
        timeout, naming the tensor and the servers still owing an answer)."""
        self._check_outstanding(handle)
        deadline = time.monotonic() + self._timeout(timeout)
        refused = False
        try:
            # Slices of wait_any, which leaves the handle outstanding when none answered, so
            # Python sees Ctrl-C in between; the last stretch is a wait, which releases it.
            while deadline - time.monotonic() > _SLICE and not self._answered(handle, _SLICE):
                pass
            if not handle.done:
                self._last_stretch(handle, deadline, timeout)
        except ShardPSError as e:
            refused = _refused(e, handle)
            raise
        finally:
            # done: the library released the handle (see _answered and _last_stretch).
            # Refused: another thread's wait holds it, and ends it.
            if not refused:
                self._retire(handle, handle.done)

    def _last_stretch(self, handle, deadline, timeout):
        """shardps_wait until `deadline`; its timeout error names the whole wait, not the stretch."""
        try:
            self._call("shardps_wait", self._live(), handle.id, max(deadline - time.monotonic(), 0.0))
            handle.done = True
        except ShardPSError as e:
            # shardps_wait releases the handle whatever it returns, but for a refusal.
            handle.done = not _refused(e, handle)
            if not isinstance(e, DeadlineExceededError):
                raise
            total = self._timeout(timeout)
            if total <= _SLICE:
                raise
            raise DeadlineExceededError(e.code, e.status, "%s (of a wait of %gs)" % (e.message, total),
                                        e.call) from None

    def _answered(self, handle, timeout):
        """Waits up to `timeout` for `handle`: True once its request completed (it is then
        released; a failed one raises its error), False if still outstanding."""
        ids = (ctypes.c_uint64 * 1)(handle.id)
        index = ctypes.c_size_t(1)
        code, err = self._raw("shardps_wait_any", self._live(), ids, 1, timeout, ctypes.byref(index))
        if index.value != 0 and self._status(code) == "DEADLINE_EXCEEDED":
            return False
        if index.value == 0:
            handle.done = True
        check(self._lib, code, err, "shardps_wait_any")
        return True

    def wait_any(self, handles, timeout=None):
        """Waits until one of `handles` completes and returns it (then done, as after wait());
        the others stay outstanding. One thread can so complete many requests in the order
        they finish (completions() does so without handing the others over again each time).
        If that request failed, its ShardPSError is raised with `handle` set to it. If none
        completes within `timeout` seconds (0: only poll), DeadlineExceededError is raised
        with `handle` None, and every handle stays outstanding."""
        return self.completions(handles).wait_any(timeout)

    def completions(self, handles):
        """The outstanding `handles` as a Completions, whose wait_any() completes them one at
        a time in the order they finish. ValueError if one was already waited on."""
        return Completions(self, handles)

    def _check_outstanding(self, handle):
        if not isinstance(handle, Handle) or handle._worker is not self:
            raise ValueError("%r is not a Handle of this worker" % (handle,))
        if handle.done:
            raise ValueError("%s was already waited on" % handle.what)

    def _retire(self, handle, released):
        """`handle`'s wait is over. Once the library released it (a wait of it returned, whatever
        it returned, a timeout included) it reads and writes the buffers no more, so they go; a
        wait cut short before that (Ctrl-C) leaves them to the worker's lifetime."""
        if not released:
            self._orphans.append(handle._keep)
        handle.done = True
        handle._keep = None

    def poll(self, handle):
        """True once `handle` has completed (it is then done, as after wait(); a failed
        request raises its error), False while it is outstanding. Never blocks. Pipelined
        training polls every step, so "not yet" builds no exception."""
        self._check_outstanding(handle)
        try:
            if not self._answered(handle, 0.0):
                return False
        except ShardPSError as e:
            if handle.done:  # the request's own error
                self._retire(handle, released=True)
                e.handle = handle
            raise
        self._retire(handle, released=True)
        return True

    def _timeout(self, timeout):
        return self.timeout if timeout is None else float(timeout)
