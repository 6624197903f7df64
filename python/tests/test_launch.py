import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
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

# Trains (push-pull rounds) until the file named by argv[1] exists; a round
# that fails (servers stopped while it ran on) says so.
_PAUSABLE_WORKER = """
import array, os, sys
import shardps
worker = shardps.init()
worker.define([("w", [1024])])
if worker.rank == 0:
    worker.init_tensor("w", array.array("f", [0.0] * 1024))
worker.barrier("init")
grad, out = array.array("f", [1.0] * 1024), array.array("f", [0.0] * 1024)
rounds = 0
try:
    while not os.path.exists(sys.argv[1]):
        worker.wait(worker.push_pull("w", grad, out), timeout=30)
        rounds += 1
        if rounds == 5:
            print("ready", flush=True)
except Exception as e:
    print("round %d failed: %s" % (rounds, e), flush=True)
    sys.exit(3)
print("done after %d rounds" % rounds, flush=True)
"""


class _Terminal:
    """An interactive bash on a pseudo-terminal, with job control as a user has it."""

    def __init__(self):
        env = worker_environment()
        env["PS1"] = "$ "
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.seen = ""
        self.expect("$ ")

    def run(self, argv):
        """Types `argv` as a command line."""
        self.type(" ".join(shlex.quote(a) for a in argv) + "\n")

    def exit_status(self):
        """The shell's $? once the prompt is back: the last foreground job's exit status."""
        self.expect("$ ", 60)
        self.type("echo EXIT=$?\n")
        self.expect("echo EXIT=$?")  # the echo of what was typed
        self.expect("EXIT=", 10)
        return self.expect("\n", 10).strip()

    def type(self, text):
        os.write(self.fd, text.encode())

    def expect(self, needle, timeout=60):
        """Reads the screen until `needle` appears after what was expected before."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError("%r not on the terminal within %s s; it shows:\n%s" % (needle, timeout, self.seen))
            try:
                self.seen += os.read(self.fd, 65536).decode(errors="replace")
            except OSError:
                raise AssertionError("the terminal closed before %r; it showed:\n%s" % (needle, self.seen))
        at = self.seen.index(needle) + len(needle)
        shown, self.seen = self.seen[:at], self.seen[at:]
        return shown

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def _state(pid):
    """The state letter of `pid` (T: stopped), or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


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

    def test_compression_sets_the_codec_of_the_cluster_as_in_shardps_local(self):
        argv = launch_argv(1, 1, [sys.executable, "-c", "import shardps; print(shardps.init().config_text())"])
        argv[2:2] = ["--compression", "fp16"]
        run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             timeout=60, env=worker_environment())
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn('[0]   codec: "fp16"', run.stdout)

    def test_a_worker_reads_single_config_fields(self):
        script = ("import shardps\n"
                  "w = shardps.init()\n"
                  "print(w.config_field('consistency'), w.staleness, w.config_field('optimizer.learning_rate'))\n"
                  "try:\n"
                  "    w.config_field('optimizer.lr')\n"
                  "except shardps.InvalidArgumentError as e:\n"
                  "    print('refused:', e)\n")
        run = launch(1, 1, [sys.executable, "-c", script],
                     sets=["consistency=ssp", "staleness=3", "optimizer.learning_rate=0.125"], timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("[0] SSP 3 0.125", run.stdout)
        self.assertRegex(run.stdout, r"\[0\] refused: .*unknown config field 'optimizer.lr'.*learning_rate")

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
        # scheduler and servers ignore it (the launcher starts them so), so
        # they keep serving until the workers have stopped: no worker sees its
        # servers go first.
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

    def test_ctrl_z_at_the_terminal_pauses_the_workers_too_and_fg_resumes_the_job(self):
        # The terminal stops its foreground group: the launcher and its
        # daemons. The workers lead groups of their own, so the launcher must
        # stop them too, or they wait on stopped servers and fail; fg resumes
        # all of them and the job ends as if never paused.
        with tempfile.TemporaryDirectory() as tmp:
            done = os.path.join(tmp, "done")
            argv = launch_argv(2, 2, [sys.executable, "-c", _PAUSABLE_WORKER, done])
            term = _Terminal()
            try:
                term.run(argv)
                term.expect("] ready")
                term.expect("] ready")
                launcher = [pid for pid in _children(term.pid)]
                self.assertEqual(len(launcher), 1, launcher)
                started = launcher + _children(launcher[0])
                self.assertEqual(len(started), 6, started)  # launcher, scheduler, 2 servers, 2 workers
                term.type("\x1a")  # Ctrl-Z
                term.expect("Stopped")
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(_state(pid) != "T" for pid in started):
                    time.sleep(0.1)
                self.assertEqual([_state(pid) for pid in started], ["T"] * 6)
                time.sleep(3)  # longer than a round; nothing may run meanwhile
                self.assertEqual([_state(pid) for pid in started], ["T"] * 6)
                term.type("fg\n")
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(_state(pid) == "T" for pid in started):
                    time.sleep(0.1)
                self.assertNotIn("T", [_state(pid) for pid in started])
                time.sleep(1)
                open(done, "w").close()
                shown = term.expect("] done after")
                shown += term.expect("] done after")
                self.assertNotIn("] round", shown)  # a failed round
                self.assertEqual(term.exit_status(), "0")
            finally:
                term.close()

    def test_a_second_sigtstp_while_the_launcher_suspends_does_not_stop_it_again_once_continued(self):
        # Both mean the same stop. One that came after Supervise took the
        # first, before the launcher stopped, stopped the job again right after
        # it was continued. The launcher's stderr is left full here, so it
        # waits in Suspend (its note) with the workers already stopped.
        script = "import sys, time\nwhile True:\n    sys.stderr.write('x' * 1000 + '\\n')\n    time.sleep(0.001)\n"
        argv = launch_argv(1, 1, [sys.executable, "-c", script])
        with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=worker_environment(),
                              start_new_session=True) as proc:
            try:
                deadline = time.monotonic() + 30
                workers = []
                while not workers and time.monotonic() < deadline:
                    workers = [c for c in _children(proc.pid) if b"-c" in open("/proc/%d/cmdline" % c, "rb").read()
                               and b"sys.stderr" in open("/proc/%d/cmdline" % c, "rb").read()]
                    time.sleep(0.05)
                self.assertEqual(len(workers), 1)
                time.sleep(1)  # the stderr pipe fills
                proc.send_signal(signal.SIGTSTP)
                while _state(workers[0]) != "T" and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertEqual(_state(workers[0]), "T")  # Suspend stopped it, and waits on its stderr
                proc.send_signal(signal.SIGTSTP)
                time.sleep(0.3)
                drain = threading.Thread(target=lambda: proc.stderr.read(), daemon=True)
                drain.start()
                while _state(proc.pid) != "T" and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertEqual(_state(proc.pid), "T")
                proc.send_signal(signal.SIGCONT)
                time.sleep(0.2)
                states = []
                for _ in range(15):
                    states.append((_state(proc.pid), _state(workers[0])))
                    time.sleep(0.1)
                self.assertNotIn("T", [x for pair in states for x in pair], states)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                for c in workers:
                    try:
                        os.killpg(c, signal.SIGKILL)
                    except OSError:
                        pass

    def _ctrl_z_while_the_daemons_start_then_fg(self, stopped_seconds):
        """Ctrl-Z as soon as the launcher has started its scheduler, `fg` after
        `stopped_seconds`: the job must stop, then finish with exit 0."""
        term = _Terminal()
        try:
            term.run(launch_argv(1, 1, ["sh", "-c", "echo finished"]))
            deadline = time.monotonic() + 30
            launcher = []
            while not launcher and time.monotonic() < deadline:
                launcher = _children(term.pid)
            while launcher and not _children(launcher[0]) and time.monotonic() < deadline:
                pass
            self.assertTrue(launcher and _children(launcher[0]), "the launcher started no scheduler")
            term.type("\x1a")  # Ctrl-Z
            term.expect("Stopped", 15)
            time.sleep(stopped_seconds)
            term.type("fg\n")
            term.expect("[0] finished", 60)
            self.assertEqual(term.exit_status(), "0")
        finally:
            term.close()

    def test_ctrl_z_while_the_daemons_start_stops_the_job_and_fg_resumes_it(self):
        # Before the workers run the launcher only noted SIGTSTP for later,
        # while the terminal stopped the scheduler it was waiting for: the job
        # never stopped, and the launch failed 30 s later ("no address
        # written").
        self._ctrl_z_while_the_daemons_start_then_fg(0)

    def test_a_long_ctrl_z_while_the_daemons_start_does_not_fail_the_launch(self):
        # The launcher stops with its daemons, but the time it stays stopped
        # counted toward the 30 s it gives the scheduler to write its
        # address: stopped longer than that, it gave up as soon as fg
        # continued it ("no address written"), before the scheduler, continued
        # too, could write it. (Supervise does not count a stop toward
        # --timeout either.) Slow: stays stopped 32 s.
        self._ctrl_z_while_the_daemons_start_then_fg(32)

    def test_ctrl_z_while_the_job_ends_does_not_hold_up_the_daemons_shutdown(self):
        # Once the workers are done the launcher no longer acts on SIGTSTP,
        # but the terminal still stops its daemons (its foreground group):
        # SIGTERM alone cannot end a stopped process, so each daemon waited
        # out Stop's 10 s grace and was SIGKILLed. The worker leaves behind a
        # process that presses Ctrl-Z (SIGTSTP to the launcher's group) while
        # the launcher drains the output.
        script = '(sleep 1; kill -TSTP -$PPID) & exit 0'
        term = _Terminal()
        try:
            start = time.monotonic()
            term.run(launch_argv(1, 1, ["sh", "-c", script]))
            term.expect("$ ", 60)  # the job ended: the prompt is back
            elapsed = time.monotonic() - start
            term.type("\n")  # a prompt again for exit_status
            self.assertEqual(term.exit_status(), "0")
            self.assertLess(elapsed, 8, "the stopped daemons waited out their grace: %.1f s" % elapsed)
        finally:
            term.close()

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
