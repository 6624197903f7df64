import signal
import subprocess
import sys
import time
import unittest

from cluster import launch, launch_argv, worker_environment

# A worker that says when it is up and exits 0 on SIGTERM, saying so.
_TERM_AWARE_WORKER = """
import signal, sys, time
def stop(*_):
    print("stopped by SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


class LaunchTest(unittest.TestCase):
    def test_failing_worker_ends_the_others_with_its_exit_code(self):
        script = 'if [ "$SHARDPS_RANK" = 1 ]; then exit 7; fi; sleep 60'
        start = time.monotonic()
        run = launch(1, 3, ["sh", "-c", script])
        self.assertEqual(run.returncode, 7, run.stderr)
        self.assertLess(time.monotonic() - start, 30)
        self.assertIn("worker 1 exited with status 7", run.stderr)

    def test_output_lines_carry_the_rank_and_workers_get_the_cluster_environment(self):
        run = launch(1, 2, ["sh", "-c", 'echo "rank=$SHARDPS_RANK of $SHARDPS_WORKERS at $SHARDPS_SCHEDULER"'])
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = sorted(l for l in run.stdout.splitlines() if "rank=" in l)
        self.assertEqual(len(lines), 2, run.stdout)
        self.assertTrue(lines[0].startswith("[0] rank=0 of 2 at 127.0.0.1:"), lines[0])
        self.assertTrue(lines[1].startswith("[1] rank=1 of 2 at 127.0.0.1:"), lines[1])

    def test_a_command_that_cannot_start_fails_the_launch(self):
        run = launch(1, 1, ["/nonexistent/job"])
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("/nonexistent/job", run.stderr)

    def test_ctrl_c_stops_the_workers_with_sigterm_they_can_handle(self):
        # SIGINT to the launcher (Ctrl-C) ends each worker with SIGTERM: a
        # worker that inherited the launcher's blocked signals never saw it
        # and was SIGKILLed after the grace, its handler never run.
        argv = launch_argv(1, 2, [sys.executable, "-c", _TERM_AWARE_WORKER])
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              env=worker_environment()) as proc:
            ready = 0
            for line in proc.stdout:
                ready += line.endswith("] ready\n")
                if ready == 2:
                    break
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("interrupted", err)
        self.assertIn("[0] stopped by SIGTERM", out, err)
        self.assertIn("[1] stopped by SIGTERM", out, err)


if __name__ == "__main__":
    unittest.main()
