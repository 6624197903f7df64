#!/usr/bin/env python3
"""A torch.nn MLP (784-256-128-10) on Fashion-MNIST, trained data-parallel through
shardps.torch.DistributedOptimizer.

    shardps launch --servers 2 --workers 2 -- /usr/bin/python3 python/examples/train_fashion_mnist.py --epochs 3 --json
    /usr/bin/python3 python/examples/train_fashion_mnist.py --standalone --epochs 3 --json

It needs numpy and torch: Debian's python3-torch (tools/setup.sh) installs them for Debian's
/usr/bin/python3, which another python3 first on PATH may not see.

The consistency and the optimizer are the cluster configuration's (`shardps launch --set
consistency=async`, `--set optimizer.learning_rate=0.01`). --standalone trains the same model
in one process without ShardPS, with torch's version of the configuration's default optimizer
(Adam, learning rate 0.001) and the same batch size and torch threads, for comparison.
Each worker takes every W-th example of a shuffled epoch (the same shuffle on every worker).
--device cuda trains on the GPU (several workers may share one): parameters and batches live
there and DistributedOptimizer hands the CUDA tensors to the library (shardps_push_pull_cuda).
"""

import argparse
import gzip
import json
import os
import signal
import struct
import sys
import time

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:
    sys.exit("%s: %s: %s needs numpy and torch (Debian: python3-torch, for /usr/bin/python3)"
             % (os.path.basename(__file__), e, sys.executable))

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the package of this checkout, when not installed


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim < 1:
        raise ValueError("%s: not an unsigned-byte IDX file (magic %#x)" % (path, magic))
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data for dimensions %s" % (path, array.size, dims))
    return array.reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def make_model():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def cluster_optimizer(worker):
    """(kind, learning rate) of the cluster config's optimizer, as the cluster runs it (defaults
    included)."""
    return worker.config_field("optimizer.kind"), float(worker.config_field("optimizer.learning_rate"))


def torch_optimizer(kind, lr, params):
    if kind == "SGD":
        return torch.optim.SGD(params, lr=lr)
    if kind == "MOMENTUM":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "ADAGRAD":
        return torch.optim.Adagrad(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def leave_on_sigterm(signum, frame):
    print("%s: SIGTERM: leaving the job" % os.path.basename(__file__), file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="examples per step per worker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--log-every", type=int, default=500, help="rank 0 progress line every N steps (0: none)")
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON line with the results")
    parser.add_argument("--standalone", action="store_true", help="one process, no ShardPS, local optimizer")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--pipeline", type=int, default=None,
                        help="steps a request may stay in flight (async/ssp; default: DistributedOptimizer's)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = make_model().to(device)
    x_train, y_train = (t.to(device) for t in load(args.data_dir, "train"))
    x_test, y_test = (t.to(device) for t in load(args.data_dir, "test"))

    first_step = 0
    if args.standalone:
        rank, workers, consistency = 0, 1, "standalone"
        optimizer = torch_optimizer("ADAM", 0.001, model.parameters())
    else:
        import shardps
        import shardps.torch
        # SIGTERM (kill, a Kubernetes pod's end) would end Python at once, with no word to the
        # scheduler: sync peers would wait out heartbeat_timeout_ms. As SystemExit the worker is
        # closed on the way out and leaves the job, and the others go on at once.
        signal.signal(signal.SIGTERM, leave_on_sigterm)
        worker = shardps.init()
        rank, workers, consistency = worker.rank, worker.size, worker.consistency
        kind, lr = cluster_optimizer(worker)
        # model=: step() does not wait for the new weights; each layer's forward does.
        optimizer = shardps.torch.DistributedOptimizer(torch_optimizer(kind, lr, model.parameters()),
                                                       named_parameters=model.named_parameters(), model=model,
                                                       pipeline=args.pipeline)
        shardps.torch.broadcast_parameters(model.named_parameters(), root_rank=0)
        # A rank started again after its process died rejoins the running job: broadcast_parameters
        # pulled the current weights, and in sync and SSP it skips the rounds (steps) the job took
        # without it; in async (no common rounds) the steps its old process had taken.
        first_step = worker.rejoin_round
        if first_step:
            print("rank %d rejoins the job at step %d" % (rank, first_step), file=sys.stderr, flush=True)

    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = len(x_train) // (workers * args.batch_size)
    samples = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = order[rank::workers].to(device)
        for step in range(steps_per_epoch):
            if epoch * steps_per_epoch + step < first_step:
                continue
            batch = mine[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            samples += len(batch)
            if rank == 0 and args.log_every and step % args.log_every == 0:
                print("epoch %d step %d/%d loss %.4f" % (epoch, step, steps_per_epoch, loss.item()),
                      file=sys.stderr, flush=True)
    if not args.standalone:
        optimizer.synchronize()
    wall = time.perf_counter() - start
    if rank != 0:
        return
    result = {
        "test_accuracy": round(accuracy(model, x_test, y_test), 4),
        "samples_per_second": round(samples * workers / wall, 1),
        "samples_per_second_per_worker": round(samples / wall, 1),
        "wall_seconds": round(wall, 2),
        # Share of the training time rank 0 spent waiting for pulled weights (in step() and,
        # with model=, in the layers' forward pre-hooks).
        "wait_fraction": round(getattr(optimizer, "wait_seconds", 0.0) / wall, 3),
        "consistency": consistency,
        "pipeline": getattr(optimizer, "pipeline", 0),
        "workers": workers,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    print("test accuracy %.4f after %d epochs (%s, %d workers) in %.1f s"
          % (result["test_accuracy"], args.epochs, consistency, workers, wall), flush=True)
    if args.json:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
