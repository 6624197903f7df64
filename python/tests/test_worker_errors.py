import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import venv

from cluster import REPO, launch, python_worker
import shardps


class WorkerErrorsTest(unittest.TestCase):
    def test_dtype_shape_name_and_timeout_errors_raise(self):
        run = launch(1, 2, python_worker("errors_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        for case in ("[0] ok: unknown codec", "[1] ok: unknown codec", "[0] ok: unknown dtype", "[0] ok: dtype", "[0] ok: shape", "[0] ok: name", "[0] ok: 16-bit dtype", "[0] ok: size",
                     "[0] ok: timeout", "[0] ok: a timed-out request's buffers go: True", "[0] ok: second wait", "[0] ok: wait_any timeout",
                     "[0] ok: poll outstanding: True", "[0] ok: a second waiter is refused",
                     "[0] ok: a refused wait leaves the handle outstanding: True",
                     "[0] ok: the first wait says how it ended: ['timed out']", "[0] ok: wait_any completes: True", "[0] ok: wait_any again",
                     "[0] ok: completions: True", "[1] ok: completions: True", "[0] ok: all", "[1] ok: all"):
            self.assertIn(case, run.stdout)

    def test_an_uncaught_exception_is_reported_to_the_scheduler_as_the_workers_failure(self):
        run = launch(1, 2, python_worker("failing_worker.py"), timeout=60)
        self.assertNotEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("ValueError: loss is nan at step 3", run.stderr)  # Python's own traceback
        self.assertRegex(run.stderr, r"worker rank 1 \(host [^)]*\) failed and left the job: uncaught "
                                     r"ValueError: loss is nan at step 3 \(failing_worker.py:[0-9]+ in train_step\)")
        self.assertNotRegex(run.stderr, r"worker rank 1 \(host [^)]*\) left the job")

    def test_sys_exit_0_inside_a_with_block_leaves_the_job_as_finished_not_failed(self):
        run = launch(1, 2, python_worker("exiting_worker.py", "exit0"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertNotIn("failed and left the job", run.stderr)

    def test_a_keyboard_interrupt_inside_a_with_block_leaves_the_job_as_stopped_not_failed(self):
        # Ctrl-C (or a launcher's SIGINT) stops a job, as `shardps train` takes SIGINT.
        run = launch(1, 2, python_worker("exiting_worker.py", "interrupt"), timeout=60)
        self.assertIn("KeyboardInterrupt", run.stderr)
        self.assertNotIn("failed and left the job", run.stderr)

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

    def test_a_venv_finds_the_library_installed_into_its_prefix(self):
        # As a user installs: the package outside the checkout, the library by
        # `cmake --install build --prefix "$VIRTUAL_ENV"` (lib/libshardps.so).
        library = os.environ.get("SHARDPS_LIBRARY") or os.path.join(REPO, "build", "worker", "libshardps.so")
        with tempfile.TemporaryDirectory() as tmp:
            prefix = os.path.join(tmp, "venv")
            venv.create(prefix, system_site_packages=True, with_pip=False)
            shutil.copytree(os.path.join(REPO, "python", "shardps"), os.path.join(tmp, "site", "shardps"))
            env = {k: v for k, v in os.environ.items() if k not in ("SHARDPS_LIBRARY", "SHARDPS_BUILD_DIR")}
            env["PYTHONPATH"] = os.path.join(tmp, "site")
            argv = [os.path.join(prefix, "bin", "python"), "-c",
                    "import shardps, shardps._library as l; shardps.version(); print(l.load().shardps_loaded_from)"]
            run = subprocess.run(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True)
            self.assertIn("cmake --install build --prefix %s`" % prefix, run.stderr)
            os.makedirs(os.path.join(prefix, "lib"), exist_ok=True)
            shutil.copy(library, os.path.join(prefix, "lib", "libshardps.so"))
            run = subprocess.run(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout.strip(), os.path.join(prefix, "lib", "libshardps.so"))


if __name__ == "__main__":
    unittest.main()
