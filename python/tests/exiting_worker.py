"""A worker of test_worker_errors that ends its script with sys.exit(0) inside `with Worker(...)`:
a clean end, which leaves the job as finished, not as failed."""

import sys

import shardps
from shardps import environment

address, _ = environment.scheduler_address(None)
rank, _ = environment.worker_rank(None)
with shardps.Worker(address, rank) as worker:
    worker.define([("w", [4])])
    worker.barrier("init")
    sys.exit(0)
