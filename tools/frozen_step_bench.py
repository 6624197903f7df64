#!/usr/bin/env python3
"""What a frozen parameter costs a sync step: a model with a large frozen layer (a fine-tuned
backbone) and a small trainable head, trained through shardps.torch on a local cluster. Each
frozen step's part in the round goes out as one push with no gradient per partition
(Worker.skip_round); the limit measured in the same run is the step with nothing sent for the
frozen layer (what shardps.torch did before, when its partitions fell behind the rounds).

  tools/frozen_step_bench.py [--servers S] [--workers W] [--frozen-mib M] [--steps N] [--rounds R]

Prints per variant the median step time over R alternating rounds of N steps, and the ratio.
Runs `build/tools/shardps launch` (or $SHARDPS_BINARY) with the interpreter running it, which
needs torch."""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def launcher(args):
    binary = os.environ.get("SHARDPS_BINARY") or os.path.join(REPO, "build", "tools", "shardps")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(REPO, "python"), env.get("PYTHONPATH")]))
    argv = [binary, "launch", "--servers", str(args.servers), "--workers", str(args.workers),
            "--set", "consistency=sync", "--set", "optimizer.kind=ADAM", "--set", "optimizer.learning_rate=0.001",
            "--", sys.executable, os.path.abspath(__file__), "--worker", "--frozen-mib", str(args.frozen_mib),
            "--steps", str(args.steps), "--rounds", str(args.rounds)]
    return subprocess.call(argv, env=env)


def worker(args):
    import torch
    from torch import nn
    import shardps
    import shardps.torch

    shardps.init()
    side = int((args.frozen_mib * (1 << 20) / 4) ** 0.5)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(side, side, bias=False), nn.ReLU(), nn.Linear(side, 10))
    model[0].requires_grad_(False)  # the frozen backbone
    optimizer = shardps.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.001),
                                                   named_parameters=model.named_parameters())
    shardps.torch.broadcast_parameters(model.named_parameters())
    x, y = torch.randn(32, side), torch.randint(0, 10, (32,))
    times = {"skip_round": [], "nothing sent": []}
    partitions = len(shardps.worker().partitions("0.weight"))
    for r in range(2 * args.rounds + 1):
        variant = "skip_round" if r % 2 == 0 else "nothing sent"
        optimizer._skips = variant == "skip_round"
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if r > 0:  # the first round warms up
            times[variant].append((time.perf_counter() - start) / args.steps)
    if shardps.rank() == 0:
        skip, nothing = statistics.median(times["skip_round"]), statistics.median(times["nothing sent"])
        print("frozen layer %d x %d (%.1f MiB, %d partitions), %d workers: step %.2f ms with skip_round, "
              "%.2f ms with nothing sent for it: ratio %.3f" % (side, side, side * side * 4 / (1 << 20), partitions,
                                                                shardps.size(), skip * 1e3, nothing * 1e3,
                                                                skip / nothing), flush=True)
    shardps.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frozen-mib", type=float, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return worker(args) if args.worker else launcher(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
