#include "tools/process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace shardps {
namespace {

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "shardps";
  return std::string(buf, n);
}

void StartWithNoSignalBlocked(posix_spawnattr_t* attr, short flags) {
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setflags(attr, static_cast<short>(flags | POSIX_SPAWN_SETSIGMASK));
}

absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   bool stdout_to_stderr) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_to_stderr) posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  StartWithNoSignalBlocked(&attr, 0);
  pid_t pid;
  int err = posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return absl::InternalError(absl::StrCat("cannot start ", name, " (", argv[0], "): ", strerror(err)));
  return ChildProcess{name, pid};
}

absl::StatusOr<size_t> WaitAny(std::vector<ChildProcess>& children, absl::Time deadline, int* exit_code) {
  while (true) {
    bool any = false;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!children[i].running()) continue;
      any = true;
      int status;
      pid_t r = waitpid(children[i].pid, &status, WNOHANG);
      if (r == children[i].pid) {
        children[i].pid = -1;
        *exit_code = ExitCode(status);
        return i;
      }
    }
    if (!any) return absl::NotFoundError("no child process is running");
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("child processes still running at the deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Kill(ChildProcess& child) {
  if (!child.running()) return;
  kill(child.pid, SIGKILL);
  int status;
  waitpid(child.pid, &status, 0);
  child.pid = -1;
}

int Stop(ChildProcess& child, absl::Duration grace) {
  if (!child.running()) return 0;
  kill(child.pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (true) {
    pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) break;
    if (absl::Now() >= deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  child.pid = -1;
  return ExitCode(status);
}

absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, std::vector<ChildProcess>& watch,
                                               absl::Time deadline) {
  while (true) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    int code;
    auto exited = WaitAny(watch, absl::Now(), &code);
    if (exited.ok()) {
      return absl::UnavailableError(absl::StrCat(watch[*exited].name, " ", DescribeExit(code), " at start"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no address written to ", path, " in time"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string DescribeExit(int code) {
  if (code > 128) return absl::StrCat("was killed by signal ", code - 128);
  return absl::StrCat("exited with status ", code);
}

}  // namespace shardps

namespace shardps {

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    uint64_t kb = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    return absl::SimpleAtoi(digits, &kb) ? kb * 1024 : 0;
  }
  return 0;
}

}  // namespace shardps
