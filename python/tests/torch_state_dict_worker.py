"""A worker of test_torch_misuse: a model with a scalar parameter and BatchNorm (buffers, a
0-dim int64 num_batches_tracked), made differently on each rank, broadcast as a state_dict
before the DistributedOptimizer, then trained in sync; then a parameter changes shape. Prints
"ok: <case>: <bool>"."""

import torch

import shardps
import shardps.torch

torch.set_num_threads(1)
shardps.init()
torch.manual_seed(shardps.rank())
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
model.scale = torch.nn.Parameter(torch.tensor(1.0 + shardps.rank()))
model[1].num_batches_tracked.fill_(7 + shardps.rank())
shardps.torch.broadcast_parameters(model.state_dict(), root_rank=0)
print("ok: buffers broadcast: %s" % (model[1].num_batches_tracked.item() == 7))
print("ok: scalar broadcast: %s" % (model.scale.item() == 1.0))
optimizer = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
for _ in range(3):
    optimizer.zero_grad()
    (model.scale * model(torch.ones(2, 4) * (1 + shardps.rank()))).square().sum().backward()
    optimizer.step()
print("scale %.6f weight %.6f" % (model.scale.item(), model[0].weight.sum().item()), flush=True)
model[0].bias.data = model[0].bias.data[:2].clone()
try:
    optimizer.zero_grad()
    print("ok: a changed shape is refused: False")
except ValueError as e:
    print("ok: a changed shape is refused: %s" % ("'0.bias' has shape (2,); it was defined on the cluster with (3,)"
                                                 in str(e)))
