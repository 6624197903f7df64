"""A worker of test_worker_errors: each misuse must raise the named exception. Prints
"ok: <case>" per case; exits 1 on the first surprise. Uses the standard library only."""

import array
import sys

import shardps


def expect(case, exception, fn, check=lambda e: True):
    try:
        fn()
    except exception as e:
        if not check(e):
            print("FAIL %s: %r" % (case, e))
            sys.exit(1)
        print("ok: %s: %s" % (case, e))
        return
    except Exception as e:
        print("FAIL %s: raised %r, expected %s" % (case, e, exception.__name__))
        sys.exit(1)
    print("FAIL %s: nothing raised, expected %s" % (case, exception.__name__))
    sys.exit(1)


worker = shardps.init()
worker.define([("w", [2, 3]), ("lonely", [4])])
if worker.rank == 0:
    worker.init_tensor("w", array.array("f", [0.0] * 6))
    worker.init_tensor("lonely", array.array("f", [0.0] * 4))
worker.barrier("init")

out = array.array("f", [0.0] * 6)
expect("dtype", TypeError, lambda: worker.push("w", array.array("d", [0.0] * 6)))
expect("shape", ValueError, lambda: worker.push_pull("w", array.array("f", [0.0] * 5), out))
expect("name", KeyError, lambda: worker.pull("nope", out))
if worker.rank == 0:
    # Only rank 0 pushes: the sync round cannot complete, so the wait times out.
    handle = worker.push_pull("lonely", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4))
    expect("timeout", shardps.DeadlineExceededError, lambda: handle.wait(timeout=0.5),
           lambda e: e.status == "DEADLINE_EXCEEDED" and "lonely" in e.message)
    expect("second wait", ValueError, lambda: handle.wait())
worker.barrier("done")
print("ok: all")
