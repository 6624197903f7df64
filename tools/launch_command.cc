// `shardps launch`: a scheduler and S servers on this machine, and W copies of
// any command as the workers, each started with the environment that the
// Python package's shardps.init() reads (SHARDPS_SCHEDULER, SHARDPS_RANK, ...).
// Every output line of a worker is prefixed with its rank. The first worker
// that fails ends the others, and its exit code becomes ours.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "compression/codec_policy.h"
#include "tools/cli_flags.h"
#include "tools/cluster_credentials.h"
#include "tools/commands.h"
#include "tools/local_cluster.h"
#include "tools/process.h"

extern char** environ;

namespace shardps {
namespace {

struct LaunchOptions {
  int64_t servers = 1, workers = 1;
  std::string config_path;
  std::string compression;  // --compression: the codec of pushed gradients, as in `shardps local`
  std::vector<std::string> sets;
  double timeout_s = 0;  // 0: no limit
  bool verbose = false;
  bool secure = false;
  std::vector<std::string> command;
  // Set by StartDaemons with --secure: what the workers get as SHARDPS_SECURITY_CONFIG.
  std::string node_security_config;
};

// The config every node will receive: the file (if any), the process counts
// of this launch, --compression, then each --set, validated as the scheduler would.
absl::StatusOr<ClusterConfig> LaunchConfig(const LaunchOptions& o) {
  auto config = LoadLocalConfig(o.config_path, o.servers, o.workers);
  if (!config.ok()) return config.status();
  if (absl::Status s = SetCompressionFlag(o.compression, &*config); !s.ok()) return s;
  if (absl::Status s = FinishLocalConfig(o.sets, &*config); !s.ok()) return s;
  return config;
}

// The parent's environment with `overrides` replacing same-named variables.
std::vector<std::string> WorkerEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    if (!overrides.contains(entry.substr(0, entry.find('=')))) env.push_back(std::move(entry));
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

// A worker command: its process leads its own process group, so stopping it
// also stops what it started (a shell script's python, say).
struct WorkerProcess {
  int rank = 0;
  ChildProcess process;
  int out_fd = -1, err_fd = -1;  // read ends of its stdout and stderr
};

absl::StatusOr<WorkerProcess> SpawnWorker(int rank, const LaunchOptions& o, const std::string& scheduler) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::vector<std::string> env = WorkerEnvironment({{"SHARDPS_SCHEDULER", scheduler},
                                                    {"SHARDPS_RANK", absl::StrCat(rank)},
                                                    {"SHARDPS_LOCAL_RANK", absl::StrCat(rank)},
                                                    {"SHARDPS_WORKERS", absl::StrCat(o.workers)},
                                                    {"SHARDPS_SERVERS", absl::StrCat(o.servers)},
                                                    {"SHARDPS_SECURITY_CONFIG", o.node_security_config}});
  SpawnOptions options;
  options.stdout_fd = out[1];
  options.stderr_fd = err[1];
  options.environment = &env;
  options.search_path = true;
  options.own_process_group = true;  // stopping it ends what it started too
  options.stop_with_us = true;
  auto child = Spawn(absl::StrCat("worker ", rank), o.command, options);
  close(out[1]);
  close(err[1]);
  if (!child.ok()) {
    close(out[0]);
    close(err[0]);
    return child.status();
  }
  return WorkerProcess{rank, *child, out[0], err[0]};
}

// Job control. A terminal's Ctrl-Z stops its foreground process group: this
// launcher and its daemons. The workers lead groups of their own (so that
// Ctrl-C reaches them through us, before the daemons stop), so we stop them,
// then ourselves, and resume them once continued (fg, bg). A worker left
// running would wait on stopped servers and fail its requests.
std::atomic<bool> g_suspend{false};
// Set once the daemons are up, just before the workers start: from then
// Supervise acts on g_suspend (stopping the workers too), or once it has
// returned nothing does, the job ending anyway (Stop continues a daemon the
// terminal stopped). Before, no worker runs and the launcher stops at once,
// as its daemons did: a scheduler it waits for, stopped, would never write
// its address.
std::atomic<bool> g_supervising{false};

// Takes SIGTSTP on a thread of its own, like InstallStopSignals, unless it
// was ignored at start (a shell without job control). Call before any other
// thread starts.
void TakeSuspendSignal() {
  struct sigaction at_start {};
  sigaction(SIGTSTP, nullptr, &at_start);
  if (at_start.sa_handler == SIG_IGN) return;
  sigset_t tstp;
  sigemptyset(&tstp);
  sigaddset(&tstp, SIGTSTP);
  // The thread blocks SIGTERM and SIGINT too, which InstallStopSignals takes
  // on its own thread (a handler run on a thread parked in sigwait would be
  // held back under ThreadSanitizer); this thread keeps only SIGTSTP blocked.
  sigset_t start = tstp, before;
  sigaddset(&start, SIGTERM);
  sigaddset(&start, SIGINT);
  pthread_sigmask(SIG_BLOCK, &start, &before);
  std::thread([tstp] {
    int sig = 0;
    while (sigwait(&tstp, &sig) == 0) {
      if (g_supervising.load()) {
        g_suspend.store(true);
      } else {
        raise(SIGSTOP);
      }
    }
  }).detach();
  sigaddset(&before, SIGTSTP);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

// Stops the workers' groups, the daemons and then this process; once it is
// continued, resumes the daemons, then the workers. Returns how long it was
// stopped.
absl::Duration Suspend(const std::vector<WorkerProcess>& workers, const std::vector<ChildProcess>& daemons) {
  for (const WorkerProcess& w : workers) {
    if (w.process.running()) kill(-w.process.pid, SIGSTOP);
  }
  for (const ChildProcess& d : daemons) {
    if (d.running()) kill(d.pid, SIGSTOP);
  }
  std::cerr << "shardps launch: stopped with its workers and daemons; fg or bg resumes them\n";
  const absl::Time stopped = absl::Now();
  raise(SIGSTOP);
  // A SIGTSTP that came while we were stopping asked for this same stop.
  g_suspend.store(false);
  for (const ChildProcess& d : daemons) {
    if (d.running()) kill(d.pid, SIGCONT);
  }
  for (const WorkerProcess& w : workers) {
    if (w.process.running()) kill(-w.process.pid, SIGCONT);
  }
  return absl::Now() - stopped;
}

// SIGTERM to the worker's process group, SIGKILL after `grace`.
void StopWorker(WorkerProcess& w, absl::Duration grace) {
  if (!w.process.running()) return;
  const pid_t group = w.process.pid;
  kill(-group, SIGTERM);
  kill(-group, SIGCONT);  // a stopped group acts on SIGTERM only once continued
  const absl::Time deadline = absl::Now() + grace;
  int status;
  while (waitpid(group, &status, WNOHANG) != group) {
    if (absl::Now() >= deadline) {
      kill(-group, SIGKILL);
      waitpid(group, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-group, SIGKILL);  // whatever the leader left behind in its group
  w.process.pid = -1;
}

// Copies every worker's output to ours line by line, "[rank] line", stdout to
// stdout and stderr to stderr, until every pipe is closed or `abandon` is set.
class OutputRelay {
 public:
  explicit OutputRelay(const std::vector<WorkerProcess>& workers) {
    for (const WorkerProcess& w : workers) {
      streams_.push_back({w.out_fd, w.rank, stdout, {}});
      streams_.push_back({w.err_fd, w.rank, stderr, {}});
    }
    thread_ = std::thread([this] { Run(); });
  }
  // Waits up to `grace` for the pipes to close (output written just before
  // exiting still arrives), then stops reading.
  void Finish(absl::Duration grace) {
    const absl::Time deadline = absl::Now() + grace;
    while (!done_.load() && absl::Now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    abandon_.store(true);
    thread_.join();
  }

 private:
  struct Stream {
    int fd;
    int rank;
    FILE* to;
    std::string partial;
  };

  void Emit(Stream& s, std::string_view line) {
    std::string out = absl::StrCat("[", s.rank, "] ");
    out.append(line).push_back('\n');
    fwrite(out.data(), 1, out.size(), s.to);
    fflush(s.to);
  }

  // Reads what is there; false at end of stream.
  bool Drain(Stream& s) {
    char buf[65536];
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      if (!s.partial.empty()) Emit(s, s.partial);
      close(s.fd);
      s.fd = -1;
      return false;
    }
    s.partial.append(buf, n);
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      Emit(s, std::string_view(s.partial).substr(start, nl - start));
    }
    s.partial.erase(0, start);
    return true;
  }

  void Run() {
    while (!abandon_.load()) {
      std::vector<pollfd> fds;
      std::vector<Stream*> open;
      for (Stream& s : streams_) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        open.push_back(&s);
      }
      if (fds.empty()) break;
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Drain(*open[i]);
      }
    }
    for (Stream& s : streams_) {
      if (s.fd >= 0) close(s.fd);
    }
    done_.store(true);
  }

  std::vector<Stream> streams_;
  std::atomic<bool> abandon_{false}, done_{false};
  std::thread thread_;
};

// Starts the scheduler and the servers; returns the scheduler's address.
// With --secure, fresh credentials first, and every process uses them.
absl::StatusOr<std::string> StartDaemons(LaunchOptions& o, const std::string& dir,
                                         std::vector<ChildProcess>& daemons) {
  std::vector<std::string> scheduler_flags, node_flags;
  if (o.secure) {
    auto files = WriteClusterCredentials(dir + "/credentials", {}, /*mutual=*/true);
    if (!files.ok()) return files.status();
    scheduler_flags = {"--security-config", files->scheduler_config};
    node_flags = {"--security-config", files->node_config};
    o.node_security_config = files->node_config;
  }
  auto scheduler = SpawnScheduler("127.0.0.1:0", dir + "/cluster.pbtxt", dir + "/scheduler.addr", o.verbose,
                                  scheduler_flags);
  if (!scheduler.ok()) return scheduler.status();
  daemons.push_back(*scheduler);
  auto address = WaitForAddressFile(dir + "/scheduler.addr", daemons, absl::Now() + absl::Seconds(30));
  if (!address.ok()) return address.status();
  auto server_flags = [&node_flags](int) { return node_flags; };
  if (absl::Status s = SpawnServers(*address, o.servers, o.verbose, server_flags, daemons); !s.ok()) return s;
  return address;
}

// Waits for the workers. Returns 0 when all exit 0, else the first failure's
// exit code (1 when a daemon dies, the deadline passes or we are stopped).
// Time spent suspended (Ctrl-Z) does not count toward --timeout.
int Supervise(const LaunchOptions& o, std::vector<WorkerProcess>& workers, std::vector<ChildProcess>& daemons) {
  absl::Time deadline = o.timeout_s > 0 ? absl::Now() + absl::Seconds(o.timeout_s) : absl::InfiniteFuture();
  for (size_t done = 0; done < workers.size();) {
    if (g_suspend.exchange(false)) deadline += Suspend(workers, daemons);
    std::vector<ChildProcess> running;
    for (WorkerProcess& w : workers) running.push_back(w.process);
    int code;
    auto exited = WaitAny(running, absl::Now() + absl::Milliseconds(100), &code);
    if (exited.ok()) {
      workers[*exited].process.pid = -1;
      if (code != 0) {
        std::cerr << "shardps launch: " << workers[*exited].process.name << " " << DescribeExit(code)
                  << "; stopping the other workers\n";
        return code;
      }
      ++done;
      continue;
    }
    auto daemon = WaitAny(daemons, absl::Now(), &code);
    if (daemon.ok()) {
      std::cerr << "shardps launch: " << daemons[*daemon].name << " " << DescribeExit(code)
                << " while the workers were running\n";
      return 1;
    }
    if (absl::Now() > deadline) {
      std::cerr << "shardps launch: the workers did not finish within --timeout " << o.timeout_s << " s\n";
      return 1;
    }
    if (StopRequested()) {
      std::cerr << "shardps launch: interrupted\n";
      return 1;
    }
  }
  return 0;
}

int Launch(LaunchOptions o, const ClusterConfig& config) {
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("shardps-launch-", getpid());
  std::filesystem::remove_all(dir);  // left by a killed process with this pid: its address files are stale
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};
  std::ofstream(dir + "/cluster.pbtxt") << config.DebugString();
  std::vector<ChildProcess> daemons;
  std::vector<WorkerProcess> workers;
  int code = 1;
  auto address = StartDaemons(o, dir, daemons);
  if (!address.ok()) std::cerr << "shardps launch: " << address.status().message() << "\n";
  // From here a Ctrl-Z must stop the workers too: Supervise's first pass
  // takes one that comes while they start.
  if (address.ok()) g_supervising.store(true);
  for (int r = 0; address.ok() && r < o.workers; ++r) {
    auto worker = SpawnWorker(r, o, *address);
    if (!worker.ok()) {
      std::cerr << "shardps launch: " << worker.status().message() << "\n";
      break;
    }
    workers.push_back(*worker);
  }
  if (address.ok() && workers.size() == static_cast<size_t>(o.workers)) {
    OutputRelay relay(workers);
    code = Supervise(o, workers, daemons);
    for (WorkerProcess& w : workers) StopWorker(w, absl::Seconds(5));
    relay.Finish(absl::Seconds(2));
  } else {
    for (WorkerProcess& w : workers) {
      StopWorker(w, absl::Seconds(5));
      close(w.out_fd);
      close(w.err_fd);
    }
  }
  // The workers' outcome decides the exit code: a daemon stopped before it
  // finished starting (the workers were quick) dies by SIGTERM, which is no
  // failure of the job; a note says so.
  for (size_t i = daemons.size(); i-- > 0;) {
    const int daemon_code = Stop(daemons[i], absl::Seconds(10));
    if (daemon_code != 0 && o.verbose) {
      std::cerr << "shardps launch: " << daemons[i].name << " " << DescribeExit(daemon_code) << " on SIGTERM\n";
    }
  }
  return code;
}

}  // namespace

