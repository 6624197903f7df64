"""Models and batches of torch_patterns_worker.py's own cases, shared with the one-process
references of test_torch_patterns."""

import torch
from torch import nn

import torch_job


class ListNet(nn.Module):
    """Its parameters in an nn.ParameterList, which is never called; `skip` is a Linear used
    by weight only."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ParameterList([nn.Parameter(torch.randn(20, 16) * 0.3),
                                        nn.Parameter(torch.randn(16, 3) * 0.3)])
        self.skip = nn.Linear(20, 3, bias=False)

    def forward(self, x, use_skip=False):
        out = torch.tanh(x @ self.layers[0]) @ self.layers[1]
        return out + nn.functional.linear(x, self.skip.weight) if use_skip else out


def sparse_batch(step, rank):
    """Rank `rank`'s bags of step `step` for the sparse case, and their classes."""
    bags = torch.randint(0, 50, (2 * torch_job.BATCH, 4), generator=torch.Generator().manual_seed(step))
    bags = bags[rank * torch_job.BATCH:(rank + 1) * torch_job.BATCH] if rank is not None else bags
    return bags, bags[:, 0] % 3


def wide_model():
    """Layers of many partitions, whose gradients stay on the wire a while after step()."""
    return nn.Sequential(nn.Linear(20, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 3))
