"""A worker of test_worker_errors: each misuse must raise the named exception. Prints
"ok: <case>" per case; exits 1 on the first surprise. Uses the standard library (and numpy for
a float16 buffer where it is installed)."""

import array
import threading
import time
import weakref

import shardps
from expect import expect


worker = shardps.init()
expect("unknown codec", shardps.InvalidArgumentError,
       lambda: worker.define([("w", [2, 3], "float32", "zip"), ("lonely", [4])]),
       lambda e: "tensor 'w' declares codec 'zip'" in e.message and "zip" in e.message)
expect("unknown dtype", ValueError, lambda: worker.define([("w", [2, 3], "int8")]))
worker.define([("w", [2, 3]), ("lonely", [4]), ("shared", [4])])  # a refused definition can be made again
if worker.rank == 0:
    worker.init_tensor("w", array.array("f", [0.0] * 6))
    worker.init_tensor("lonely", array.array("f", [0.0] * 4))
    worker.init_tensor("shared", array.array("f", [0.0] * 4))
worker.barrier("init")

out = array.array("f", [0.0] * 6)
expect("dtype", TypeError, lambda: worker.push("w", array.array("d", [0.0] * 6)))
expect("shape", ValueError, lambda: worker.push_pull("w", array.array("f", [0.0] * 5), out))
expect("name", KeyError, lambda: worker.pull("nope", out))
# Buffers that agree with each other but not with the declaration: refused by the library.
try:
    import numpy  # the standard library has no float16 buffer
except ImportError:
    print("ok: 16-bit dtype (not checked: no numpy)")
else:
    halves = numpy.zeros(6, dtype=numpy.float16)
    expect("16-bit dtype", shardps.InvalidArgumentError, lambda: worker.push_pull("w", halves, halves),
           lambda e: e.status == "INVALID_ARGUMENT" and "declared float32; the buffers are float16" in e.message)
five = array.array("f", [0.0] * 5)
expect("size", shardps.InvalidArgumentError, lambda: worker.push_pull("w", five, array.array("f", [0.0] * 5)),
       lambda e: e.status == "INVALID_ARGUMENT" and "the buffers hold 20 bytes" in e.message)
if worker.rank == 0:
    # Only rank 0 pushes: the sync round cannot complete, so the wait times out.
    grad, weights = array.array("f", [1.0] * 4), array.array("f", [0.0] * 4)
    buffers = [weakref.ref(grad), weakref.ref(weights)]
    handle = worker.push_pull("lonely", grad, weights)
    del grad, weights
    expect("timeout", shardps.DeadlineExceededError, lambda: handle.wait(timeout=0.5),
           lambda e: e.status == "DEADLINE_EXCEEDED" and "lonely" in e.message)
    # The library reads and writes them no more: they are not kept for the worker's lifetime.
    print("ok: a timed-out request's buffers go: %s" % all(b() is None for b in buffers))
    expect("second wait", ValueError, lambda: handle.wait())
    # wait_any: nothing done in time leaves the handle outstanding; poll() does not block.
    pending = worker.push_pull("lonely", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4))
    expect("wait_any timeout", shardps.DeadlineExceededError, lambda: worker.wait_any([pending], timeout=0.2),
           lambda e: e.handle is None and not pending.done)
    print("ok: poll outstanding: %s" % (worker.poll(pending) is False))
    # Two threads wait on one handle: the library refuses the second (ABORTED) and leaves the
    # handle to the first. The refused wait took it for done (review22): its buffers went while
    # the request was out, and the first wait, finding it done, returned as if answered.
    shared = worker.push_pull("shared", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4))
    first = []

    def first_wait():
        try:
            shared.wait(timeout=1.5)
            first.append("returned")
        except shardps.DeadlineExceededError:
            first.append("timed out")

    waiter = threading.Thread(target=first_wait)
    waiter.start()
    time.sleep(0.3)
    expect("a second waiter is refused", shardps.ShardPSError, lambda: shared.wait(timeout=0.1),
           lambda e: e.status == "ABORTED")
    print("ok: a refused wait leaves the handle outstanding: %s" % (not shared.done and shared._keep is not None))
    waiter.join()
    print("ok: the first wait says how it ended: %s" % first)
worker.barrier("lonely pushed")
if worker.rank == 1:
    worker.wait(worker.push_pull("shared", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4)))
    worker.wait(worker.push_pull("lonely", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4)))
    worker.wait(worker.push_pull("lonely", array.array("f", [1.0] * 4), array.array("f", [0.0] * 4)))
if worker.rank == 0:
    print("ok: wait_any completes: %s" % (worker.wait_any([pending], timeout=10) is pending and pending.done))
    expect("wait_any again", ValueError, lambda: worker.wait_any([pending]))
# completions(): requests completed one at a time in the order they finish, each leaving the set.
handles = [worker.push_pull(name, array.array("f", [1.0] * n), array.array("f", [0.0] * n))
           for name, n in (("w", 6), ("lonely", 4))]
completions = worker.completions(handles)
done = [completions.wait_any(10), completions.wait_any(10)]
print("ok: completions: %s" % (sorted(map(id, done)) == sorted(map(id, handles)) and len(completions) == 0
                               and all(h.done for h in handles)))
worker.barrier("done")
print("ok: all")
