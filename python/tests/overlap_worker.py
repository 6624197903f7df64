"""A worker of test_torch_overlap: checks when gradients leave during backward. A hook on
the gradient flowing into the first layer's output runs before that layer's parameters get
their gradients; by then the later layers' push-pulls must already be on the wire, unless the
first layer has the higher push priority (argument "prioritise-first"), which holds them back.
Prints "requests during backward: N of M". Then checks that with the model given, step()
leaves the requests outstanding and forward completes them layer by layer: prints
"outstanding after step: ..." and "outstanding after the first layer: ..."."""

import sys

import torch
from torch import nn

import shardps
import shardps.torch

torch.set_num_threads(1)
worker = shardps.init()
torch.manual_seed(1)
first, rest = nn.Linear(20, 32), nn.Sequential(nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))
model = nn.Sequential(first, rest)
named = [("first." + n, p) for n, p in first.named_parameters()] + \
        [("rest." + n, p) for n, p in rest.named_parameters()]
priorities = {"first.weight": 1, "first.bias": 1} if "prioritise-first" in sys.argv else None
optimizer = shardps.torch.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named_parameters=named,
                                               priorities=priorities, model=model)
shardps.torch.broadcast_parameters(named)

seen = []
before = worker.stats()["requests"]
hidden = first(torch.randn(8, 20))
hidden.register_hook(lambda grad: seen.append(worker.stats()["requests"] - before))
nn.functional.cross_entropy(rest(hidden), torch.randint(0, 3, (8,))).backward()
optimizer.step()
later = sum(len(worker.partitions(n)) for n, _ in named if n.startswith("rest."))
print("requests during backward: %d of %d" % (seen[0], later))
print("outstanding after step: %s" % " ".join(optimizer.outstanding))
hidden = first(torch.randn(8, 20))
print("outstanding after the first layer: %s" % " ".join(optimizer.outstanding))
rest(hidden)
print("outstanding after forward: %s" % " ".join(optimizer.outstanding))
