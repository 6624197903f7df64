import re
import unittest

from cluster import has_torch, launch, python_worker

# SGD at 0.5 on the servers, so each push moves every weight by exactly -0.5; no staleness-aware
# rate, which would scale a push by the staleness that pipelining itself brings.
SGD = ("optimizer.kind=SGD", "optimizer.learning_rate=0.5", "staleness_aware_lr=false")


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchPipelineTest(unittest.TestCase):
    def run_worker(self, sets, *args):
        run = launch(1, 1, python_worker("pipeline_worker.py", *args), sets=SGD + tuple(sets), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        return run.stdout

    def steps(self, out):
        """Per step, how many pushes w's and b's weights included: [(kw, kb), ...]."""
        found = re.search(r"included: ([\d/ ]+)", out)
        self.assertIsNotNone(found, out)
        return [tuple(int(k) for k in pair.split("/")) for pair in found.group(1).split()]

    def test_async_steps_compute_with_weights_at_most_one_own_push_behind(self):
        out = self.run_worker(["consistency=async"])
        self.assertIn("pipeline: 1", out)
        included = self.steps(out)
        self.assertEqual(len(included), 20)
        for step, pair in enumerate(included):
            for k in pair:
                self.assertIn(k, (step - 1, step) if step else (0,), "step %d computed with %d pushes: %s"
                              % (step, k, included))
        self.assertEqual(included[11], (11, 11), "synchronize() at step 10 landed its pushes")
        # step() came back before its own push was answered, at least once (here: nearly always).
        self.assertTrue(any(min(pair) == step - 1 for step, pair in enumerate(included)), included)
        self.assertIn("changed between steps: 0", out)
        # 20 pushes of 1, 2, ..., 20, each once (none pushed again after synchronize()), all
        # landed by the last synchronize(): -0.5 * 210.
        self.assertRegex(out, r"final: -105 -105 outstanding: *\n")

    def test_ssp_with_staleness_pipelines_and_pipeline_zero_waits_for_every_step(self):
        out = self.run_worker(["consistency=ssp", "staleness=2"])
        self.assertIn("pipeline: 1", out)
        out = self.run_worker(["consistency=async"], "request=0")
        self.assertIn("pipeline: 0", out)
        self.assertEqual(self.steps(out), [(k, k) for k in range(20)])
        self.assertRegex(out, r"final: -105 -105 outstanding: *\n")

    def test_a_request_held_past_the_timeout_raises_from_step_naming_the_tensor(self):
        run = launch(1, 2, python_worker("pipeline_worker.py", "held"),
                     sets=SGD + ("consistency=ssp", "staleness=1"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        found = re.search(r"\[0\] held: DEADLINE_EXCEEDED (.*) at step (\d+)", run.stdout)
        self.assertIsNotNone(found, run.stdout + run.stderr)
        self.assertRegex(found.group(1), "'[wb]'")
        # Rounds 0 and 1 are answered (worker 1 pushed round 0); round 2's is held, and the
        # step that must land it is the next one.
        self.assertEqual(int(found.group(2)), 3, run.stdout)

    def test_sync_does_not_pipeline_and_refuses_a_request_to(self):
        out = self.run_worker([])
        self.assertIn("pipeline: 0", out)
        self.assertEqual(self.steps(out), [(k, k) for k in range(20)])
        self.assertRegex(out, r"final: -105 -105 outstanding: *\n")
        out = self.run_worker([], "request=1")
        self.assertIn("refused: pipeline=1 needs consistency async, or ssp with staleness >= 1; the cluster is sync",
                      out)


if __name__ == "__main__":
    unittest.main()
