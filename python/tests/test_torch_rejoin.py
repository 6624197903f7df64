import itertools
import os
import re
import tempfile
import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    import shardps.torch


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchRejoinTest(unittest.TestCase):
    def test_a_killed_rank_started_again_pulls_the_trained_weights_and_finishes_in_step(self):
        # Before, the new process waited in broadcast_parameters for a barrier the job had passed
        # and failed 30 s on ("missing worker ranks: 0"); as rank 0 it would have been refused
        # writing its fresh weights over the trained ones.
        with tempfile.TemporaryDirectory() as out:
            run = launch(1, 2, python_worker("torch_rejoin_worker.py", out),
                         sets=["consistency=sync", "optimizer.kind=SGD", "optimizer.learning_rate=0.1",
                               "heartbeat_timeout_ms=3000"], timeout=150)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("[1] first process of rank 1 ended with -9", run.stdout)
            join = int(re.search(r"\[1\] registered again at round (\d+)", run.stdout).group(1))
            self.assertGreater(join, 0)
            fresh, pulled = (torch.load(os.path.join(out, f)) for f in ("fresh.pt", "pulled.pt"))
            ranks = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(2)]
        for name, weights in ranks[0].items():
            self.assertFalse(torch.equal(pulled[name], fresh[name]), name + ": the new process kept its own weights")
            # Both end on the last round's weights: the new process took the rounds the job had left.
            self.assertTrue(torch.equal(ranks[1][name], weights), name + " differs between the ranks")


    def test_a_rank_that_rejoins_while_a_layer_is_frozen_trains_it_in_step_once_unfrozen(self):
        # The frozen layer's partitions keep pace with the rounds, so the new process's pull of it
        # (the weights of the round before its join round) and its pushes, numbered from that
        # round, are the job's. Before, the layer stayed at round 0: that pull waited for rounds it
        # never completed, and both ranks failed 60 s on ("Pull of '4.weight' (round 32): no
        # answer").
        with tempfile.TemporaryDirectory() as out:
            run = launch(1, 2, python_worker("torch_rejoin_worker.py", out, "first", "frozen"),
                         sets=["consistency=sync", "optimizer.kind=SGD", "optimizer.learning_rate=0.1",
                               "heartbeat_timeout_ms=3000"], timeout=150)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            join = int(re.search(r"\[1\] registered again at round (\d+)", run.stdout).group(1))
            self.assertLess(join, 60, "the rank must rejoin while the layer is frozen")
            ranks = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(2)]
        for name, weights in ranks[0].items():
            self.assertTrue(torch.equal(ranks[1][name], weights), name + " differs between the ranks")


class _RejoinedWorker:
    """What broadcast_parameters asks of a worker, for a process that registered again after its
    job passed the barriers `passed`; records the calls that would reach the cluster."""

    def __init__(self, rank, passed):
        self.rank, self.rejoin_round, self.update_mode = rank, 40, "on_server"
        self.tensors, self.dtypes = {}, {}
        self.passed, self.calls = set(passed), []

    def define(self, specs):
        for name, shape, dtype, _ in specs:
            self.tensors[name], self.dtypes[name] = shape, dtype

    def passed_before_rejoin(self, barrier):
        return barrier in self.passed

    def init_tensor(self, name, values, timeout=None):
        self.calls.append(("init", name))

    def barrier(self, name, timeout=None):
        self.calls.append(("barrier", name))

    def pull(self, name, out):
        self.calls.append(("pull", name))
        return name

    def wait(self, handle, timeout=None):
        pass


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class BroadcastAfterRejoinTest(unittest.TestCase):
    def test_a_rejoined_worker_skips_the_barrier_the_job_passed_and_meets_the_others_at_the_next(self):
        # Before, a rejoined worker skipped the barrier on every call: a script that broadcast again
        # mid-training left the other ranks waiting there until their timeout.
        shardps.torch._broadcasts = itertools.count()  # a fresh process, as a rejoined one is
        worker = _RejoinedWorker(rank=1, passed=["shardps.torch.broadcast_parameters.0"])
        params = {"w": torch.zeros(3)}
        shardps.torch.broadcast_parameters(params, root_rank=0, worker=worker)  # the job's first call
        self.assertEqual(worker.calls, [("pull", "w")])
        worker.calls.clear()
        shardps.torch.broadcast_parameters(params, root_rank=0, worker=worker)  # one the others make now
        self.assertEqual(worker.calls, [("barrier", "shardps.torch.broadcast_parameters.1"), ("pull", "w")])


if __name__ == "__main__":
    unittest.main()
