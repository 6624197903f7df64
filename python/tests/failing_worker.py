"""A worker of test_worker_errors: rank 1 raises an uncaught exception once it has joined; rank 0
waits for the job to go on without it."""

import array
import time

import shardps


def train_step(worker):
    raise ValueError("loss is nan at step 3")


worker = shardps.init()
worker.define([("w", [4])])
if worker.rank == 0:
    worker.init_tensor("w", array.array("f", [0.0] * 4))
worker.barrier("init")
if worker.rank == 1:
    train_step(worker)
time.sleep(30)  # the launcher ends this rank once rank 1 has failed
