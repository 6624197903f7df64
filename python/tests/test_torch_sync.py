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
    def train_on_cluster(self, kind, lr, sets=(), dtype="float32", device="cpu"):
        with tempfile.TemporaryDirectory() as out:
            run = launch(2, WORKERS, python_worker("torch_worker.py", kind, lr, out, dtype, device),
                         sets=["consistency=sync", "optimizer.kind=" + kind, "optimizer.learning_rate=%g" % lr,
                               "partition_bytes=1024"] + list(sets), timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            return [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(WORKERS)]

    def assert_matches_reference(self, kind, lr, sets=(), dtype="float32", device="cpu", tolerance=1e-5):
        ranks = self.train_on_cluster(kind, lr, sets, dtype, device)
        expected = torch_job.reference(kind, lr, WORKERS)
        for name, want in expected.items():
            for r, weights in enumerate(ranks):
                self.assertEqual(str(weights[name].dtype), "torch." + dtype)
                got = weights[name].float()
                relative = ((got - want).norm() / want.norm()).item()
                self.assertLess(relative, tolerance, "%s on rank %d: relative difference %g" % (name, r, relative))

    def test_sync_sgd_on_servers_equals_one_process_on_the_combined_batches(self):
        self.assert_matches_reference("SGD", 0.1)

    def test_sync_adam_on_servers_equals_one_process_on_the_combined_batches(self):
        self.assert_matches_reference("ADAM", 0.01)

    def test_sum_only_sgd_in_the_worker_library_equals_one_process(self):
        self.assert_matches_reference("SGD", 0.1, sets=["update_mode=SUM_ONLY"])

    def test_float64_parameters_train_through_float32_staging(self):
        self.assert_matches_reference("SGD", 0.1, dtype="float64")

    @unittest.skipUnless(has_torch() and torch.cuda.is_available(), "no CUDA device for torch")
    def test_cuda_parameters_train_through_device_pointers(self):
        # Two workers on one GPU; GPU kernels round differently from the CPU reference.
        self.assert_matches_reference("SGD", 0.1, device="cuda", tolerance=1e-3)


if __name__ == "__main__":
    unittest.main()
