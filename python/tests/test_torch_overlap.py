import re
import unittest

from cluster import has_torch, launch, python_worker


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchOverlapTest(unittest.TestCase):
    def run_worker(self, *args):
        run = launch(1, 1, python_worker("overlap_worker.py", *args), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        found = re.search(r"requests during backward: (\d+) of (\d+)", run.stdout)
        self.assertIsNotNone(found, run.stdout)
        return int(found.group(1)), int(found.group(2)), run.stdout

    def test_later_layers_are_pushed_before_backward_reaches_the_first(self):
        sent, later, _ = self.run_worker()
        self.assertGreater(later, 0)
        self.assertEqual(sent, later, "push-pulls of the later layers sent while backward ran")

    def test_a_higher_priority_holds_later_layers_back_until_it_is_pushed(self):
        sent, later, _ = self.run_worker("prioritise-first")
        self.assertGreater(later, 0)
        self.assertEqual(sent, 0, "nothing sent before the prioritised first layer's gradients")

    def test_forward_completes_each_layer_in_the_order_it_runs(self):
        _, _, out = self.run_worker()
        everything = "first.weight first.bias rest.1.weight rest.1.bias rest.3.weight rest.3.bias"
        self.assertIn("outstanding after step: " + everything, out)
        self.assertIn("outstanding after the first layer: rest.1.weight rest.1.bias rest.3.weight rest.3.bias", out)
        self.assertRegex(out, r"(?m)outstanding after forward: *$")


if __name__ == "__main__":
    unittest.main()
