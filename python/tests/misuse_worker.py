"""A worker of test_misuse (two workers, sync): a careless caller's mistakes must raise a
clear Python exception, never crash, hang or corrupt memory. Prints "ok: <case>" per case;
exits 1 on the first surprise."""

import gc
import os
import signal
import threading
import weakref

import numpy

import shardps
from expect import expect


def zeros(n=4):
    return numpy.zeros(n, dtype=numpy.float32)


worker = shardps.init()
expect("negative rank", ValueError, lambda: shardps.Worker("127.0.0.1:1", -1, rendezvous_timeout=1))
# (name, shape, dtype) without a codec: the cluster config's codec, not one named "float32".
worker.define([("w", [4]), ("h", [4], "float16"), ("lonely", [4]), ("dropped", [4])])
print("ok: dtype without codec: %s" % (worker.dtypes["h"] == "float16"))
# A NUL would cut the name short in C: barrier "a" instead of "a\0b".
expect("NUL in a name", ValueError, lambda: worker.barrier("a\0b", timeout=1), lambda e: "NUL" in str(e))
expect("not a handle", ValueError, lambda: worker.wait(42), lambda e: "not a Handle of this worker" in str(e))
expect("list as a buffer", TypeError, lambda: worker.push("w", [0.0] * 4), lambda e: "gradient of 'w'" in str(e))

if worker.rank == 0:
    # Only rank 0 pushes "dropped": its request stays outstanding while the handle is
    # collected; the buffers must outlive it (an answer or a resend would touch them).
    grad, out = zeros(), zeros()
    alive = (weakref.ref(grad), weakref.ref(out))
    worker.push_pull("dropped", grad, out)
    del grad, out
    gc.collect()
    print("ok: a dropped handle keeps its buffers: %s" % all(r() is not None for r in alive))

    # Ctrl-C while blocked in a wait that would last ten minutes: KeyboardInterrupt now.
    pending = worker.push_pull("lonely", zeros(), zeros())
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    expect("interrupted wait", KeyboardInterrupt, lambda: pending.wait(timeout=600))
    expect("interrupted handle is done", ValueError, lambda: pending.wait())
    late = worker.push_pull("lonely", zeros(), zeros())
    expect("timeout names the whole wait", shardps.DeadlineExceededError, lambda: late.wait(timeout=0.6),
           lambda e: "'lonely'" in e.message and "of a wait of 0.6s" in e.message)

    # A forked child cannot use its parent's worker: it says so, and exits cleanly.
    child = os.fork()
    if child == 0:
        try:
            worker.push("w", zeros())
            print("FAIL fork: the child pushed")
            os._exit(1)
        except RuntimeError as e:
            print("ok: forked child: %s" % e, flush=True)
        expect("init in a forked child", RuntimeError, shardps.init, lambda e: "forked this one" in str(e))
        shardps.shutdown()  # forgets the parent's worker, leaves it running
        os._exit(0)
    _, status = os.waitpid(child, 0)
    print("ok: forked child exits cleanly: %s" % (status == 0))
    handle = worker.push_pull("w", zeros(), zeros())
print("ok: parent goes on")
if worker.rank == 1:
    handle = worker.push_pull("w", zeros(), zeros())
handle.wait(30)
worker.barrier("done")
print("ok: all")
