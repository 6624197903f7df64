#include "tools/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace shardps {
namespace {

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// argv[0] as a path to execute: looked up in our PATH when asked and it has
// no '/', as execvp does (here, before fork: execvp may allocate). Never the
// bare name, which execve would take as relative to our working directory.
absl::StatusOr<std::string> ProgramPath(const std::string& program, bool search_path) {
  if (!search_path || program.find('/') != std::string::npos) return program;
  const char* path = getenv("PATH");
  if (path == nullptr) path = "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat("no executable '", program, "' in PATH (", path, ")"));
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// A step of ExecChild failed: errno goes to `report`, for the parent to name.
[[noreturn]] void ChildFailed(int report) {
  const int e = errno;
  [[maybe_unused]] ssize_t n = write(report, &e, sizeof(e));
  _exit(127);
}

// The child's side of Spawn, between fork and exec. Only async-signal-safe
// calls: another thread of ours may have held a lock (malloc's) at the fork.
[[noreturn]] void ExecChild(const char* program, char* const* args, char* const* env, const SpawnOptions& o,
                            pid_t parent, int report) {
  auto fail = [report] { ChildFailed(report); };
  if (o.own_process_group && setpgid(0, 0) != 0) fail();
  if (o.stop_with_us) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) fail();
    if (getppid() != parent) _exit(127);  // ended before the line above: nobody is left to serve
  }
  if (o.stdout_fd >= 0 && dup2(o.stdout_fd, STDOUT_FILENO) < 0) fail();
  if (o.stderr_fd >= 0 && dup2(o.stderr_fd, STDERR_FILENO) < 0) fail();
  if (o.stdout_to_stderr && dup2(STDERR_FILENO, STDOUT_FILENO) < 0) fail();
  // Our handlers back to the default before unblocking: a signal that came
  // meanwhile (the SIGTERM of a parent that just ended, say) must act as it
  // will after exec, not run a copy of our handler and be forgotten.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction now {};
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, nullptr, &now) != 0) continue;
    if (now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN) sigaction(sig, &dfl, nullptr);
  }
  if (o.ignore_interrupt) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGINT, &ign, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(program, args, env);
  ChildFailed(report);
}

// `fd` moved to a descriptor above stderr (close-on-exec), where a child's
// dup2 onto 0-2 cannot copy it: with our stdout or stderr closed, pipe2 hands
// out 1 and 2, and a child that kept the report pipe's write end open past
// exec would leave Spawn waiting for good.
int AboveStandardStreams(int fd) {
  if (fd > STDERR_FILENO) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  close(fd);
  return moved;
}

}  // namespace

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "shardps";
  return std::string(buf, n);
}

absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError(absl::StrCat("cannot start ", name, ": no program"));
  const absl::StatusOr<std::string> program = ProgramPath(argv[0], options.search_path);
  if (!program.ok()) return absl::NotFoundError(absl::StrCat("cannot start ", name, ": ", program.status().message()));
  std::vector<char*> args = CStrings(argv);
  std::vector<char*> env = options.environment != nullptr ? CStrings(*options.environment) : std::vector<char*>{};
  auto pipe_failed = [&name](int e) {
    return absl::InternalError(absl::StrCat("cannot start ", name, ": pipe: ", strerror(e)));
  };
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return pipe_failed(errno);
  report[0] = AboveStandardStreams(report[0]);
  report[1] = AboveStandardStreams(report[1]);
  if (report[0] < 0 || report[1] < 0) {
    const int e = errno;
    for (int fd : report) {
      if (fd >= 0) close(fd);
    }
    return pipe_failed(e);
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(report[0]);
    ExecChild(program->c_str(), args.data(), options.environment != nullptr ? env.data() : environ, options, parent,
              report[1]);
  }
  const int fork_errno = errno;
  close(report[1]);
  int child_errno = 0;
  ssize_t n = 0;
  if (pid > 0) {
    // The write end closes at exec (O_CLOEXEC): end of file means started.
    do n = read(report[0], &child_errno, sizeof(child_errno));
    while (n < 0 && errno == EINTR);
  }
  close(report[0]);
  if (pid < 0 || n == sizeof(child_errno)) {
    if (pid > 0) waitpid(pid, nullptr, 0);
    return absl::InternalError(
        absl::StrCat("cannot start ", name, " (", argv[0], "): ", strerror(pid < 0 ? fork_errno : child_errno)));
  }
  return ChildProcess{name, pid};
}

absl::StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                   bool stdout_to_stderr) {
  SpawnOptions options;
  options.stdout_to_stderr = stdout_to_stderr;
  return Spawn(name, argv, options);
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
  // A stopped child (a terminal's Ctrl-Z reached it) acts on SIGTERM only
  // once continued, as a shell's kill does for a stopped job.
  kill(child.pid, SIGCONT);
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
  // Only the time this process runs counts: one that was stopped (a
  // terminal's Ctrl-Z stops shardps launch with its daemons) would otherwise
  // give up as soon as it is continued, before the daemon, continued too,
  // writes its address. A pass that took far longer than its 20 ms sleep
  // was such a stop: at most 1 s of it counts.
  absl::Duration left = deadline - absl::Now();
  absl::Time last = absl::Now();
  while (true) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    int code;
    auto exited = WaitAny(watch, absl::Now(), &code);
    if (exited.ok()) {
      return absl::UnavailableError(absl::StrCat(watch[*exited].name, " ", DescribeExit(code), " at start"));
    }
    const absl::Time now = absl::Now();
    left -= std::min(now - last, absl::Seconds(1));
    last = now;
    if (left <= absl::ZeroDuration()) {
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
