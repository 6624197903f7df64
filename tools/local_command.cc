// `shardps local`: a scheduler, S servers and W training workers as separate
// processes on loopback, or (--reference) the same job in one process.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint_store.h"
#include "common/config.h"
#include "common/logging.h"
#include "compression/codec_policy.h"
#include "common/scheduler_client.h"
#include "tools/cli_flags.h"
#include "tools/cluster_credentials.h"
#include "tools/fault_injection.h"
#include "tools/local_cluster.h"
#include "tools/commands.h"
#include "tools/process.h"
#include "tools/train_job.h"
#include "tools/update_accounting.h"

namespace shardps {
namespace {

struct LocalOptions {
  int64_t servers = 2, workers = 2, epochs = 3, batch = 32, seed = 1, train_limit = 0, test_limit = 0,
          max_steps = 0, log_every = 100, devices_per_worker = 1, eval_every = 0;
  std::string consistency, config_path, compression, hidden = "256,128";
  std::vector<std::string> sets, kills, slow, add_servers;
  std::vector<int64_t> add_at;  // steps of worker 0 at which one more server starts, from --add-server
  std::vector<std::string> drains;                   // --drain INDEX@STEP
  std::vector<std::pair<int64_t, int64_t>> drain_at;  // (step of worker 0, server index), by step
  std::map<int64_t, double> slow_factors;  // rank -> compute slow-down, from --slow
  std::string checkpoint_dir, resume;  // checkpoint.dir; a checkpoint to restart from
  int64_t checkpoint_every = 0;
  bool json = false, reference = false, deterministic = false, verbose = false, secure = false;
  bool no_overlap = false;  // workers' --no-overlap
  // Start a new server in the place of each killed one, and a killed worker's
  // rank again (it rejoins), once it is declared dead.
  bool replace = false;
  double timeout_s = 3600, restart_after_s = 2;
};

// --checkpoint-dir, --checkpoint-every and --resume. The restore point is
// resolved here, once: a scheduler restarted after a kill keeps that round.
absl::Status ApplyCheckpointFlags(const LocalOptions& o, ClusterConfig* config) {
  if (!o.checkpoint_dir.empty()) {
    config->mutable_checkpoint()->set_dir(std::filesystem::absolute(o.checkpoint_dir).lexically_normal().string());
  }
  if (o.checkpoint_every > 0) {
    const bool dir_set =
        absl::c_any_of(o.sets, [](const std::string& s) { return absl::StartsWith(s, "checkpoint.dir="); });
    if (config->checkpoint().dir().empty() && !dir_set) {
      return absl::InvalidArgumentError("--checkpoint-every needs --checkpoint-dir (or checkpoint.dir in --config)");
    }
    config->mutable_checkpoint()->set_every_rounds(o.checkpoint_every);
  }
  if (o.resume.empty()) return absl::OkStatus();
  return SetRestorePoint(o.resume, config);
}

absl::StatusOr<ClusterConfig> BuildConfig(const LocalOptions& o) {
  auto loaded = LoadLocalConfig(o.config_path, o.servers, o.workers);
  if (!loaded.ok()) return loaded.status();
  ClusterConfig config = *std::move(loaded);
  if (!o.consistency.empty()) {
    if (absl::Status s = SetConfigField(&config, "consistency=" + o.consistency); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--consistency: ", s.message()));
    }
  }
  if (o.deterministic) config.set_deterministic(true);
  if (absl::Status s = SetCompressionFlag(o.compression, &config); !s.ok()) return s;
  if (absl::Status s = ApplyCheckpointFlags(o, &config); !s.ok()) return s;
  if (absl::Status s = FinishLocalConfig(o.sets, &config); !s.ok()) return s;
  return config;
}

std::map<std::string, double> ReadResult(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string key;
  double value;
  while (in >> key >> value) out[key] = value;
  return out;
}

// --slow worker:R=F: worker R computes F times slower.
absl::Status ParseSlowFlags(LocalOptions& o) {
  for (const std::string& spec : o.slow) {
    const std::string prefix = "worker:";
    const size_t eq = spec.find('=');
    int64_t rank;
    double factor;
    if (!absl::StartsWith(spec, prefix) || eq == std::string::npos ||
        !absl::SimpleAtoi(spec.substr(prefix.size(), eq - prefix.size()), &rank) ||
        !absl::SimpleAtod(spec.substr(eq + 1), &factor)) {
      return absl::InvalidArgumentError(absl::StrCat("--slow '", spec, "': expected worker:RANK=FACTOR, e.g. worker:1=3"));
    }
    if (rank < 0 || rank >= o.workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slow '", spec, "': worker rank ", rank, " is outside [0, ", o.workers, ")"));
    }
    if (!(factor >= 1.0 && factor <= 1000.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--slow '", spec, "': factor ", factor, " is not in [1, 1000]"));
    }
    o.slow_factors[rank] = factor;
  }
  return absl::OkStatus();
}

// Staleness of the gradients the servers applied (their --updates-file
// 'staleness GRADIENTS SUM MAX' lines), in rounds.
struct StalenessSummary {
  uint64_t gradients = 0;
  double sum = 0, max = 0;
};

void ReadStaleness(const std::string& path, StalenessSummary* out) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    StalenessSummary s;
    if (!(fields >> key >> s.gradients >> s.sum >> s.max) || key != "staleness") continue;
    out->gradients += s.gradients;
    out->sum += s.sum;
    out->max = std::max(out->max, s.max);
  }
}

struct Outcome {
  std::map<std::string, double> rank0;
  StalenessSummary staleness;
  uint64_t bytes_pushed = 0, bytes_pulled = 0;
  int64_t samples = 0;
  double wall_seconds = 0;
  std::vector<FaultRecord> faults;
  std::vector<FaultSpec> never_happened;  // asked for, not injected before the job ended
  std::vector<int64_t> adds_never_happened;  // --add-server steps worker 0 did not reach
  std::vector<std::pair<int64_t, int64_t>> drains_never_happened;  // --drain not asked by the end
  std::vector<std::string> drains_unfinished;  // asked, its server not stopped by itself: which and why
  std::string weights_sha256;  // rank 0's final weights
  UpdateAccounting updates;
};

// Rank 0's step count, written by `shardps train --progress-file`.
int64_t ReadProgress(const std::string& path) {
  std::ifstream in(path);
  int64_t step = 0;
  in >> step;
  return step;
}

// The position in the launcher's daemons of the server the scheduler gave
// `index` (from the servers' --info-file); of `spawned` server processes, the
// latest to report it (a replacement takes a dead server's index).
absl::StatusOr<size_t> ServerSlot(const std::string& dir, int spawned, int index) {
  for (int i = spawned; i-- > 0;) {
    std::ifstream in(absl::StrCat(dir, "/server.", i));
    int registered = -1;
    if (in >> registered && registered == index) return 1 + i;
  }
  return absl::NotFoundError(absl::StrCat("no server process reported index ", index));
}

// Whether the scheduler lists the server of daemon slot `slot` (1 + its
// spawn order, as ServerSlot) as dead. Such a server stops by itself (exit 1,
// saying why) once a heartbeat tells it so: it was paused or cut off past the
// heartbeat timeout, and the job went on without it.
bool DeclaredDeadServer(const std::string& dir, size_t slot, SchedulerClient& client) {
  std::ifstream in(absl::StrCat(dir, "/server.", slot - 1));
  int64_t index = -1;
  if (!(in >> index)) return false;
  auto status = client.Status(absl::Seconds(5));
  if (!status.ok()) return false;
  for (const ServerInfo& s : status->shard_map().servers()) {
    if (s.index() == index) return s.dead();
  }
  return false;
}

// Why server `index`, asked to drain, had not stopped by itself when the job
// ended, as the fault injector and the scheduler tell.
std::string WhyNotDrained(SchedulerClient& client, int64_t index, const FaultInjector* injector) {
  for (const FaultRecord& r : injector != nullptr ? injector->records() : std::vector<FaultRecord>{}) {
    if (r.spec.role == FaultSpec::Role::kServer && r.spec.index == index) {
      return absl::StrCat("--kill ", FaultSpecName(r.spec), " killed it before it stopped by itself");
    }
  }
  auto status = client.Status(absl::Seconds(5));
  if (!status.ok()) return absl::StrCat("it was still running when the job ended (", status.status().message(), ")");
  for (const ServerInfo& s : status->shard_map().servers()) {
    if (s.index() != index) continue;
    if (s.dead()) return absl::StrCat("it died while it drained: ", s.dead_reason());
    if (!s.draining()) {
      return "the scheduler ended its drain (another server died, and too few were left for the job's copies); it "
             "served on";
    }
  }
  return "it was still draining when the job ended";
}

// What the surviving (and rejoined) workers and servers wrote once stopped: results, rank
// 0's weights digest, and the lost/duplicate update accounting.
Outcome CollectOutcome(const std::string& dir, const LocalOptions& o, int spawned_servers,
                       const ClusterConfig& config, const FaultInjector* injector, const std::set<int>& rejoined) {
  Outcome out;
  if (injector != nullptr) {
    out.faults = injector->records();
    out.never_happened = injector->pending();
  }
  std::map<int, WorkerAcks> acked;
  for (int r = 0; r < o.workers; ++r) {
    // A killed worker reports nothing; one started again reports what its
    // new process was acknowledged.
    if (injector != nullptr && injector->WorkerKilled(r) && !rejoined.contains(r)) continue;
    auto result = ReadResult(absl::StrCat(dir, "/result.", r));
    out.bytes_pushed += result["bytes_pushed"];
    out.bytes_pulled += result["bytes_pulled"];
    out.samples += result["samples"];
    acked[r] = ReadWorkerAcks(absl::StrCat(dir, "/result.", r));
    if (r == 0) {
      out.rank0 = result;
      std::ifstream(absl::StrCat(dir, "/result.0.sha256")) >> out.weights_sha256;
    }
  }
  std::vector<std::string> updates_files;
  for (int i = 0; i < spawned_servers; ++i) {
    updates_files.push_back(absl::StrCat(dir, "/updates.", i));
    ReadStaleness(updates_files.back(), &out.staleness);
  }
  out.updates = AccountUpdates(!RoundBased(config), ReadServerUpdates(updates_files), acked,
                               RoundBased(config) ? config.checkpoint().restore_round() : 0);
  return out;
}

// Runs the cluster; every child is stopped before returning, success or not.
absl::StatusOr<Outcome> RunCluster(const LocalOptions& o, const ClusterConfig& config,
                                   const std::vector<FaultSpec>& faults) {
  std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("shardps-local-", getpid());
  std::filesystem::remove_all(dir);  // left by a killed process with this pid: its address files are stale
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};
  // --secure: fresh credentials for this run, and every process uses them.
  std::vector<std::string> node_security;
  SecurityCredentials client_security;
  std::vector<std::string> scheduler_flags = {"--state-dir", dir + "/state"};
  if (o.secure) {
    auto files = WriteClusterCredentials(dir + "/credentials", {}, /*mutual=*/true);
    if (!files.ok()) return files.status();
    node_security = {"--security-config", files->node_config};
    scheduler_flags.insert(scheduler_flags.end(), {"--security-config", files->scheduler_config});
    auto loaded = LoadSecurityCredentialsFile(files->node_config, /*for_scheduler=*/false);
    if (!loaded.ok()) return loaded.status();
    client_security = *std::move(loaded);
  } else if (config.security().enabled()) {
    // The --config file's own credentials: every process reads that file's block.
    node_security = {"--security-config", std::filesystem::absolute(o.config_path).string()};
    auto loaded = LoadSecurityCredentials(config.security(), /*for_scheduler=*/false);
    if (!loaded.ok()) return loaded.status();
    client_security = *std::move(loaded);
  }
  {
    std::ofstream(dir + "/cluster.pbtxt") << config.DebugString();
  }
  const std::string self = SelfExecutable();
  const std::string verbose = o.verbose ? "--verbose" : "--verbose=false";
  std::vector<ChildProcess> daemons, workers;
  auto stop_all = [&] {
    for (auto& c : workers) Stop(c, absl::Seconds(2));
    for (size_t i = daemons.size(); i-- > 0;) Stop(daemons[i], absl::Seconds(5));
  };
  auto fail = [&](absl::Status s) {
    stop_all();
    return s;
  };
  // The scheduler persists its state, so one restarted after a kill resumes.
  auto start_scheduler = [&](const std::string& listen, const std::string& port_file) {
    return SpawnScheduler(listen, dir + "/cluster.pbtxt", port_file, o.verbose, scheduler_flags);
  };
  // A port another process may take between the check and the bind: the
  // scheduler then exits at once, and another port is tried.
  absl::StatusOr<std::string> address;
  for (int attempt = 1;; ++attempt) {
    auto scheduler = start_scheduler(absl::StrCat("127.0.0.1:", FreeSchedulerPort()), dir + "/scheduler.addr");
    if (!scheduler.ok()) return scheduler.status();
    std::vector<ChildProcess> watch = {*scheduler};
    address = WaitForAddressFile(dir + "/scheduler.addr", watch, absl::Now() + absl::Seconds(30));
    if (address.ok() || watch[0].running() || attempt == 3) {
      daemons.push_back(watch[0]);
      break;
    }
  }
  if (!address.ok()) return fail(address.status());
  int restarts = 0;
  auto restart_scheduler = [&]() -> absl::StatusOr<ChildProcess> {
    const std::string port_file = absl::StrCat(dir, "/scheduler.addr.", ++restarts);
    auto child = start_scheduler(*address, port_file);
    if (!child.ok()) return child.status();
    std::vector<ChildProcess> watch = {*child};
    auto serving = WaitForAddressFile(port_file, watch, absl::Now() + absl::Seconds(30));
    if (!serving.ok()) return absl::UnavailableError(absl::StrCat("restarting the scheduler: ", serving.status().message()));
    return watch[0];
  };
  // --drain asks the scheduler through a client of its own.
  std::unique_ptr<SchedulerClient> drain_client;
  if (!o.drain_at.empty()) {
    auto client = SchedulerClient::Create(*address, client_security);
    if (!client.ok()) return fail(client.status());
    drain_client = *std::move(client);
  }
  // Asks whether a server that exited had been declared dead.
  auto status_client = SchedulerClient::Create(*address, client_security);
  std::unique_ptr<FaultInjector> injector;
  if (!faults.empty()) {
    auto client = SchedulerClient::Create(*address, client_security);
    if (!client.ok()) return fail(client.status());
    injector = std::make_unique<FaultInjector>(faults, *std::move(client), absl::Seconds(o.restart_after_s),
                                               restart_scheduler);
  }
  auto reports = [&dir, &node_security](int i) {
    std::vector<std::string> flags = {"--info-file", absl::StrCat(dir, "/server.", i), "--updates-file",
                                      absl::StrCat(dir, "/updates.", i)};
    flags.insert(flags.end(), node_security.begin(), node_security.end());
    return flags;
  };
  if (absl::Status s = SpawnServers(*address, o.servers, o.verbose, reports, daemons); !s.ok()) return fail(s);
  int spawned_servers = static_cast<int>(o.servers);
  std::set<int> rejoined;  // killed worker ranks started again (--replace)
  const auto start = std::chrono::steady_clock::now();
  auto spawn_worker = [&](int r) -> absl::StatusOr<ChildProcess> {
    std::vector<std::string> argv = {self, "train", "--scheduler", *address, "--rank", absl::StrCat(r), "--epochs",
                         absl::StrCat(o.epochs), "--batch-size", absl::StrCat(o.batch), "--seed", absl::StrCat(o.seed),
                         "--train-limit", absl::StrCat(o.train_limit), "--test-limit", absl::StrCat(o.test_limit),
                         "--max-steps", absl::StrCat(o.max_steps), "--hidden", o.hidden, "--devices-per-worker",
                         absl::StrCat(o.devices_per_worker), "--log-every",
                         absl::StrCat(r == 0 ? o.log_every : 0), "--result-file", absl::StrCat(dir, "/result.", r),
                         "--progress-file", r == 0 ? dir + "/progress.0" : "", "--slow-factor",
                         absl::StrCat(o.slow_factors.count(r) ? o.slow_factors.at(r) : 1.0), "--eval-every",
                         absl::StrCat(r == 0 ? o.eval_every : 0), verbose};
    if (o.no_overlap) argv.push_back("--no-overlap");
    argv.insert(argv.end(), node_security.begin(), node_security.end());
    return Spawn(absl::StrCat("worker ", r), argv, SpawnOptions::JobChild());
  };
  for (int r = 0; r < o.workers; ++r) {
    auto worker = spawn_worker(r);
    if (!worker.ok()) return fail(worker.status());
    workers.push_back(*worker);
  }
  // One more server process, numbered after those spawned so far (its report
  // files), named `why` in the launcher's messages.
  auto spawn_server = [&](const std::string& why) -> absl::Status {
    const int n = spawned_servers;
    auto numbered = [&](int) { return reports(n); };
    if (absl::Status s = SpawnServers(*address, 1, o.verbose, numbered, daemons); !s.ok()) return s;
    daemons.back().name = absl::StrCat("server ", n, " (", why, ")");
    ++spawned_servers;
    return absl::OkStatus();
  };
  // --add-server: one more server process when worker 0 reaches each step;
  // it registers while the job trains and joins it as one more server.
  size_t added = 0;
  auto add_servers = [&]() -> absl::Status {
    if (added == o.add_at.size()) return absl::OkStatus();
    const int64_t step = ReadProgress(dir + "/progress.0");
    for (; added < o.add_at.size() && step >= o.add_at[added]; ++added) {
      std::cerr << "shardps local: worker 0 reached step " << step << "; starting server process "
                << spawned_servers << " (it joins the running job)\n";
      if (absl::Status s = spawn_server(absl::StrCat("added at step ", o.add_at[added])); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  // --drain: when worker 0 reaches each step, the scheduler is asked to
  // drain a server; that process then stops by itself (exit 0), which the
  // loop below expects of it and no other daemon.
  size_t drains_asked = 0;
  std::map<size_t, std::pair<int64_t, absl::Time>> draining;  // daemons slot -> (server index, asked at)
  auto ask_drains = [&]() -> absl::Status {
    if (drains_asked == o.drain_at.size()) return absl::OkStatus();
    const int64_t step = ReadProgress(dir + "/progress.0");
    for (; drains_asked < o.drain_at.size() && step >= o.drain_at[drains_asked].first; ++drains_asked) {
      const int64_t index = o.drain_at[drains_asked].second;
      auto slot = ServerSlot(dir, spawned_servers, static_cast<int>(index));
      if (!slot.ok()) return slot.status();
      DrainRequest request;
      request.set_server(static_cast<uint32_t>(index));
      auto response = drain_client->Drain(request, absl::Seconds(10));
      if (!response.ok()) return response.status();
      std::cerr << "shardps local: worker 0 reached step " << step << "; server " << index
                << " drains from shard map epoch " << response->epoch() << " (" << response->copies()
                << " copies to move)\n";
      draining[*slot] = {index, absl::Now()};
    }
    return absl::OkStatus();
  };
  size_t replaced = 0;  // server and worker faults, in record order, that have a replacement
  // --replace: once the scheduler has declared a killed server dead, a new
  // server process (at a new address) registers and takes its place; a
  // killed worker's rank is started again and rejoins the running job.
  auto replace_dead_nodes = [&]() -> absl::Status {
    const std::vector<FaultRecord>& records = injector->records();
    for (; replaced < records.size(); ++replaced) {
      const FaultRecord& r = records[replaced];
      if (r.spec.role == FaultSpec::Role::kScheduler) continue;
      if (r.detected_seconds < 0) break;
      std::cerr << "shardps local: " << RoleName(r.spec.role) << " " << r.spec.index << " was declared dead "
                << r.detected_seconds << " s after its kill; starting a replacement\n";
      if (r.spec.role == FaultSpec::Role::kWorker) {
        auto worker = spawn_worker(r.spec.index);
        if (!worker.ok()) return worker.status();
        workers[r.spec.index] = *worker;
        workers[r.spec.index].name = absl::StrCat("worker ", r.spec.index, " (rejoining)");
        rejoined.insert(r.spec.index);
        continue;
      }
      if (absl::Status s = spawn_server(absl::StrCat("replacing server ", r.spec.index)); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(o.timeout_s);
  for (;;) {
    if (absl::Status s = add_servers(); !s.ok()) return fail(s);
    if (absl::Status s = ask_drains(); !s.ok()) return fail(s);
    if (injector != nullptr) {
      auto server_slot = [&](int index) { return ServerSlot(dir, spawned_servers, index); };
      if (absl::Status s = injector->Tick(ReadProgress(dir + "/progress.0"), {daemons, workers, server_slot});
          !s.ok()) {
        return fail(s);
      }
      if (o.replace) {
        if (absl::Status s = replace_dead_nodes(); !s.ok()) return fail(s);
      }
    }
    int code;
    const bool ticking = injector || added < o.add_at.size() || drains_asked < o.drain_at.size();
    auto w = WaitAny(workers, absl::Now() + absl::Milliseconds(ticking ? 20 : 100), &code);
    if (absl::IsNotFound(w.status())) break;  // every worker that was not killed has finished
    if (w.ok()) {
      if (code != 0) return fail(absl::InternalError(absl::StrCat(workers[*w].name, " ", DescribeExit(code))));
      continue;
    }
    auto d = WaitAny(daemons, absl::Now(), &code);
    if (d.ok() && code == 0 && draining.contains(*d)) {
      const auto [index, asked] = draining[*d];
      std::cerr << "shardps local: server " << index << " drained and stopped "
                << absl::ToDoubleSeconds(absl::Now() - asked) << " s after the request\n";
      draining.erase(*d);
      continue;
    }
    // A server exits 0 only once stopped: drained by `shardps drain`, or
    // SIGTERM from outside; it left the job, which goes on without it.
    if (d.ok() && code == 0 && *d > 0) {
      std::cerr << "shardps local: " << daemons[*d].name << " stopped cleanly (drained, or a SIGTERM from outside) "
                << "and left the job, which goes on without it\n";
      continue;
    }
    if (d.ok() && *d > 0 && status_client.ok() && DeclaredDeadServer(dir, *d, **status_client)) {
      std::cerr << "shardps local: " << daemons[*d].name << " " << DescribeExit(code)
                << " after the scheduler declared it dead (it said why above); the job goes on without it\n";
      continue;
    }
    if (d.ok()) return fail(absl::InternalError(absl::StrCat(daemons[*d].name, " ", DescribeExit(code),
                                                             " while workers were training")));
    if (absl::Now() > deadline) return fail(absl::DeadlineExceededError("training did not finish within --timeout"));
    if (StopRequested()) return fail(absl::CancelledError("interrupted"));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::string> drains_unfinished;  // asked while the scheduler still runs
  for (const auto& [slot, drain] : draining) {
    drains_unfinished.push_back(
        absl::StrCat("server ", drain.first, ": ", WhyNotDrained(*drain_client, drain.first, injector.get())));
  }
  // Every worker left: the scheduler takes the job for over and lets the
  // servers stop together. Where one was killed and not started again, it
  // was declared dead, may be started again for all the scheduler knows,
  // and a server stopped was failed over to the others, which were stopping
  // too: the later ones were promoted to copies still being re-created and
  // reported the partitions' final state lost (lost_updates 664 of a 3 x 3
  // job whose scheduler and worker 2 were killed). Then the scheduler is
  // stopped first, and each server reports the state training left it in.
  bool left_dead = false;
  for (int r = 0; r < o.workers; ++r) left_dead |= injector != nullptr && injector->WorkerKilled(r) && !rejoined.contains(r);
  std::vector<size_t> stop_order;
  if (left_dead) stop_order.push_back(0);
  for (size_t i = daemons.size(); i-- > (left_dead ? 1 : 0);) stop_order.push_back(i);
  for (size_t i : stop_order) {
    int code = Stop(daemons[i], absl::Seconds(10));
    if (code != 0) return fail(absl::InternalError(absl::StrCat(daemons[i].name, " ", DescribeExit(code),
                                                                " on SIGTERM (expected a clean exit)")));
  }
  Outcome out = CollectOutcome(dir, o, spawned_servers, config, injector.get(), rejoined);
  out.wall_seconds = wall;
  out.adds_never_happened.assign(o.add_at.begin() + added, o.add_at.end());
  out.drains_never_happened.assign(o.drain_at.begin() + drains_asked, o.drain_at.end());
  out.drains_unfinished = std::move(drains_unfinished);
  return out;
}

// The slowest recovery, as JSON (null when a fault was never recovered from,
// 0 when there was none).
std::string RecoverySeconds(const std::vector<FaultRecord>& records) {
  double worst = 0;
  for (const FaultRecord& r : records) {
    if (r.recovered_seconds < 0) return "null";
    worst = std::max(worst, r.recovered_seconds);
  }
  return absl::StrFormat("%.3f", worst);
}

}  // namespace

int LocalCommand(const Args& args) {
  LocalOptions o;
  CliFlags flags("local");
  flags.Int("servers", &o.servers, "server processes");
  flags.Int("workers", &o.workers, "worker (training) processes");
  flags.String("consistency", &o.consistency,
               "sync, ssp or async (overrides the config file; ssp's bound: --set staleness=S)");
  flags.Repeated("slow", &o.slow, "worker:R=F: worker R computes F times slower (sleeps), e.g. worker:1=3");
  flags.Int("epochs", &o.epochs, "training epochs");
  flags.String("config", &o.config_path, "cluster configuration file (protobuf text)");
  flags.Repeated("set", &o.sets, "override one config field, e.g. --set optimizer.learning_rate=0.1");
  flags.Bool("json", &o.json, "print one JSON object as the last line of stdout");
  flags.String("compression", &o.compression, "codec of pushed gradients, e.g. 2bit, topk:ratio=0.01");
  flags.String("hidden", &o.hidden, "hidden layer widths of the MLP, comma-separated");
  flags.Bool("no-overlap", &o.no_overlap,
             "workers push after the whole backward and await every answer before the next step (compare timing)");
  flags.Bool("reference", &o.reference, "run the same job in one process, without servers");
  flags.Bool("deterministic", &o.deterministic, "sync: sum gradients in rank order (bitwise reproducible)");
  flags.Int("batch-size", &o.batch, "images per step per worker");
  flags.Int("devices-per-worker", &o.devices_per_worker,
            "CPU devices (model replicas) per worker, each on batch-size / D images; gradients merged locally");
  flags.Int("seed", &o.seed, "seed of initial weights and data order");
  flags.Count("train-limit", &o.train_limit, "use only the first N training images (0 = all)");
  flags.Count("test-limit", &o.test_limit, "use only the first N test images (0 = all)");
  flags.Count("max-steps", &o.max_steps, "stop after N steps per worker (0 = no limit)");
  flags.Int("log-every", &o.log_every, "progress line every N steps");
  flags.Int("eval-every", &o.eval_every,
            "worker 0: test accuracy every N of its steps and of the final weights, one JSON line each on stderr "
            "(0 = none)");
  flags.Double("timeout", &o.timeout_s, "seconds before the run is abandoned");
  flags.Bool("verbose", &o.verbose, "log INFO messages of every process");
  flags.Bool("secure", &o.secure,
             "make fresh credentials (CA, certificates, token) and run with TLS + token on the control plane "
             "and sealed messages (AES-256-GCM) on the data plane");
  flags.Repeated("kill", &o.kills,
                 "ROLE[:INDEX]@STEP: SIGKILL the scheduler, server INDEX or worker INDEX when worker 0 reaches STEP "
                 "(@moving: as soon as the scheduler starts moving copies to a server that joined; @handoff: as "
                 "soon as it starts handing primaries off)");
  flags.String("checkpoint-dir", &o.checkpoint_dir, "write checkpoints here (config checkpoint.dir)");
  flags.Count("checkpoint-every", &o.checkpoint_every, "rounds between checkpoints (config checkpoint.every_rounds)");
  flags.String("resume", &o.resume, "restart from this checkpoint (directory or round directory) and train on");
  flags.Bool("replace", &o.replace,
             "once a killed server or worker is declared dead, start a new server (new address) in its place, or the "
             "worker's rank again (it rejoins the running job)");
  flags.Repeated("add-server", &o.add_servers,
                 "STEP: start one more server process when worker 0 reaches STEP; it joins the running job and "
                 "copies move to it (repeat for more)");
  flags.Repeated("drain", &o.drains,
                 "INDEX@STEP: ask the scheduler to drain server INDEX when worker 0 reaches STEP (as `shardps drain` "
                 "does: its copies move to the other servers, then it stops; repeat for more)");
  flags.Double("restart-after", &o.restart_after_s, "seconds after a scheduler kill to start a new one (same address)");
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::cerr << "shardps local: " << s.message() << "\n";
    return 2;
  }
  if (flags.help()) return 0;
  if (!(o.timeout_s > 0)) {  // would abandon the run as soon as it started
    std::cerr << "shardps local: --timeout " << o.timeout_s << " must be above 0 (seconds)\n";
    return 2;
  }
  if (!(o.restart_after_s >= 0)) {
    std::cerr << "shardps local: --restart-after " << o.restart_after_s << " is below 0 (seconds)\n";
    return 2;
  }
  // Named here: the config's own check would name num_servers/num_workers, which the user did not type.
  for (const auto& [name, count] : {std::pair<const char*, int64_t>{"servers", o.servers}, {"workers", o.workers}}) {
    if (count < 1) {
      std::cerr << "shardps local: --" << name << " " << count << " is below 1\n";
      return 2;
    }
  }
  if (absl::Status s = ParseSlowFlags(o); !s.ok()) {
    std::cerr << "shardps local: " << s.message() << "\n";
    return 2;
  }
  for (const std::string& step : o.add_servers) {
    int64_t at;
    if (!absl::SimpleAtoi(step, &at) || at < 1) {
      std::cerr << "shardps local: --add-server '" << step << "': expected a step of worker 0 (1 or more)\n";
      return 2;
    }
    o.add_at.push_back(at);
  }
  std::sort(o.add_at.begin(), o.add_at.end());
  for (const std::string& drain : o.drains) {
    std::pair<std::string, std::string> parts = absl::StrSplit(drain, absl::MaxSplits('@', 1));
    int64_t index, at;
    if (!absl::SimpleAtoi(parts.first, &index) || !absl::SimpleAtoi(parts.second, &at) || index < 0 ||
        index >= o.servers + static_cast<int64_t>(o.add_at.size()) || at < 1) {
      std::cerr << "shardps local: --drain '" << drain << "': expected INDEX@STEP, a server index below "
                << o.servers + o.add_at.size() << " and a step of worker 0 (1 or more)\n";
      return 2;
    }
    o.drain_at.emplace_back(at, index);
  }
  std::sort(o.drain_at.begin(), o.drain_at.end());
  if (o.servers + static_cast<int64_t>(o.add_at.size()) > kMaxServers) {
    std::cerr << "shardps local: --servers " << o.servers << " and " << o.add_at.size() << " --add-server exceed "
              << kMaxServers << " servers\n";
    return 2;
  }
  InitLogging("shardps-local", o.verbose);
  InstallStopSignals();
  auto config = BuildConfig(o);
  if (!config.ok()) {
    std::cerr << "shardps local: " << config.status().message() << "\n";
    return 2;
  }
  if (auto layers = ParseLayers(o.hidden); !layers.ok()) {
    std::cerr << "shardps local: --hidden: " << layers.status().message() << "\n";
    return 2;
  }
  {
    TrainOptions check;
    check.batch_size = static_cast<int>(std::clamp<int64_t>(o.batch, 0, 1 << 30));
    check.devices_per_worker = static_cast<int>(std::clamp<int64_t>(o.devices_per_worker, 0, 1025));
    check.epochs = static_cast<int>(std::clamp<int64_t>(o.epochs, -1, 1 << 30));
    if (absl::Status s = ValidateTrainOptions(check); !s.ok()) {
      std::cerr << "shardps local: " << s.message() << "\n";
      return 2;
    }
  }
  std::vector<FaultSpec> faults;
  for (const std::string& k : o.kills) {
    // Servers added with --add-server take the next indices.
    auto f = ParseFaultSpec(k, static_cast<int>(o.servers + o.add_at.size()), static_cast<int>(o.workers));
    if (!f.ok()) {
      std::cerr << "shardps local: " << f.status().message() << "\n";
      return 2;
    }
    faults.push_back(*f);
  }
  if ((!faults.empty() || !o.add_at.empty() || !o.drain_at.empty()) && o.reference) {
    std::cerr << "shardps local: --kill, --add-server and --drain need a cluster (not --reference)\n";
    return 2;
  }
  for (const FaultSpec& f : faults) {
    // The scheduler would refuse the new process only once the job is under
    // way: say so before anything starts.
    if (o.replace && f.role == FaultSpec::Role::kWorker && config->update_mode() == SUM_ONLY) {
      std::cerr << "shardps local: --replace cannot start worker " << f.index
                << " again: with update_mode sum_only (set by the compression recipe, or by --set) the weights and "
                << "optimizer state live on the workers, so a removed rank cannot rejoin; add --set "
                << "update_mode=UPDATE_ON_SERVER, or kill a server instead\n";
      return 2;
    }
  }
  if (o.eval_every != 0 && o.reference) {
    std::cerr << "shardps local: --eval-every needs a cluster (not --reference)\n";
    return 2;
  }
  std::map<std::string, double> result;
  std::vector<FaultRecord> fault_records;
  std::vector<FaultSpec> never_happened;
  std::vector<int64_t> adds_never_happened;
  std::vector<std::pair<int64_t, int64_t>> drains_never_happened;
  std::vector<std::string> drains_unfinished;
  std::string weights_sha256;
  std::string lost = "null", duplicates = "null";  // measured on a cluster only
  uint64_t pushed = 0, pulled = 0;
  int64_t samples = 0;
  StalenessSummary staleness;
  double wall = 0;
  if (o.reference) {
    TrainOptions t;
    t.epochs = o.epochs;
    t.batch_size = o.batch;
    t.devices_per_worker = static_cast<int>(o.devices_per_worker);
    t.seed = o.seed;
    t.train_limit = o.train_limit;
    t.test_limit = o.test_limit;
    t.max_steps = o.max_steps;
    t.log_every = o.log_every;
    auto layers = ParseLayers(o.hidden);
    if (!layers.ok()) {
      std::cerr << "shardps local: " << layers.status().message() << "\n";
      return 2;
    }
    t.layers = *layers;
    auto r = RunReference(*config, t, std::cerr);
    if (!r.ok()) {
      std::cerr << "shardps local --reference: " << r.status().message() << "\n";
      return 1;
    }
    result = {{"test_accuracy", r->test_accuracy}, {"steps", double(r->steps)}, {"final_loss", r->final_loss}};
    samples = r->samples;
    wall = r->wall_seconds;
    weights_sha256 = WeightsSha256(r->params);
  } else {
    auto outcome = RunCluster(o, *config, faults);
    if (!outcome.ok()) {
      std::cerr << "shardps local: " << outcome.status().message() << "\n";
      return 1;
    }
    result = outcome->rank0;
    pushed = outcome->bytes_pushed;
    pulled = outcome->bytes_pulled;
    samples = outcome->samples;
    wall = outcome->wall_seconds;
    fault_records = outcome->faults;
    never_happened = outcome->never_happened;
    adds_never_happened = outcome->adds_never_happened;
    drains_never_happened = outcome->drains_never_happened;
    drains_unfinished = outcome->drains_unfinished;
    weights_sha256 = outcome->weights_sha256;
    lost = absl::StrCat(outcome->updates.lost);
    duplicates = absl::StrCat(outcome->updates.duplicates);
    staleness = outcome->staleness;
  }
  const std::string consistency = o.reference ? "reference" : ConsistencyName(config->consistency());
  std::cout << absl::StrFormat(
      "test accuracy %.4f after %d epochs (%s, %d servers x %d workers x %d devices) in %.1f s\n",
      result["test_accuracy"], o.epochs, consistency, o.reference ? 0 : o.servers, o.workers, o.devices_per_worker,
      wall);
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"test_accuracy\": %.6f, \"consistency\": \"%s\", \"servers\": %d, \"workers\": %d, \"epochs\": %d, "
        "\"steps\": %d, \"wall_seconds\": %.3f, \"samples_per_second\": %.1f, \"bytes_pushed\": %d, "
        "\"bytes_pulled\": %d, \"final_loss\": %.6f, \"deterministic\": %s, \"devices_per_worker\": %d, "
        "\"faults\": %s, \"recovery_seconds\": %s, \"lost_updates\": %s, \"duplicate_updates\": %s, "
        "\"weights_sha256\": \"%s\", \"staleness_mean\": %.4f, \"staleness_max\": %.4f, \"secure\": %s}\n",
        result["test_accuracy"], consistency, o.reference ? 0 : o.servers, o.workers, o.epochs,
        static_cast<int64_t>(result["steps"]), wall, wall > 0 ? samples / wall : 0.0, pushed, pulled,
        result["final_loss"], config->deterministic() ? "true" : "false", o.devices_per_worker,
        FaultsJson(fault_records), RecoverySeconds(fault_records), lost, duplicates, weights_sha256,
        staleness.gradients > 0 ? staleness.sum / staleness.gradients : 0.0, staleness.max,
        (o.secure || config->security().enabled()) && !o.reference ? "true" : "false");
  }
  // A run asked to survive a fault that never came measured nothing of it.
  for (const FaultSpec& f : never_happened) {
    std::cerr << "shardps local: --kill " << FaultSpecName(f) << " never happened: "
              << (f.when == FaultSpec::When::kAtStep
                      ? absl::StrCat("worker 0 ended at step ", static_cast<int64_t>(result["steps"]))
                      : absl::StrCat("the scheduler started no ",
                                     f.when == FaultSpec::When::kWhileMoving ? "copy moves" : "primary hand-offs",
                                     " before the job ended (they follow a server that joins, e.g. with --replace, "
                                     "when the copies need balancing)"))
              << "\n";
  }
  for (int64_t step : adds_never_happened) {
    std::cerr << "shardps local: --add-server " << step << " never happened: worker 0 ended at step "
              << static_cast<int64_t>(result["steps"]) << "\n";
  }
  for (const auto& [step, index] : drains_never_happened) {
    std::cerr << "shardps local: --drain " << index << "@" << step << " never happened: worker 0 ended at step "
              << static_cast<int64_t>(result["steps"]) << "\n";
  }
  for (const std::string& why : drains_unfinished) std::cerr << "shardps local: a drain did not finish: " << why << "\n";
  return never_happened.empty() && adds_never_happened.empty() && drains_never_happened.empty() &&
                 drains_unfinished.empty()
             ? 0
             : 1;
}

}  // namespace shardps
