// Child processes for `shardps local` and the multi-process tests: spawn the
// same binary with other arguments, wait with a deadline, stop them.
#ifndef SHARDPS_TOOLS_PROCESS_H_
#define SHARDPS_TOOLS_PROCESS_H_

#include <spawn.h>
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

// Has the child of a posix_spawn with `attr` start with no signal blocked
// (`flags`: the POSIX_SPAWN_* flags it sets besides). This process may block
// SIGTERM and SIGINT in every thread but the one that waits for them
// (InstallStopSignals), and a mask is inherited across exec: a child that
// kept it could not be stopped by SIGTERM nor interrupted by Ctrl-C.
void StartWithNoSignalBlocked(posix_spawnattr_t* attr, short flags);

// Starts `argv` (argv[0] is the program path). When `stdout_to_stderr`, the
// child's stdout is redirected to our stderr (keeps our stdout for results).
absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   bool stdout_to_stderr);

// Waits for any of `children` to exit, up to `deadline`. Returns its index
// and sets `exit_code` (128+signal for a signal). NotFound if none is
// running; DeadlineExceeded at the deadline.
absl::StatusOr<size_t> WaitAny(std::vector<ChildProcess>& children, absl::Time deadline, int* exit_code);

// SIGKILL at once (fault injection); reaps the child.
void Kill(ChildProcess& child);

// SIGTERM, then SIGKILL after `grace`; returns the exit code.
int Stop(ChildProcess& child, absl::Duration grace);

// Waits until `path` holds a non-empty first line (a daemon writes its bound
// address there once serving) and returns it. Fails early, naming the child,
// if one of `watch` exits; DeadlineExceeded at the deadline.
absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, std::vector<ChildProcess>& watch,
                                               absl::Time deadline);

// Resident memory of process `pid` in bytes (VmRSS of /proc/PID/status);
// 0 if it cannot be read (the process is gone).
uint64_t ResidentBytes(pid_t pid);

// Describes an exit code: "exited with 3" / "killed by signal 9".
std::string DescribeExit(int code);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_PROCESS_H_
