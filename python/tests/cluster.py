"""Runs `shardps launch` for the Python tests: the binary from $SHARDPS_BINARY (ctest sets it)
or the build tree of this checkout; workers run with the interpreter running the tests."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))  # the package of this checkout


def shardps_binary():
    return os.environ.get("SHARDPS_BINARY") or os.path.join(REPO, "build", "tools", "shardps")


def worker_environment():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(REPO, "python"), env.get("PYTHONPATH")]))
    return env


def launch_argv(servers, workers, command, sets=()):
    """The command line of `shardps launch` running `command` as the workers."""
    argv = [shardps_binary(), "launch", "--servers", str(servers), "--workers", str(workers)]
    for s in sets:
        argv += ["--set", s]
    return argv + ["--"] + list(command)


def launch(servers, workers, command, sets=(), timeout=120):
    """Runs the launcher to completion; returns the CompletedProcess (text output)."""
    argv = launch_argv(servers, workers, command, sets)
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=timeout, env=worker_environment())


def python_worker(script, *args):
    """A command line running `script` (in this folder) with this interpreter."""
    return [sys.executable, os.path.join(HERE, script)] + [str(a) for a in args]


def has_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False
