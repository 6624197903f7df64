"""A worker of test_torch_sync: trains torch_job's model through DistributedOptimizer and
saves its final weights to OUT_DIR/rank<R>.pt.
Usage: torch_worker.py KIND LR OUT_DIR [DTYPE [DEVICE [OPTIONS]]]
DTYPE float64 trains a float64 model (its tensors travel through float32 staging copies),
float16 and bfloat16 a 16-bit one (zero-copy: the library converts); DEVICE cuda trains on the
GPU, its float32 tensors going through shardps_push_pull_cuda. OPTIONS is JSON:
{"compression": {name: codec}} is DistributedOptimizer's; {"model": true} passes the model, so
the next forward waits for the weights instead of step(). Prints the tensors' defined dtypes
and the bytes pushed."""

import json
import os
import sys

import torch
from torch import nn

import shardps
import shardps.torch
import torch_job

kind, lr, out_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
dtype = getattr(torch, sys.argv[4]) if len(sys.argv) > 4 else torch.float32
device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
options = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
torch.set_num_threads(1)
worker = shardps.init()
model = torch_job.make_model(seed=worker.rank + 1, dtype=dtype).to(device)  # rank 0's weights win
compute = torch.float32 if dtype == torch.float16 else dtype  # StoredLinear computes in float32
optimizer = shardps.torch.DistributedOptimizer(torch_job.torch_optimizer(kind, model.parameters(), lr),
                                               named_parameters=model.named_parameters(),
                                               compression=options.get("compression"),
                                               model=model if options.get("model") else None)
shardps.torch.broadcast_parameters(model.named_parameters(), root_rank=0)
for step in range(torch_job.STEPS):
    x, y = torch_job.batch(step, worker.rank)
    x, y = x.to(device=device, dtype=compute), y.to(device)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x).float(), y).backward()
    optimizer.step()
optimizer.synchronize()
print("defined dtypes: %s" % sorted(set(worker.dtypes.values())))
print("bytes pushed: %d" % worker.stats()["bytes_pushed"])
torch.save({n: p.detach().cpu() for n, p in model.named_parameters()}, os.path.join(out_dir, "rank%d.pt" % worker.rank))
