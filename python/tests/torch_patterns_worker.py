"""A worker of test_torch_patterns: one pattern of real training scripts (CASE), on torch_job's
model and batches in a sync cluster. Prints "ok: <case>: <bool>" or "refused: <message>";
rank 0 saves its final weights to OUT_DIR/rank0.pt where a case compares with one process.
Usage: torch_patterns_worker.py CASE OUT_DIR
  frozen    a layer frozen (requires_grad_(False)) after step 2 and unfrozen after step 5, and
            one frozen from the start and unfrozen after step 5 (servers' Adam)
  frozen-model  the same with model= (steps return at once; the next forward lands them)
  frozen-async  the same in an async cluster, checking what async keeps (it pipelines: the
            answers of the pushes before the freeze land in the steps after it)
  clip      clip_grad_norm_ between backward() and step()
  clip-sync synchronize(), then clip_grad_norm_ on the averaged gradient, then step() (sum_only)
  schedule  a StepLR scheduler over the DistributedOptimizer
  shapes    an empty parameter and a 0-dim one beside the model
  two       two models with their own optimizers: same names, then the second's prefixed
            but not defined first
  two-prefixed  both prefixed and defined first by one broadcast_parameters()
  again     a second backward() before step(): without backward_passes_per_step, and after
            zero_grad() (a GAN's discriminator during the generator's step)
  raised    an exception inside backward() at step 2, caught; then step() and training go on
  groups    add_param_group() with a named parameter, then with one that is not (sum_only);
            on the servers' optimizer, groups of different learning rates
  parameter-list  with model=: parameters in an nn.ParameterList that the parent's forward uses,
            then a Linear's weight used by its parent without calling the Linear
  sparse    an nn.EmbeddingBag with sparse gradients
  clamp     weights clipped in place after each step() (a WGAN's critic)
  hook-order  with model=: a forward pre-hook of the model's own (weight_norm's kind) sees the
            new weights landed
  model-zero  with model=: model.zero_grad() (in place on torch < 2) instead of the optimizer's
  resume-1  Adam, then rank 0 saves model and optimizer state_dicts to OUT_DIR/checkpoint.pt
  resume-2  every rank loads it (load_state_dict, broadcast_optimizer_state) and trains on"""

import os
import sys
import warnings

import torch
from torch import nn

import shardps
import shardps.torch
import torch_job
from torch_patterns_job import ListNet, sparse_batch, wide_model

case, out_dir = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
worker = shardps.init()
STEPS = 8


def ok(what, value):
    print("ok: %s: %s" % (what, bool(value)), flush=True)


def refused(fn):
    try:
        fn()
    except (RuntimeError, ValueError, KeyError) as e:
        print("refused: %s" % (e.args[0] if e.args else e), flush=True)
        return True
    return False


def loss_of(model, step):
    x, y = torch_job.batch(step, worker.rank)
    return nn.functional.cross_entropy(model(x), y)


def distributed(net, optimizer, **options):
    optimizer = shardps.torch.DistributedOptimizer(optimizer, named_parameters=net.named_parameters(), **options)
    shardps.torch.broadcast_parameters(net.named_parameters())
    return optimizer


def train_with_forward_waits(net, zero):
    """With model=net: STEPS steps, each starting with zero(optimizer); rank 0 saves the
    synchronized weights. Returns the optimizer."""
    optimizer = distributed(net, torch.optim.SGD(net.parameters(), lr=0.1), model=net)
    for step in range(STEPS):
        zero(optimizer)
        loss_of(net, step).backward()
        optimizer.step()
    optimizer.synchronize()
    save(net)
    return optimizer


def save(model):
    if worker.rank == 0:
        torch.save({n: t.detach().clone() for n, t in model.state_dict().items()}, os.path.join(out_dir, "rank0.pt"))


model = torch_job.make_model(seed=worker.rank + 1)
if case in ("frozen", "frozen-model", "frozen-async"):
    model[4].requires_grad_(False)
    optimizer = distributed(model, torch.optim.Adam(model.parameters(), lr=0.01),
                            **({"model": model} if case == "frozen-model" else {}))
    history = []
    for step in range(STEPS):
        if step == 3:
            model[0].requires_grad_(False)
        if step == 6:
            model[0].requires_grad_(True)
            model[4].requires_grad_(True)
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, step).backward()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer.step()
        for warning in caught:
            print("warned: %s" % warning.message, flush=True)
    history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    ok("frozen from the start, unchanged until unfrozen",
       all(torch.equal(history[0]["4.weight"], h["4.weight"]) for h in history[:7]))
    ok("both trained once unfrozen", not torch.equal(history[6]["4.weight"], history[8]["4.weight"])
       and not torch.equal(history[6]["0.weight"], history[8]["0.weight"]))
    # Weights that land at once: async pipelines, and with model= the next forward lands them.
    if case == "frozen":
        ok("frozen at step 3, unchanged until unfrozen",
           all(torch.equal(history[3]["0.weight"], h["0.weight"]) for h in history[3:7]))
        ok("the others trained throughout", all(not torch.equal(a["2.weight"], b["2.weight"])
                                                for a, b in zip(history, history[1:])))
    optimizer.synchronize()
    save(model)
elif case in ("clamp", "clip", "clip-sync", "schedule"):
    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1))
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.1) if case == "schedule" else None
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, step).backward()
        if case == "clip-sync":
            optimizer.synchronize()
        if case.startswith("clip"):
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if refused(optimizer.step):
            print("at step %d" % step, flush=True)
            break
        if schedule:
            schedule.step()
        if case == "clamp":
            with torch.no_grad():
                for p in model.parameters():
                    p.clamp_(-0.1, 0.1)
    save(model)
