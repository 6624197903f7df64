"""A worker of test_torch_pipeline. One parameter of 1000 weights, starting at 0, whose loss
is their sum: every gradient is all ones, so with SGD at learning rate 0.5 on the servers the
weights after k applied pushes are -0.5 k, and each step shows how many of this worker's
pushes the weights it computes with include. Prints "pipeline: D", then "included: K0 K1
..." (step t has t pushes before it), "changed between steps: N" (times the parameter changed
outside step() while an answer arrived), and "final: F outstanding: ..." after
synchronize(). With argument "request=N" the optimizer is created with pipeline=N and a
refusal is printed as "refused: MESSAGE". With argument "held" (ssp, staleness 1, two
workers): rank 1 takes one step and stops, so rank 0's pushes are soon held by the bound; its
pipelined step() must raise DeadlineExceededError within the optimizer's timeout (printed as
"held: STATUS MESSAGE" with the step), then both meet at a barrier."""

import sys
import time

import torch

import shardps
import shardps.torch

torch.set_num_threads(1)
worker = shardps.init()
w = torch.nn.Parameter(torch.zeros(1000))
options = dict((arg.split("=", 1) + [""])[:2] for arg in sys.argv[1:])
try:
    optimizer = shardps.torch.DistributedOptimizer(
        torch.optim.SGD([w], lr=0.5), named_parameters=[("w", w)],
        pipeline=int(options["request"]) if "request" in options else None)
except ValueError as e:
    print("refused: %s" % e, flush=True)
    sys.exit(0)
shardps.torch.broadcast_parameters([("w", w)])
print("pipeline: %d" % optimizer.pipeline, flush=True)

if "held" in options:
    optimizer.timeout = 0.5
    for step in range(1 if worker.rank == 1 else 10):
        optimizer.zero_grad()
        w.sum().backward()
        try:
            optimizer.step()
        except shardps.DeadlineExceededError as e:
            print("held: %s %s at step %d" % (e.status, e.message, step), flush=True)
            break
    if worker.rank == 1:
        optimizer.synchronize()
    worker.barrier("end", timeout=60)
    sys.exit(0)

included, changed = [], 0
for step in range(20):
    before = w.detach().clone()
    included.append(round(-float(before[0]) / 0.5))
    assert torch.equal(before, torch.full_like(before, before[0])), "one value for all weights"
    optimizer.zero_grad()
    w.sum().backward()
    optimizer.step()
    after = w.detach().clone()
    time.sleep(0.02)  # the answers in flight arrive meanwhile
    changed += not torch.equal(after, w.detach())
optimizer.synchronize()
print("included: %s" % " ".join(str(k) for k in included))
print("changed between steps: %d" % changed)
print("final: %g outstanding: %s" % (float(w[0]), " ".join(optimizer.outstanding)), flush=True)