constexpr char kLaunchUsage[] = "shardps launch --servers S --workers W -- COMMAND ARGS...";

int LaunchCommand(const Args& args) {
  LaunchOptions o;
  auto dashes = std::find(args.begin(), args.end(), "--");
  const Args flag_args(args.begin(), dashes);
  if (dashes != args.end()) o.command.assign(dashes + 1, args.end());
  CliFlags flags("launch");
  flags.Int("servers", &o.servers, "server processes");
  flags.Int("workers", &o.workers, "copies of COMMAND (ranks 0..W-1)");
  flags.String("config", &o.config_path, "cluster configuration file (protobuf text)");
  flags.Repeated("set", &o.sets, "override one config field, e.g. --set consistency=async");
  flags.String("compression", &o.compression, "codec of pushed gradients, e.g. 2bit, topk:ratio=0.01");
  flags.Double("timeout", &o.timeout_s, "seconds before the workers are stopped (0 = no limit)");
  flags.Bool("verbose", &o.verbose, "log INFO messages of the scheduler and servers");
  flags.Bool("secure", &o.secure,
             "make fresh credentials, secure both planes, and give workers SHARDPS_SECURITY_CONFIG");
  if (absl::Status s = flags.Parse(flag_args); !s.ok()) {
    std::cerr << "shardps launch: " << s.message() << "\n";
    if (dashes == args.end()) std::cerr << "the workers' command goes after --: " << kLaunchUsage << "\n";
    return 2;
  }
  if (flags.help()) {
    std::cout << "then: -- COMMAND ARGS...  run W times, with SHARDPS_SCHEDULER, SHARDPS_RANK, SHARDPS_LOCAL_RANK,\n"
                 "      SHARDPS_WORKERS and SHARDPS_SERVERS set; output lines are prefixed with [rank]\n";
    return 0;
  }
  if (o.command.empty()) {
    std::cerr << "shardps launch: no command: " << kLaunchUsage << "\n";
    return 2;
  }
  if (o.servers < 1 || o.workers < 1) {
    std::cerr << "shardps launch: --servers and --workers must be at least 1\n";
    return 2;
  }
  auto config = LaunchConfig(o);
  if (!config.ok()) {
    std::cerr << "shardps launch: " << config.status().message() << "\n";
    return 2;
  }
  TakeSuspendSignal();  // first: InstallStopSignals' thread must block SIGTSTP too
  InstallStopSignals();
  return Launch(o, *config);
}

}  // namespace shardps
