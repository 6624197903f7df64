import os
import subprocess
import sys
import unittest

from cluster import REPO, launch, python_worker
import shardps


class WorkerErrorsTest(unittest.TestCase):
    def test_dtype_shape_name_and_timeout_errors_raise(self):
        run = launch(1, 2, python_worker("errors_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        for case in ("[0] ok: unknown codec", "[1] ok: unknown codec", "[0] ok: unknown dtype", "[0] ok: dtype", "[0] ok: shape", "[0] ok: name", "[0] ok: 16-bit dtype", "[0] ok: size",
                     "[0] ok: timeout", "[0] ok: second wait", "[0] ok: wait_any timeout",
                     "[0] ok: poll outstanding: True", "[0] ok: wait_any completes: True", "[0] ok: wait_any again",
                     "[0] ok: completions: True", "[1] ok: completions: True", "[0] ok: all", "[1] ok: all"):
            self.assertIn(case, run.stdout)

    def test_unreachable_scheduler_raises_with_status_and_address(self):
        with self.assertRaises(shardps.ShardPSError) as caught:
            shardps.Worker("127.0.0.1:1", 0, rendezvous_timeout=1)
        self.assertIn(caught.exception.status, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        self.assertIn("127.0.0.1:1", str(caught.exception))

    def test_missing_library_names_the_paths_tried(self):
        env = dict(os.environ, SHARDPS_LIBRARY="/nonexistent/libshardps.so",
                   PYTHONPATH=os.path.join(REPO, "python"))
        run = subprocess.run([sys.executable, "-c", "import shardps; shardps.version()"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("LibraryNotFoundError", run.stderr)
        self.assertIn("/nonexistent/libshardps.so (no such file)", run.stderr)
        self.assertIn("set SHARDPS_LIBRARY to that file", run.stderr)


if __name__ == "__main__":
    unittest.main()
