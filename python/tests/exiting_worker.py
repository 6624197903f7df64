"""A worker of test_worker_errors that ends its script inside `with Worker(...)` as argv[1]
says: "exit0" with sys.exit(0), "interrupt" with a KeyboardInterrupt (Ctrl-C). Both are clean
ends, which leave the job as finished, not as failed."""

import sys

import shardps
from shardps import environment

address, _ = environment.scheduler_address(None)
rank, _ = environment.worker_rank(None)
with shardps.Worker(address, rank) as worker:
    worker.define([("w", [4])])
    worker.barrier("init")
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
    sys.exit(0)