elif case == "shapes":
    model.scale = nn.Parameter(torch.tensor(1.0))
    model.nothing = nn.Parameter(torch.zeros(3, 0))
    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ok("the empty parameter is not defined", sorted(worker.tensors) == sorted(n for n, p in model.named_parameters()
                                                                           if p.numel()))
    for step in range(STEPS):
        optimizer.zero_grad()
        (loss_of(model, step) * model.scale + model.nothing.sum()).backward()
        optimizer.step()
    ok("the scalar trained", model.scale.item() != 1.0)
elif case == "two":
    critic = torch_job.make_model(seed=worker.rank + 10)
    first = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
    refused(lambda: shardps.torch.DistributedOptimizer(torch.optim.SGD(critic.parameters(), lr=0.1),
                                                       named_parameters=critic.named_parameters()))
    refused(lambda: shardps.torch.broadcast_parameters(list(model.named_parameters())
                                                       + list(critic.named_parameters())))
    refused(lambda: shardps.torch.DistributedOptimizer(torch.optim.SGD(critic.parameters(), lr=0.1),
                                                       named_parameters=critic.named_parameters("d")))
elif case == "two-prefixed":
    critic = torch_job.make_model(seed=worker.rank + 10)
    shardps.torch.broadcast_parameters(list(model.named_parameters("g")) + list(critic.named_parameters("d")))
    first = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters("g"))
    second = shardps.torch.DistributedOptimizer(torch.optim.SGD(critic.parameters(), lr=0.1),
                                                named_parameters=critic.named_parameters("d"))
    for step in range(STEPS):
        first.zero_grad()
        loss_of(model, step).backward()
        first.step()
        if step % 2:
            second.zero_grad()
            loss_of(critic, step).backward()
            second.step()
    save(model)
    ok("the second model trained", not torch.equal(critic[0].weight, torch_job.make_model(seed=10)[0].weight))
elif case == "again":
    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer.zero_grad()
    loss_of(model, 0).backward()
    refused(lambda: loss_of(model, 1).backward())
    optimizer.zero_grad()  # the refused backward added to the pushed gradients
    optimizer.step()
    optimizer.zero_grad()
    loss_of(model, 2).backward()
    optimizer.zero_grad()  # the generator's loss reached the discriminator; torch would drop it here
    refused(lambda: loss_of(model, 3).backward())
elif case == "raised":
    class Raising(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("raised in backward")

    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = torch_job.batch(step, worker.rank)
        hidden = model[:2](x)
        out = model[2:](Raising.apply(hidden) if step == 2 else hidden)
        try:
            nn.functional.cross_entropy(out, y).backward()
        except RuntimeError as e:
            print("caught: %s" % e, flush=True)
        optimizer.step()
    save(model)
elif case == "groups":
    head = list(model[4].parameters())
    if worker.update_mode != "sum_only":
        refused(lambda: distributed(model, torch.optim.SGD([{"params": head, "lr": 0.05},
                                                            {"params": list(model[:4].parameters())}], lr=0.1)))
        sys.exit(0)
    optimizer = distributed(model, torch.optim.SGD(list(model[:4].parameters()), lr=0.1))
    optimizer.add_param_group({"params": head, "lr": 0.05})
    stray = nn.Parameter(torch.zeros(4))
    refused(lambda: optimizer.add_param_group({"params": [stray]}))
    ok("the named group was added", len(optimizer.param_groups) == 2)
elif case == "resume-1":
    optimizer = distributed(model, torch.optim.Adam(model.parameters(), lr=0.01))
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = optimizer.state_dict()
    for warning in caught:
        print("warned: %s" % warning.message, flush=True)
    if worker.rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": state}, os.path.join(out_dir, "checkpoint.pt"))
elif case == "resume-2":
    checkpoint = torch.load(os.path.join(out_dir, "checkpoint.pt"))
    model.load_state_dict(checkpoint["model"])
    optimizer = distributed(model, torch.optim.Adam(model.parameters(), lr=0.01))
    refused(lambda: optimizer.load_state_dict(checkpoint["optimizer"]))
    refused(lambda: shardps.torch.broadcast_optimizer_state(optimizer))
    for step in range(STEPS, 2 * STEPS):
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
    save(model)
elif case == "parameter-list":
    torch.manual_seed(worker.rank + 1)
    model = ListNet()
    model.skip.requires_grad_(False)
    optimizer = train_with_forward_waits(model, lambda optimizer: optimizer.zero_grad())
    model.skip.requires_grad_(True)
    optimizer.zero_grad()
    loss_of(lambda x: model(x, use_skip=True), 0).backward()
    optimizer.step()
    optimizer.zero_grad()
    refused(lambda: loss_of(lambda x: model(x, use_skip=True), 1).backward())
elif case == "sparse":
    torch.manual_seed(worker.rank + 1)
    model = nn.Sequential(nn.EmbeddingBag(50, 8, sparse=True), nn.Linear(8, 3))
    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(STEPS):
        bags, classes = sparse_batch(step, worker.rank)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(bags), classes).backward()
        optimizer.step()
    save(model)
elif case == "model-zero":
    torch.manual_seed(worker.rank + 1)
    model = wide_model()
    train_with_forward_waits(model, lambda _: model.zero_grad())
elif case == "hook-order":
    outstanding = []
    model[2].register_forward_pre_hook(lambda *_: outstanding.append([n for n in optimizer.outstanding
                                                                       if n.startswith("2.")]))
    optimizer = distributed(model, torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    for step in range(3):
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
        ok("deferred", optimizer.outstanding)
    model(torch_job.batch(3, worker.rank)[0])
    ok("the earlier pre-hook saw its layer's weights landed", outstanding == [[]] * 4)
