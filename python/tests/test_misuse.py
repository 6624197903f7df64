import unittest

from cluster import launch, python_worker

try:
    import numpy  # noqa: F401
except ImportError:
    numpy = None


@unittest.skipIf(numpy is None, "numpy is not installed")
class MisuseTest(unittest.TestCase):
    def test_a_careless_callers_mistakes_raise_and_the_job_goes_on(self):
        run = launch(1, 2, python_worker("misuse_worker.py"), timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        for case in ("[0] ok: negative rank", "[0] ok: dtype without codec: True", "[1] ok: NUL in a name",
                     "[0] ok: not a handle", "[0] ok: list as a buffer",
                     "[0] ok: a dropped handle keeps its buffers: True", "[0] ok: interrupted wait",
                     "[0] ok: interrupted handle is done",
                     "[0] ok: timeout names the whole wait", "[0] ok: forked child: this ShardPS worker was made in",
                     "[0] ok: init in a forked child",
                     "[0] ok: forked child exits cleanly: True", "[0] ok: all", "[1] ok: all"):
            self.assertIn(case, run.stdout)


if __name__ == "__main__":
    unittest.main()
