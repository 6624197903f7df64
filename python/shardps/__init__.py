"""ShardPS from Python: a worker of a ShardPS parameter-server cluster.

    import shardps
    shardps.init()                 # scheduler and rank from the launcher's environment
    shardps.rank(), shardps.size(), shardps.local_rank()

`shardps launch --servers S --workers W -- python3 job.py` starts a cluster and the job.
PyTorch jobs use shardps.torch.DistributedOptimizer. The Worker class is the whole C ABI
for jobs that manage tensors themselves.
"""

import os
import sys

from . import environment
from ._library import LibraryNotFoundError
from .errors import (DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     ShardPSError, UnavailableError, UnimplementedError)
from .worker import Handle, Worker, describe_exception, ends_cleanly

__all__ = ["init", "shutdown", "is_initialized", "worker", "rank", "size", "local_rank", "version",
           "Worker", "Handle", "ShardPSError", "InvalidArgumentError", "DeadlineExceededError",
           "NotFoundError", "UnavailableError", "FailedPreconditionError", "UnimplementedError",
           "LibraryNotFoundError"]

_worker = None


def init(scheduler=None, rank=None, rendezvous_timeout=None, timeout=60.0, security_config=None):
    """Joins the job as a worker and returns the Worker. The scheduler address and rank
    come from the arguments, else from the environment (see shardps.environment); so does
    the security config file of a secured cluster (SHARDPS_SECURITY_CONFIG). Returns
    once every server and worker has registered. Once per process."""
    global _worker
    if _worker is not None and _worker._pid != os.getpid():
        raise RuntimeError("shardps.init() was called in process %d, which forked this one; call "
                           "shardps.shutdown() here first (it forgets the parent's worker)" % _worker._pid)
    if _worker is not None:
        raise RuntimeError("shardps.init() was already called in this process")
    address, _ = environment.scheduler_address(scheduler)
    worker_rank, _ = environment.worker_rank(rank)
    rendezvous_timeout = environment.rendezvous_timeout(rendezvous_timeout)
    if security_config is None:
        security_config = os.environ.get("SHARDPS_SECURITY_CONFIG") or None
    _worker = Worker(address, worker_rank, rendezvous_timeout=rendezvous_timeout, timeout=timeout,
                     security_config=security_config)
    _report_uncaught_exceptions()
    return _worker


def _report_uncaught_exceptions():
    """An uncaught exception ends the script: the worker leaves saying so, and the scheduler lists
    it as failed with the exception (its log, `shardps status`) rather than as left."""
    previous = sys.excepthook
    if getattr(previous, "_shardps", False):
        return

    def hook(exc_type, exc, tb):
        if _worker is not None:
            try:
                _worker.close(error=None if ends_cleanly(exc_type, exc) else describe_exception(exc_type, exc, tb))
            except Exception:  # the exception being reported matters more
                pass
        previous(exc_type, exc, tb)

    hook._shardps = True
    sys.excepthook = hook


def shutdown():
    """Leaves the job; init() may be called again."""
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


def is_initialized():
    return _worker is not None


def worker():
    """The Worker made by init()."""
    if _worker is None:
        raise RuntimeError("call shardps.init() first")
    return _worker


def rank():
    return worker().rank


def size():
    """The number of workers in the job."""
    return worker().size


def local_rank():
    """This worker's index on its machine, from the launcher's environment (0 if unset)."""
    return environment.local_rank()


def version():
    """The version of the loaded libshardps."""
    from . import _library
    return _library.load().shardps_version().decode()
