"""A worker of test_torch_rejoin: torch_job's model, SGD on the servers, sync.
Usage: torch_rejoin_worker.py OUT_DIR [first|again] [frozen]
Rank 0 trains STEPS steps, and after PAUSE_AT waits until rank 1 has registered again. Rank 1
runs this script twice in a row: the first process trains a few steps and is SIGKILLed; the
second registers again once the rank is declared dead, starts from its own fresh weights,
calls broadcast_parameters like any worker (twice, the first layer and the rest, as a script
with two models would: the job passed both barriers before it came back) and trains the steps
the job has left. Each saves its final weights to OUT_DIR/rank<R>.pt, the second also what
broadcast_parameters gave it. With `frozen`, the last layer is frozen from the start until step
FROZEN_UNTIL, past the rejoin: its partitions keep pace with the rounds (skip_round), so the
rejoined process's pull and pushes of it, numbered from its join round, are the job's."""

import os
import signal
import subprocess
import sys
import time

import torch
from torch import nn

import shardps
import shardps.torch
import torch_job

STEPS = 1000
PAUSE_AT = 30  # rank 0 waits here for rank 1's second process
KILL_AT = 10   # rank 1's first process dies here
FROZEN_UNTIL = 60

out_dir = sys.argv[1]
phase = sys.argv[2] if len(sys.argv) > 2 else "first"
frozen = sys.argv[3:] == ["frozen"]
torch.set_num_threads(1)
rejoined_file = os.path.join(out_dir, "rejoined")

if phase == "first" and os.environ.get("SHARDPS_RANK") == "1":
    first = subprocess.run([sys.executable, __file__, out_dir, "killed"] + sys.argv[3:])
    print("first process of rank 1 ended with %d" % first.returncode, flush=True)
    os.execv(sys.executable, [sys.executable, __file__, out_dir, "again"] + sys.argv[3:])


def register_again():
    """The dead process's rank is refused until the scheduler declares it dead."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return shardps.init()
        except shardps.ShardPSError as e:
            if e.status != "ALREADY_EXISTS" or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


worker = register_again() if phase == "again" else shardps.init()
if phase == "again":
    print("registered again at round %d" % worker.rejoin_round, flush=True)
    open(rejoined_file, "w").close()
model = torch_job.make_model(seed=worker.rank + (10 if phase == "again" else 1))
if frozen:
    model[4].requires_grad_(worker.rejoin_round >= FROZEN_UNTIL)
fresh = {n: p.detach().clone() for n, p in model.named_parameters()}
optimizer = shardps.torch.DistributedOptimizer(torch_job.torch_optimizer("SGD", model.parameters(), 0.1),
                                               named_parameters=model.named_parameters())
named = list(model.named_parameters())
shardps.torch.broadcast_parameters(named[:2], root_rank=0)
shardps.torch.broadcast_parameters(named[2:], root_rank=0)
if phase == "again":
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.path.join(out_dir, "pulled.pt"))
    torch.save(fresh, os.path.join(out_dir, "fresh.pt"))
for step in range(worker.rejoin_round, STEPS):
    if phase == "killed" and step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if worker.rank == 0 and step == PAUSE_AT:
        while not os.path.exists(rejoined_file):
            time.sleep(0.05)
    if frozen and step == FROZEN_UNTIL:
        model[4].requires_grad_(True)
    x, y = torch_job.batch(step % torch_job.STEPS, worker.rank)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
optimizer.synchronize()
torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.path.join(out_dir, "rank%d.pt" % worker.rank))
