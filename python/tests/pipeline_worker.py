"""A worker of test_torch_pipeline. Two parameters starting at 0: w (1000 float32 weights,
zero-copy) and b (7 float64 ones, which go through float32 copies). Step t's loss is (t + 1)
times the sum of all weights, so every gradient is t + 1 everywhere, and with SGD at learning
rate 0.5 on the servers a weight that includes this worker's first k pushes is -0.25 k (k + 1):
each step shows how many pushes the weights it computes with include, and a gradient sent from
the wrong buffer would show as a value that is no such number. Step 10 calls synchronize()
between backward and step(). Prints "pipeline: D", then "included: K0 K1 ..." (w's and b's
count for each step, "w/b"; step t has t pushes before it), "changed between steps: N" (times a
parameter changed outside step() while an answer arrived), and "final: W B outstanding: ..."
after synchronize().

With argument "request=N" the optimizer is created with pipeline=N and a refusal is printed as
"refused: MESSAGE". With argument "held" (ssp, staleness 1, two workers): rank 1 takes one step
and stops, so rank 0's pushes are held by the bound from its round 2 on; its pipelined step()
must raise DeadlineExceededError within the optimizer's timeout (printed as "held: STATUS
MESSAGE at step S"), then both meet at a barrier."""

import math
import sys
import time

import torch

import shardps
import shardps.torch

torch.set_num_threads(1)
worker = shardps.init()
w = torch.nn.Parameter(torch.zeros(1000))
b = torch.nn.Parameter(torch.zeros(7, dtype=torch.float64))
named = [("w", w), ("b", b)]
options = dict((arg.split("=", 1) + [""])[:2] for arg in sys.argv[1:])
try:
    optimizer = shardps.torch.DistributedOptimizer(
        torch.optim.SGD([w, b], lr=0.5), named_parameters=named,
        pipeline=int(options["request"]) if "request" in options else None)
except ValueError as e:
    print("refused: %s" % e, flush=True)
    sys.exit(0)
shardps.torch.broadcast_parameters(named)
print("pipeline: %d" % optimizer.pipeline, flush=True)


def backward(step):
    optimizer.zero_grad()
    ((step + 1) * (w.sum() + b.sum())).backward()


def pushes_in(p):
    """k such that every weight of p is -0.25 k (k + 1)."""
    value = float(p[0])
    assert torch.equal(p.detach(), torch.full_like(p.detach(), value)), "one value for all weights of %s" % p.shape
    k = round((math.sqrt(1 - 16 * value) - 1) / 2)
    assert -0.25 * k * (k + 1) == value, "%g is no sum of this worker's gradients" % value
    return k


if "held" in options:
    optimizer.timeout = 0.5
    if worker.rank == 1:
        backward(0)
        optimizer.step()
        optimizer.synchronize()  # its round 0 is applied before rank 0 starts
    worker.barrier("pushed", timeout=60)
    if worker.rank == 0:
        for step in range(10):
            backward(step)
            try:
                optimizer.step()
            except shardps.DeadlineExceededError as e:
                print("held: %s %s at step %d" % (e.status, e.message, step), flush=True)
                break
    worker.barrier("end", timeout=60)
    sys.exit(0)

included, changed = [], 0
for step in range(20):
    included.append("%d/%d" % (pushes_in(w), pushes_in(b)))
    backward(step)
    if step == 10:
        optimizer.synchronize()
    before = [p.detach().clone() for _, p in named]
    optimizer.step()
    after = [p.detach().clone() for _, p in named]
    time.sleep(0.02)  # the answers in flight arrive meanwhile
    changed += any(not torch.equal(a, p.detach()) for a, (_, p) in zip(after, named))
    if step == 10:
        assert all(torch.equal(x, y) for x, y in zip(before, after)) or optimizer.pipeline == 0, \
            "synchronize() landed everything; step() had nothing left to land"
optimizer.synchronize()
print("included: %s" % " ".join(included))
print("changed between steps: %d" % changed)
print("final: %g %g outstanding: %s" % (float(w[0]), float(b[0]), " ".join(optimizer.outstanding)), flush=True)
