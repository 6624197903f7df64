import os
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

# A worker that trains (push-pull rounds) until SIGTERM, and says so if a
# round fails or the signal finds it: Ctrl-C must stop it before the daemons.
_TRAINING_WORKER = """
import array, signal, sys
import shardps
def stop(*_):
    print("stopped by SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
worker = shardps.init()
worker.define([("w", [1024])])
if worker.rank == 0:
    worker.init_tensor("w", array.array("f", [0.0] * 1024))
worker.barrier("init")
grad, out = array.array("f", [1.0] * 1024), array.array("f", [0.0] * 1024)
rounds = 0
try:
    while True:
        worker.wait(worker.push_pull("w", grad, out), timeout=30)
        rounds += 1
        if rounds == 5:
            print("ready", flush=True)
except Exception as e:
    print("round %d failed: %s" % (rounds, e), flush=True)
    sys.exit(3)
"""


def _children(pid):
    """Pids of the processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid):
    """Whether `pid` is a live process (a zombie nobody reaped counts as ended)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_ready(proc, workers):
    ready = 0
    for line in proc.stdout:
        ready += line.endswith("] ready\n")
        if ready == workers:
            return


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
            _wait_ready(proc, 2)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("interrupted", err)
        self.assertIn("[0] stopped by SIGTERM", out, err)
        self.assertIn("[1] stopped by SIGTERM", out, err)

    def test_ctrl_c_at_the_terminal_stops_training_workers_before_the_daemons(self):
        # A terminal sends SIGINT to its whole foreground process group. The
        # scheduler and servers lead groups of their own, so they keep serving
        # until the workers have stopped: no worker sees its servers go first.
        argv = launch_argv(2, 2, [sys.executable, "-c", _TRAINING_WORKER])
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              env=worker_environment(), start_new_session=True) as proc:
            _wait_ready(proc, 2)
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("interrupted", err)
        self.assertNotIn("failed", out, err)
        self.assertIn("[0] stopped by SIGTERM", out, err)
        self.assertIn("[1] stopped by SIGTERM", out, err)

    def test_a_killed_launcher_takes_its_daemons_and_workers_with_it(self):
        argv = launch_argv(2, 2, [sys.executable, "-c", _TERM_AWARE_WORKER])
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              env=worker_environment()) as proc:
            _wait_ready(proc, 2)
            started = _children(proc.pid)
            self.assertEqual(len(started), 5, started)  # the scheduler, 2 servers, 2 workers
            proc.kill()
            proc.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(pid) for pid in started):
            time.sleep(0.1)
        left = [pid for pid in started if _running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        self.assertEqual(left, [], "still running 30 s after the launcher's SIGKILL")


if __name__ == "__main__":
    unittest.main()
