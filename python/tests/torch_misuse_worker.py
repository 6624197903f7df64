"""A worker of test_torch_misuse: DistributedOptimizer.zero_grad() called between backward()
and step(), while the hooks' requests still send the gradients from p.grad. Prints
"ok: <case>: <bool>"."""

import torch

import shardps
import shardps.torch

torch.set_num_threads(1)
worker = shardps.init()
model = torch.nn.Linear(64, 64)
optimizer = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
shardps.torch.broadcast_parameters(model.named_parameters(), root_rank=0)
model(torch.ones(8, 64)).sum().backward()  # the hooks push each gradient from p.grad
in_flight = model.weight.grad
sent = in_flight.clone()
optimizer.zero_grad()
print("ok: the gradient on the wire is untouched: %s" % torch.equal(in_flight, sent))
optimizer.step()
print("ok: no gradient is left for the next step: %s"
      % all(p.grad is None or not p.grad.any() for p in model.parameters()))

# The same model wrapped again (a new learning rate): the earlier optimizer's hooks are removed,
# so each gradient is pushed once a step, and the earlier optimizer can no longer step.
import warnings  # noqa: E402

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    again = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                               named_parameters=model.named_parameters())
print("ok: the take-over is announced: %s" % any("takes over" in str(w.message) for w in caught))
model_bytes = sum(p.numel() * 4 for p in model.parameters())
before = worker.stats()["bytes_pushed"]
again.zero_grad()
model(torch.ones(8, 64)).sum().backward()
again.step()
print("ok: one push per parameter a step: %s" % (worker.stats()["bytes_pushed"] - before == model_bytes))
try:
    optimizer.step()
    print("ok: the earlier optimizer refuses to step: False")
except RuntimeError as e:
    print("ok: the earlier optimizer refuses to step: %s" % ("closed" in str(e)))
