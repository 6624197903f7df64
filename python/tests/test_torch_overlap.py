import re
import unittest

from cluster import has_torch, launch, python_worker


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchOverlapTest(unittest.TestCase):
    def test_later_layers_are_pushed_before_backward_reaches_the_first(self):
        run = launch(1, 1, python_worker("overlap_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        found = re.search(r"requests during backward: (\d+) of (\d+)", run.stdout)
        self.assertIsNotNone(found, run.stdout)
        sent, later = int(found.group(1)), int(found.group(2))
        self.assertGreater(later, 0)
        self.assertEqual(sent, later, "push-pulls of the later layers sent while backward ran")


if __name__ == "__main__":
    unittest.main()
