// Child processes for `shardps local` and the multi-process tests: spawn the
// same binary with other arguments, wait with a deadline, stop them.
#ifndef SHARDPS_TOOLS_PROCESS_H_
#define SHARDPS_TOOLS_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardps {

struct ChildProcess {
  std::string name;  // e.g. "server 1", for messages
  pid_t pid = -1;
  bool running() const { return pid > 0; }
};

// Path of the running executable.
std::string SelfExecutable();

// How Spawn starts a child. Every child starts with no signal blocked and
// our signal handlers reset to the default: this process may block SIGTERM
// and SIGINT in every thread but the one that waits for them
// (InstallStopSignals), and a mask is inherited across exec, so a child that
// kept it could not be stopped by SIGTERM nor interrupted by Ctrl-C.
struct SpawnOptions {
  // The child's stdout goes to our stderr (keeps our stdout for results).
  bool stdout_to_stderr = false;
  // Where the child's stdout and stderr go instead, when >= 0 (pipes' write ends, say).
  int stdout_fd = -1, stderr_fd = -1;
  // The child's environment, "KEY=VALUE" each; null: ours.
  const std::vector<std::string>* environment = nullptr;
  // argv[0] without a '/' is looked up in our PATH.
  bool search_path = false;
  // The child leads a process group of its own, so stopping the group
  // stops what it started too. (A terminal's Ctrl-C and Ctrl-Z no longer
  // reach it: its parent must pass them on.)
  bool own_process_group = false;
  // The child starts with SIGINT ignored, so a terminal's Ctrl-C, which goes
  // to our whole process group, leaves it to us to stop it when and how we
  // choose (InstallStopSignals keeps an ignored SIGINT ignored, as shells
  // expect of a job started in the background).
  bool ignore_interrupt = false;
  // The child gets SIGTERM when this process ends, however it ends (SIGKILL
  // included), so nothing started for one job outlives it. Linux's
  // PR_SET_PDEATHSIG, which fires when the *thread* that spawned the child
  // ends: spawn such children from a thread that lives as long as the process.
  bool stop_with_us = false;

  // A process started for one job and ended with it (servers, workers of
  // `shardps local` and `shardps bench`), its output on our stderr.
  static SpawnOptions JobChild() {
    SpawnOptions o;
    o.stdout_to_stderr = true;
    o.stop_with_us = true;
    return o;
  }
};

// Starts `argv` (argv[0] is the program) as `options` say. `name` is for
// messages ("server 1"). A program that cannot be found or executed is an
// error here, not a child that exits 127.
absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   const SpawnOptions& options);

// The same with default options but `stdout_to_stderr`.
absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   bool stdout_to_stderr);

// Waits for any of `children` to exit, up to `deadline`. Returns its index
// and sets `exit_code` (128+signal for a signal). NotFound if none is
// running; DeadlineExceeded at the deadline.
absl::StatusOr<size_t> WaitAny(std::vector<ChildProcess>& children, absl::Time deadline, int* exit_code);

// SIGKILL at once (fault injection); reaps the child.
void Kill(ChildProcess& child);

// SIGTERM (and SIGCONT, should it be stopped), then SIGKILL after `grace`;
// returns the exit code.
int Stop(ChildProcess& child, absl::Duration grace);

// Waits until `path` holds a non-empty first line (a daemon writes its bound
// address there once serving) and returns it. Fails early, naming the child,
// if one of `watch` exits; DeadlineExceeded at the deadline. Time spent
// stopped (SIGSTOP, SIGTSTP) does not count toward it.
absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, std::vector<ChildProcess>& watch,
                                               absl::Time deadline);

// Resident memory of process `pid` in bytes (VmRSS of /proc/PID/status);
// 0 if it cannot be read (the process is gone).
uint64_t ResidentBytes(pid_t pid);

// Describes an exit code: "exited with 3" / "killed by signal 9".
std::string DescribeExit(int code);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_PROCESS_H_
