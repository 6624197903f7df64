import os
import tempfile
import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    import torch_job

WORKERS = 2


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchSyncTest(unittest.TestCase):
    def train_on_cluster(self, kind, lr, sets=(), dtype="float32"):
        with tempfile.TemporaryDirectory() as out:
            run = launch(2, WORKERS, python_worker("torch_worker.py", kind, lr, out, dtype),
                         sets=["consistency=sync", "optimizer.kind=" + kind, "optimizer.learning_rate=%g" % lr,
                               "partition_bytes=1024"] + list(sets), timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            return [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(WORKERS)]

    def assert_matches_reference(self, kind, lr, sets=(), dtype="float32"):
        ranks = self.train_on_cluster(kind, lr, sets, dtype)
        expected = torch_job.reference(kind, lr, WORKERS)
        for name, want in expected.items():
            for r, weights in enumerate(ranks):
                self.assertEqual(str(weights[name].dtype), "torch." + dtype)
                got = weights[name].float()
                relative = ((got - want).norm() / want.norm()).item()
                self.assertLess(relative, 1e-5, "%s on rank %d: relative difference %g" % (name, r, relative))

    def test_sync_sgd_on_servers_equals_one_process_on_the_combined_batches(self):
        self.assert_matches_reference("SGD", 0.1)

    def test_sync_adam_on_servers_equals_one_process_on_the_combined_batches(self):
        self.assert_matches_reference("ADAM", 0.01)

    def test_sum_only_sgd_in_the_worker_library_equals_one_process(self):
        self.assert_matches_reference("SGD", 0.1, sets=["update_mode=SUM_ONLY"])

    def test_float64_parameters_train_through_float32_staging(self):
        self.assert_matches_reference("SGD", 0.1, dtype="float64")


if __name__ == "__main__":
    unittest.main()
