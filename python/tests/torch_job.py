"""The job of test_torch_sync: a small MLP on synthetic data, run by torch_worker.py on a
cluster and by reference() in one process on the same combined batches."""

import torch
from torch import nn

STEPS = 50
BATCH = 8  # per worker


class StoredLinear(nn.Linear):
    """A linear layer whose parameters may be stored in float16 (torch has no float16 matmul on
    the CPU): it computes in float32."""

    def forward(self, x):
        return nn.functional.linear(x.float(), self.weight.float(), self.bias.float())


def make_model(seed, dtype=torch.float32):
    torch.manual_seed(seed)
    linear = StoredLinear if dtype == torch.float16 else nn.Linear
    model = nn.Sequential(linear(20, 32), nn.Tanh(), linear(32, 8), nn.Tanh(), linear(8, 3))
    return model.to(dtype)


def batch(step, rank):
    """Rank `rank`'s examples of step `step` (the same on every process)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 20, generator=g)
    y = torch.randint(0, 3, (BATCH,), generator=g)
    return x, y


def torch_optimizer(kind, params, lr):
    if kind == "SGD":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def reference(kind, lr, workers):
    """Single process: each step one optimizer step on the workers' batches together."""
    model = make_model(seed=1)
    optimizer = torch_optimizer(kind, model.parameters(), lr)
    for step in range(STEPS):
        parts = [batch(step, r) for r in range(workers)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}
