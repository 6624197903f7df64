// `shardps flood`: W workers push valid async updates of a large tensor as
// fast as they can into one server while its resident memory is sampled
// every second and one more worker keeps push-pulling a small tensor. Passes
// when the server's RSS never exceeds the bound and the probe worker got
// every answer (docs/performance.md, "Flood").
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/tensor_spec.h"
#include "scheduler/model_limits.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/local_cluster.h"
#include "tools/process.h"
#include "worker/worker.h"

namespace shardps {
namespace {

struct FloodOptions {
  int64_t workers = 8;
  int64_t bytes = 64 << 20;  // per push
  int64_t seconds = 20;
  int64_t in_flight = 2;     // pushes each flooding worker keeps outstanding
  int64_t rss_limit_mib = 0;  // 0: the bound the config implies (FloodBound)
  bool json = false;
  std::vector<std::string> sets;
};

struct FloodResult {
  std::atomic<uint64_t> pushes{0}, refused{0}, probe_round_trips{0}, probe_errors{0};
  std::atomic<int64_t> probe_max_us{0};
  uint64_t max_rss = 0, samples = 0;
  std::string first_error;
  absl::Mutex mu;
};

// What the server may hold at most: its partitions (weights, optimizer
// state, accumulator), per connection the received messages its high-water
// mark admits plus one being read and the unread answers, and 128 MiB for
// the process itself (code, libraries, ZeroMQ and gRPC threads).
uint64_t FloodBound(const ClusterConfig& c, uint64_t model_bytes) {
  const ResourceLimits& l = c.limits();
  const uint64_t connections = c.num_workers();
  const uint64_t state = model_bytes / sizeof(float) * ServerBytesPerElement(c);
  const uint64_t queued = connections * ((l.socket_receive_hwm() + 1) * c.partition_bytes() +
                                         l.max_inflight_bytes_per_worker());
  return (uint64_t{128} << 20) + state + queued;
}

void Flooder(Worker& w, const FloodOptions& o, const std::atomic<bool>& stop, FloodResult& r) {
  const std::vector<float> gradient(o.bytes / sizeof(float), 1e-3f);
  std::deque<Worker::Handle> outstanding;
  auto finish_one = [&] {
    absl::Status s = w.Wait(outstanding.front(), absl::Seconds(60));
    outstanding.pop_front();
    if (s.ok()) {
      ++r.pushes;
    } else {
      ++r.refused;
      absl::MutexLock lock(&r.mu);
      if (r.first_error.empty()) r.first_error = std::string(s.message());
    }
  };
  while (!stop.load()) {
    auto h = w.Push("flood", gradient);
    if (!h.ok()) break;
    outstanding.push_back(*h);
    if (static_cast<int64_t>(outstanding.size()) >= o.in_flight) finish_one();
  }
  while (!outstanding.empty()) finish_one();
}

void Probe(Worker& w, const std::atomic<bool>& stop, FloodResult& r) {
  std::vector<float> gradient(256, 0.0f), weights(256);
  while (!stop.load()) {
    const auto start = std::chrono::steady_clock::now();
    auto h = w.PushPull("probe", gradient, absl::MakeSpan(weights));
    absl::Status s = h.ok() ? w.Wait(*h, absl::Seconds(30)) : h.status();
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start)
                           .count();
    if (!s.ok()) {
      ++r.probe_errors;
      absl::MutexLock lock(&r.mu);
      if (r.first_error.empty()) r.first_error = absl::StrCat("probe: ", s.message());
      continue;
    }
    ++r.probe_round_trips;
    int64_t seen = r.probe_max_us.load();
    while (us > seen && !r.probe_max_us.compare_exchange_weak(seen, us)) {
    }
  }
}

// The flags' own errors: a usage error (exit 2) before anything starts.
absl::Status CheckFloodFlags(const FloodOptions& o) {
  if (o.workers < 1 || o.bytes < 4 || o.bytes % 4 != 0 || o.seconds < 1 || o.in_flight < 1) {
    return absl::InvalidArgumentError("--workers, --seconds and --in-flight must be >= 1, --bytes a multiple of 4");
  }
  ClusterConfig scratch;  // a --set that cannot apply, before anything starts
  return ApplyConfigSets(o.sets, &scratch);
}

absl::Status RunFlood(const FloodOptions& o) {
  auto config = LoadLocalConfig("", 1, o.workers + 1);
  if (!config.ok()) return config.status();
  config->set_consistency(ASYNC);
  config->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  config->mutable_optimizer()->set_learning_rate(1e-6f);
  config->mutable_limits()->set_max_inflight_bytes_per_worker(16 << 20);
  if (absl::Status s = FinishLocalConfig(o.sets, &*config); !s.ok()) return s;
  const uint64_t bound = o.rss_limit_mib > 0 ? static_cast<uint64_t>(o.rss_limit_mib) << 20
                                             : FloodBound(*config, o.bytes + 256 * sizeof(float));
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("shardps-flood-", getpid());
  std::filesystem::remove_all(dir);  // left by a killed process with this pid: its address files are stale
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cluster.pbtxt") << config->DebugString();
  std::vector<ChildProcess> daemons;
  auto stop_all = [&] {
    for (ChildProcess& d : daemons) Stop(d, absl::Seconds(5));
    std::filesystem::remove_all(dir);
  };
  auto scheduler = SpawnScheduler("127.0.0.1:0", dir + "/cluster.pbtxt", dir + "/scheduler.addr", false);
  if (!scheduler.ok()) return scheduler.status();
  daemons.push_back(*scheduler);
  auto address = WaitForAddressFile(dir + "/scheduler.addr", daemons, absl::Now() + absl::Seconds(30));
  absl::Status started = address.ok() ? SpawnServers(*address, 1, false, nullptr, daemons) : address.status();
  if (!started.ok()) {
    stop_all();
    return started;
  }
  const pid_t server = daemons.back().pid;

  std::vector<std::unique_ptr<Worker>> workers(o.workers + 1);
  std::vector<absl::Status> created(o.workers + 1);
  {
    std::vector<std::thread> threads;
    for (int64_t i = 0; i <= o.workers; ++i) {
      threads.emplace_back([&, i] {
        auto w = Worker::Create({.scheduler_address = *address, .rank = static_cast<uint32_t>(i)});
        if (!w.ok()) {
          created[i] = w.status();
          return;
        }
        workers[i] = *std::move(w);
        created[i] = workers[i]->DefineTensors({Float32Tensor("flood", o.bytes / 4), Float32Tensor("probe", 256)});
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const absl::Status& s : created) {
    if (!s.ok()) {
      stop_all();
      return s;
    }
  }

  FloodResult r;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < o.workers; ++i) threads.emplace_back([&, i] { Flooder(*workers[i], o, stop, r); });
  threads.emplace_back([&] { Probe(*workers[o.workers], stop, r); });
  std::vector<uint64_t> rss;
  for (int64_t s = 0; s < o.seconds && !StopRequested(); ++s) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    rss.push_back(ResidentBytes(server));
    r.max_rss = std::max(r.max_rss, rss.back());
    if (!o.json) std::cerr << absl::StrFormat("t=%2ds server rss %.0f MiB\n", s + 1, rss.back() / 1048576.0);
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  workers.clear();
  stop_all();

  const bool pass = r.max_rss <= bound && r.probe_errors.load() == 0 && r.probe_round_trips.load() > 0;
  const double mib = 1048576.0;
  if (o.json) {
    std::string samples;
    for (uint64_t b : rss) absl::StrAppend(&samples, samples.empty() ? "" : ",", absl::StrFormat("%.1f", b / mib));
    std::cout << absl::StrFormat(
        "{\"workers\":%d,\"push_bytes\":%d,\"seconds\":%d,\"rss_bound_mib\":%.1f,\"max_rss_mib\":%.1f,"
        "\"rss_mib\":[%s],\"pushes\":%d,\"push_gib_per_s\":%.3f,\"refused\":%d,\"probe_round_trips\":%d,"
        "\"probe_max_ms\":%.1f,\"probe_errors\":%d,\"pass\":%s}\n",
        o.workers, o.bytes, o.seconds, bound / mib, r.max_rss / mib, samples, r.pushes.load(),
        r.pushes.load() * double(o.bytes) / (1 << 30) / o.seconds, r.refused.load(), r.probe_round_trips.load(),
        r.probe_max_us.load() / 1000.0, r.probe_errors.load(), pass ? "true" : "false");
  } else {
    std::cout << absl::StrFormat(
        "flood: %d workers x %d MiB async pushes for %d s: %d applied (%.2f GiB/s), %d refused\n"
        "server rss: max %.0f MiB, bound %.0f MiB; probe worker: %d round trips, slowest %.1f ms, %d errors: %s\n",
        o.workers, o.bytes >> 20, o.seconds, r.pushes.load(), r.pushes.load() * double(o.bytes) / (1 << 30) / o.seconds,
        r.refused.load(), r.max_rss / mib, bound / mib, r.probe_round_trips.load(), r.probe_max_us.load() / 1000.0,
        r.probe_errors.load(), pass ? "PASS" : "FAIL");
  }
  if (!r.first_error.empty()) std::cerr << "shardps flood: first error: " << r.first_error << "\n";
  if (!pass) return absl::ResourceExhaustedError("the server's memory exceeded the bound or the probe worker failed");
  return absl::OkStatus();
}

}  // namespace

int FloodCommand(const Args& args) {
  FloodOptions o;
  CliFlags flags("flood");
  flags.Int("workers", &o.workers, "flooding workers (threads of this process), plus one probe worker");
  flags.Int("bytes", &o.bytes, "bytes of each async push (the flooded tensor's size)");
  flags.Int("seconds", &o.seconds, "how long to flood; the server's RSS is sampled every second");
  flags.Int("in-flight", &o.in_flight, "pushes each flooding worker keeps outstanding");
  flags.Int("rss-limit-mib", &o.rss_limit_mib, "the bound on the server's RSS (0: what the config's limits imply)");
  flags.Bool("json", &o.json, "print one JSON object");
  flags.Repeated("set", &o.sets, "override one config field, e.g. --set limits.socket_receive_hwm=16");
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::cerr << "shardps flood: " << s.message() << "\n";
    return 2;
  }
  if (flags.help()) return 0;
  if (absl::Status s = CheckFloodFlags(o); !s.ok()) {
    std::cerr << "shardps flood: " << s.message() << "\n";
    return 2;
  }
  InitLogging("shardps-flood", false);
  if (absl::Status s = RunFlood(o); !s.ok()) {
    std::cerr << "shardps flood: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace shardps
