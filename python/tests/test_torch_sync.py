import json
import os
import re
import tempfile
import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    import torch_job

WORKERS = 2
# Parameters of torch_job's model: 20x32 + 32, 32x8 + 8, 8x3 + 3.
ELEMENTS = {"0.weight": 640, "0.bias": 32, "2.weight": 256, "2.bias": 8, "4.weight": 24, "4.bias": 3}


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchSyncTest(unittest.TestCase):
    def train_on_cluster(self, kind, lr, sets=(), dtype="float32", device="cpu", options=None):
        with tempfile.TemporaryDirectory() as out:
            args = [kind, lr, out, dtype, device, json.dumps(options or {})]
            run = launch(2, WORKERS, python_worker("torch_worker.py", *args),
                         sets=["consistency=sync", "optimizer.kind=" + kind, "optimizer.learning_rate=%g" % lr,
                               "partition_bytes=1024"] + list(sets), timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.stdout = run.stdout
            return [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(WORKERS)]

    def assert_matches_reference(self, kind, lr, sets=(), dtype="float32", device="cpu", tolerance=1e-5,
                                 options=None):
        ranks = self.train_on_cluster(kind, lr, sets, dtype, device, options)
        expected = torch_job.reference(kind, lr, WORKERS)
        for name, want in expected.items():
            for r, weights in enumerate(ranks):
                self.assertEqual(str(weights[name].dtype), "torch." + dtype)
                got = weights[name].float()
                relative = ((got - want).norm() / want.norm()).item()
                self.assertLess(relative, tolerance, "%s on rank %d: relative difference %g" % (name, r, relative))

    def test_sync_sgd_on_servers_equals_one_process_on_the_combined_batches(self):
        self.assert_matches_reference("SGD", 0.1)

    def test_sync_adam_on_servers_with_forward_waits_equals_one_process(self):
        # With the model given, step() does not wait: each layer's forward pre-hook does.
        self.assert_matches_reference("ADAM", 0.01, options={"model": True})

    def test_sum_only_sgd_with_the_local_optimizer_equals_one_process(self):
        self.assert_matches_reference("SGD", 0.1, sets=["update_mode=SUM_ONLY"])

    def test_sum_only_adam_with_the_local_optimizer_equals_one_process(self):
        self.assert_matches_reference("ADAM", 0.01, sets=["update_mode=SUM_ONLY"])

    def test_float64_parameters_train_through_float32_staging(self):
        self.assert_matches_reference("SGD", 0.1, dtype="float64")

    def test_float16_parameters_go_zero_copy_and_train(self):
        # float16 keeps 11 bits: each step's weights are rounded to them.
        self.assert_matches_reference("SGD", 0.1, dtype="float16", tolerance=TOLERANCE_FLOAT16)
        self.assertIn("[0] defined dtypes: ['float16']", self.stdout)

    def test_bfloat16_parameters_go_zero_copy_and_train(self):
        # bfloat16 keeps 8 bits, and the forward computes in it too.
        self.assert_matches_reference("SGD", 0.1, dtype="bfloat16", tolerance=TOLERANCE_BFLOAT16)
        self.assertIn("[0] defined dtypes: ['bfloat16']", self.stdout)

    def test_tensors_with_their_own_codecs_train(self):
        codecs = {"0.weight": "fp16", "2.weight": "bf16"}
        # One partition per tensor: the 16-bit codecs leave partitions under 256 elements raw.
        self.assert_matches_reference("SGD", 0.1, sets=["partition_bytes=4096"], tolerance=TOLERANCE_CODECS,
                                      options={"compression": codecs})
        # Rank 1 pushes only gradients: 2 bytes per element of the two compressed tensors, 4 of the rest.
        per_step = sum(n * (2 if name in codecs else 4) for name, n in ELEMENTS.items())
        pushed = int(re.search(r"\[1\] bytes pushed: (\d+)", self.stdout).group(1))
        self.assertEqual(pushed, per_step * torch_job.STEPS)

    @unittest.skipUnless(has_torch() and torch.cuda.is_available(), "no CUDA device for torch")
    def test_cuda_parameters_train_through_device_pointers(self):
        # Two workers on one GPU; GPU kernels round differently from the CPU reference.
        self.assert_matches_reference("SGD", 0.1, device="cuda", tolerance=1e-3)


# Measured on 0.weight: 2.8e-4 (float16), 2.1e-3 (bfloat16), 2.1e-6 (fp16/bf16 codecs with error feedback).
TOLERANCE_FLOAT16 = 3e-3
TOLERANCE_BFLOAT16 = 2e-2
TOLERANCE_CODECS = 1e-3

if __name__ == "__main__":
    unittest.main()
