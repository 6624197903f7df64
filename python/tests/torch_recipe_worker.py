"""A worker of test_torch_misuse: a DistributedOptimizer on a cluster whose config the
arguments (--set) made. Prints "refused: <message>" or "accepted"."""

import torch

import shardps
import shardps.torch

shardps.init()
model = torch.nn.Linear(4, 2)
try:
    shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
    print("accepted", flush=True)
except ValueError as e:
    print("refused: %s" % e, flush=True)
