// `shardps bench`: push/pull round trips of one tensor against real server
// processes, next to a raw ZeroMQ DEALER/ROUTER echo of the same messages to
// the same number of echo processes, measured in the same run. With
// --scheduler it is instead a client of a cluster started elsewhere (the
// fake hosts of tools/scalebench.sh) and measures only ShardPS.
#include <algorithm>
#include <functional>
#include <memory>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <unistd.h>
#include <zmq.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/tensor_spec.h"
#include "common/config.h"
#include "common/data_message.h"
#include "common/logging.h"
#include "common/scheduler_client.h"
#include "scheduler/shard_assignment.h"
#include "tools/cli_flags.h"
#include "tools/local_cluster.h"
#include "tools/cluster_credentials.h"
#include "tools/commands.h"
#include "common/durable_file.h"
#include "tools/process.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  int64_t servers = 1, workers = 1, bytes = 4 << 20, iters = 200, warmup = 20, partition_bytes = 1 << 20;
  std::string op = "pushpull", consistency = "sync";
  std::vector<std::string> sets;  // config overrides, e.g. replication=1
  bool json = false;
  // HOST:PORT: server i serves /metrics on PORT + i (PORT 0: any free port).
  std::string metrics_listen;
  // Measure a cluster with server metrics against one without, instead of
  // against raw ZeroMQ.
  bool metrics_compare = false;
  // Measure a cluster with both planes secured against a plain one.
  bool secure = false;
  // With `secure`: how the servers protect their data sockets
  // (security.data_cipher: aes-256-gcm or curve; empty: aes-256-gcm).
  std::string data_cipher;
  // HOST:PORT of a running scheduler: no processes are started, the workers
  // are ranks rank .. rank + workers - 1 of that cluster, no raw baseline.
  std::string scheduler;
  int64_t rank = 0;
  // Comma-separated tensor sizes in bytes, pushed and pulled together in each
  // round trip; empty: one tensor of `bytes`.
  std::string tensor_bytes;
};

// The tensors of one round trip: `tensor_bytes` parsed, or one of `bytes`.
absl::StatusOr<std::vector<TensorSpec>> BenchTensors(const BenchOptions& o) {
  if (o.tensor_bytes.empty()) return std::vector<TensorSpec>{Float32Tensor("bench", o.bytes / 4)};
  std::vector<TensorSpec> tensors;
  for (absl::string_view part : absl::StrSplit(o.tensor_bytes, ',')) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 4 || b % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tensor-bytes: '", std::string(part), "' is not a positive multiple of 4"));
    }
    tensors.push_back(Float32Tensor(absl::StrCat("bench", tensors.size()), b / 4));
  }
  return tensors;
}

// The --metrics-listen of server `i` of a bench started with `listen`.
absl::StatusOr<std::string> ServerMetricsListen(const std::string& listen, int i) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen '", listen, "' is not HOST:PORT"));
  }
  return absl::StrCat(listen.substr(0, colon), ":", port == 0 ? 0 : port + i);
}

struct Measured {
  std::vector<double> latencies_us;  // one per round trip, all clients
  double seconds = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// Runs `clients` threads of `iters` round trips each; `round_trip(client)`
// performs one and returns its status.
template <typename F>
absl::StatusOr<Measured> RunClients(int clients, int64_t iters, int64_t warmup, F round_trip) {
  Measured m;
  std::vector<std::vector<double>> lat(clients);
  std::vector<absl::Status> status(clients);
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int64_t i = 0; i < warmup + iters && status[c].ok(); ++i) {
        auto t0 = Clock::now();
        status[c] = round_trip(c);
        if (i >= warmup) lat[c].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (i + 1 == warmup && c == 0) start = Clock::now();
      }
    });
  }
  for (auto& t : threads) t.join();
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int c = 0; c < clients; ++c) {
    if (!status[c].ok()) return status[c];
    m.latencies_us.insert(m.latencies_us.end(), lat[c].begin(), lat[c].end());
  }
  return m;
}

// Measures `iters` round trips per client after `warmup` unmeasured ones.
using MeasureFn = std::function<absl::StatusOr<Measured>(int64_t iters, int64_t warmup)>;

// The limit: each round trip sends every partition to its echo process and
// copies every echoed partition into an output buffer, as a worker does. It
// scales the way the cluster does: one echo process per server (one I/O
// thread and one loop each, as a server has), partitions placed by the same
// shard map, and one ZeroMQ context per client.
MeasureFn RawEcho(const BenchOptions& o, const ShardMap& map, const std::vector<std::string>& echo) {
  // One context (one I/O thread) per client, as each Worker's DataChannel has:
  // a shared one would funnel every client through one I/O thread and make
  // the baseline, not the servers, the limit at many workers.
  struct State {
    std::vector<zmq::context_t> contexts;
    std::vector<std::vector<zmq::socket_t>> sockets;
    std::vector<std::vector<float>> in, out;
  };
  auto st = std::make_shared<State>();
  const size_t n = o.bytes / 4;
  st->contexts.resize(o.workers);
  st->sockets.resize(o.workers);
  for (int c = 0; c < o.workers; ++c) {
    for (const std::string& address : echo) {
      st->sockets[c].emplace_back(st->contexts[c], zmq::socket_type::dealer);
      st->sockets[c].back().set(zmq::sockopt::sndhwm, 0);
      st->sockets[c].back().set(zmq::sockopt::rcvhwm, 0);
      st->sockets[c].back().connect(address);
    }
  }
  st->in.assign(o.workers, std::vector<float>(n, 1.0f));
  st->out.assign(o.workers, std::vector<float>(n));
  const int clients = o.workers;
  return [st, map, clients](int64_t iters, int64_t warmup) {
    return RunClients(clients, iters, warmup, [&](int c) -> absl::Status {
      auto& sockets = st->sockets[c];
      for (const PartitionInfo& p : map.partitions()) {
        // A 16-byte header (offset, count) stands in for our protobuf header.
        const uint64_t where[2] = {p.offset(), p.num_elements()};
        zmq::message_t header(where, sizeof(where));
        sockets[p.server()].send(header, zmq::send_flags::sndmore);
        sockets[p.server()].send(
            zmq::message_t(st->in[c].data() + p.offset(), p.num_elements() * 4, nullptr, nullptr),
            zmq::send_flags::none);
      }
      std::vector<zmq::pollitem_t> items;
      for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
      for (int left = map.partitions_size(); left > 0;) {
        if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(10000)) == 0) {
          return absl::DeadlineExceededError("raw echo: no answer within 10 s");
        }
        for (size_t s = 0; s < items.size(); ++s) {
          zmq::message_t header, payload;
          while (sockets[s].recv(header, zmq::recv_flags::dontwait)) {
            (void)sockets[s].recv(payload);
            uint64_t where[2];
            std::memcpy(where, header.data(), sizeof(where));
            std::memcpy(st->out[c].data() + where[0], payload.data(), where[1] * 4);
            --left;
          }
        }
      }
      return absl::OkStatus();
    });
  };
}

absl::StatusOr<MeasureFn> Ours(const BenchOptions& o, const std::string& scheduler,
                               const SecurityCredentials& security = {}) {
  auto tensors = BenchTensors(o);
  if (!tensors.ok()) return tensors.status();
  std::vector<std::unique_ptr<Worker>> workers(o.workers);
  std::vector<absl::Status> created(o.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < o.workers; ++r) {
    threads.emplace_back([&, r] {
      auto w = Worker::Create(
          {.scheduler_address = scheduler, .rank = static_cast<uint32_t>(o.rank + r), .security = security});
      if (!w.ok()) {
        created[r] = w.status();
        return;
      }
      created[r] = (*w)->DefineTensors(*tensors);
      workers[r] = *std::move(w);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : created) {
    if (!s.ok()) return s;
  }
  struct State {
    std::vector<std::unique_ptr<Worker>> workers;
    std::vector<std::string> names;
    std::vector<std::vector<std::vector<float>>> grad, weights;  // [client][tensor]
  };
  auto st = std::make_shared<State>();
  st->workers = std::move(workers);
  st->grad.resize(o.workers);
  st->weights.resize(o.workers);
  for (const TensorSpec& t : *tensors) {
    const size_t n = static_cast<size_t>(t.shape(0));
    st->names.push_back(t.name());
    for (int c = 0; c < o.workers; ++c) {
      st->grad[c].emplace_back(n, 1e-6f);
      st->weights[c].emplace_back(n);
    }
  }
  const bool pushpull = o.op == "pushpull";
  const int clients = o.workers;
  return MeasureFn([st, pushpull, clients](int64_t iters, int64_t warmup) {
    const absl::Duration timeout = absl::Seconds(60);
    return RunClients(clients, iters, warmup, [&](int c) -> absl::Status {
      Worker& w = *st->workers[c];
      std::vector<Worker::Handle> handles;
      auto wait_all = [&]() -> absl::Status {
        for (Worker::Handle h : handles) {
          if (absl::Status s = w.Wait(h, timeout); !s.ok()) return s;
        }
        handles.clear();
        return absl::OkStatus();
      };
      for (size_t t = 0; t < st->names.size(); ++t) {
        auto h = pushpull ? w.PushPull(st->names[t], st->grad[c][t], absl::MakeSpan(st->weights[c][t]))
                          : w.Push(st->names[t], st->grad[c][t]);
        if (!h.ok()) return h.status();
        handles.push_back(*h);
      }
      if (absl::Status s = wait_all(); !s.ok() || pushpull) return s;
      for (size_t t = 0; t < st->names.size(); ++t) {
        auto h = w.Pull(st->names[t], absl::MakeSpan(st->weights[c][t]));
        if (!h.ok()) return h.status();
        handles.push_back(*h);
      }
      return wait_all();
    });
  });
}

// Alternates blocks of the two measurements so that load changes on a shared
// machine hit both alike; returns {ours, raw} over all blocks.
absl::StatusOr<std::pair<Measured, Measured>> Interleaved(const BenchOptions& o, MeasureFn& ours, MeasureFn& raw) {
  constexpr int kBlocks = 5;
  std::pair<Measured, Measured> total;
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t iters = (o.iters + kBlocks - 1) / kBlocks;
    const int64_t warmup = b == 0 ? o.warmup : 0;
    for (auto [fn, into] : {std::pair{&ours, &total.first}, std::pair{&raw, &total.second}}) {
      auto m = (*fn)(iters, warmup);
      if (!m.ok()) return m.status();
      into->seconds += m->seconds;
      into->latencies_us.insert(into->latencies_us.end(), m->latencies_us.begin(), m->latencies_us.end());
    }
  }
  return total;
}

// What a comparison of two clusters calls its sides and its JSON keys.
struct Comparison {
  std::string what;             // e.g. "server metrics off and on"
  std::string off, on;          // row labels
  std::string off_key, on_key;  // JSON key prefixes of each side's figures
  std::string goodput_key, latency_key;
};

// The same round trips against two clusters ("off" and "on"), measured in
// alternating blocks: round trips/s and p50 of each, and on over off.
void ReportComparison(const BenchOptions& o, const Comparison& c, const Measured& off, const Measured& on) {
  const double off_rt_s = off.latencies_us.size() / off.seconds, on_rt_s = on.latencies_us.size() / on.seconds;
  const double off_p50 = Percentile(off.latencies_us, 0.5), on_p50 = Percentile(on.latencies_us, 0.5);
  std::cout << absl::StrFormat(
      "bench %s: %d bytes, %d servers, %d workers, %d round trips each, %s\n"
      "  %-11s: %9.0f round trips/s, p50 %8.1f us\n"
      "  %-11s: %9.0f round trips/s, p50 %8.1f us\n"
      "  on / off   : round trips %.3f, latency %.3f\n",
      o.op, o.bytes, o.servers, o.workers, o.iters, c.what, c.off, off_rt_s, off_p50, c.on, on_rt_s, on_p50,
      on_rt_s / off_rt_s, on_p50 / off_p50);
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"op\": \"%s\", \"bytes\": %d, \"servers\": %d, \"workers\": %d, \"iters\": %d, "
        "\"%s_round_trips_per_s\": %.1f, \"%s_round_trips_per_s\": %.1f, "
        "\"%s_p50_us\": %.1f, \"%s_p50_us\": %.1f, \"%s\": %.4f, \"%s\": %.4f}\n",
        o.op, o.bytes, o.servers, o.workers, o.iters, c.off_key, off_rt_s, c.on_key, on_rt_s, c.off_key, off_p50,
        c.on_key, on_p50, c.goodput_key, on_rt_s / off_rt_s, c.latency_key, on_p50 / off_p50);
  }
}

// --scheduler: round trips against a cluster started elsewhere; no baseline
// here (tools/scalebench.sh compares against linear in the servers).
absl::Status RunAgainstCluster(const BenchOptions& o) {
  auto tensors = BenchTensors(o);
  if (!tensors.ok()) return tensors.status();
  int64_t bytes = 0;
  for (const TensorSpec& t : *tensors) bytes += t.shape(0) * 4;
  auto ours = Ours(o, o.scheduler);
  if (!ours.ok()) return ours.status();
  auto m = (*ours)(o.iters, o.warmup);
  if (!m.ok()) return m.status();
  const double rt_s = m->latencies_us.size() / m->seconds, gbps = rt_s * bytes / 1e9;
  const double p50 = Percentile(m->latencies_us, 0.5), p99 = Percentile(m->latencies_us, 0.99);
  std::cout << absl::StrFormat(
      "bench %s against %s: %d bytes in %d tensors, workers %d..%d, %d round trips each\n"
      "  shardps : %8.3f GB/s pushed, %8.3f GB/s pulled, %9.2f round trips/s, p50 %8.1f us, p99 %8.1f us\n",
      o.op, o.scheduler, bytes, tensors->size(), o.rank, o.rank + o.workers - 1, o.iters, gbps, gbps, rt_s, p50, p99);
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"op\": \"%s\", \"bytes\": %d, \"tensors\": %d, \"rank\": %d, \"workers\": %d, \"iters\": %d, "
        "\"seconds\": %.4f, \"push_gbps\": %.4f, \"pull_gbps\": %.4f, \"round_trips_per_s\": %.3f, "
        "\"p50_us\": %.1f, \"p99_us\": %.1f}\n",
        o.op, bytes, tensors->size(), o.rank, o.workers, o.iters, m->seconds, gbps, gbps, rt_s, p50, p99);
  }
  return absl::OkStatus();
}

// The flags' own errors: a usage error (exit 2) before anything starts.
absl::Status CheckBenchFlags(const BenchOptions& o) {
  if (o.op != "pushpull" && o.op != "push-then-pull") {
    return absl::InvalidArgumentError(absl::StrCat("--op '", o.op, "': allowed: pushpull, push-then-pull"));
  }
  if (o.bytes < 4 || o.bytes % 4 != 0) return absl::InvalidArgumentError("--bytes must be a positive multiple of 4");
  if (o.servers < 1 || o.workers < 1 || o.iters < 1) return absl::InvalidArgumentError("--servers, --workers, --iters must be >= 1");
  if (o.rank < 0) return absl::InvalidArgumentError("--rank must be >= 0");
  // Without --secure it would be ignored, and the plain comparison taken for a secured one.
  if (!o.data_cipher.empty() && !o.secure) return absl::InvalidArgumentError("--data-cipher needs --secure");
  if (!o.data_cipher.empty() && o.data_cipher != "aes-256-gcm" && o.data_cipher != "curve") {
    return absl::InvalidArgumentError(absl::StrCat("--data-cipher '", o.data_cipher, "': say aes-256-gcm or curve"));
  }
  if (!o.scheduler.empty()) {
    if (absl::Status s = CheckSchedulerAddress(o.scheduler); !s.ok()) return s;
  }
  if (o.scheduler.empty() && (!o.tensor_bytes.empty() || o.rank != 0)) {
    return absl::InvalidArgumentError("--tensor-bytes and --rank need --scheduler (the raw baseline is one tensor)");
  }
  ClusterConfig scratch;  // a --set that cannot apply, before anything starts
  if (absl::Status s = ApplyConfigSets(o.sets, &scratch); !s.ok()) return s;
  return BenchTensors(o).status();
}

absl::Status RunBench(const BenchOptions& o) {
  if (!o.scheduler.empty()) return RunAgainstCluster(o);
  ClusterConfig config;
  config.set_num_servers(o.servers);
  config.set_num_workers(o.workers);
  config.set_partition_bytes(o.partition_bytes);
  if (absl::Status s = SetConfigField(&config, "consistency=" + o.consistency); !s.ok()) return s;
  config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  config.mutable_optimizer()->set_learning_rate(1e-3f);
  if (absl::Status s = ApplyConfigSets(o.sets, &config); !s.ok()) return s;
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;

  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("shardps-bench-", getpid());
  std::filesystem::remove_all(dir);  // left by a killed process with this pid: its address files are stale
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cluster.pbtxt") << config.DebugString();
  const std::string self = SelfExecutable();
  std::vector<ChildProcess> children;
  struct Cleanup {
    std::vector<ChildProcess>& children;
    std::string dir;
    ~Cleanup() {
      for (size_t i = children.size(); i-- > 0;) Stop(children[i], absl::Seconds(5));
      std::filesystem::remove_all(dir);
    }
  } cleanup{children, dir};
  auto spawn = [&](const std::string& name, std::vector<std::string> argv) -> absl::Status {
    auto child = Spawn(name, argv, SpawnOptions::JobChild());  // a SIGKILLed bench leaves no server behind
    if (!child.ok()) return child.status();
    children.push_back(*child);
    return absl::OkStatus();
  };
  // Raw echo processes first, measured before the cluster exists.
  std::vector<std::string> echo;
  for (int i = 0; i < o.servers; ++i) {
    std::string file = absl::StrCat(dir, "/echo.", i);
    if (absl::Status s = spawn(absl::StrCat("echo ", i), {self, "echo-server", "--port-file", file}); !s.ok()) return s;
    auto address = WaitForAddressFile(file, children, absl::Now() + absl::Seconds(30));
    if (!address.ok()) return address.status();
    echo.push_back(*address);
  }
  std::vector<ServerInfo> servers(o.servers);
  for (int i = 0; i < o.servers; ++i) servers[i].set_index(i);
  auto map = BuildShardMap({Float32Tensor("bench", static_cast<int64_t>(o.bytes / 4))}, servers, o.partition_bytes, 1);
  if (!map.ok()) return map.status();
  MeasureFn raw = RawEcho(o, *map, echo);

  // A scheduler and its servers; `tag` keeps a second cluster's files apart.
  // With `credentials`, every process gets the matching --security-config.
  auto start_cluster = [&](const std::string& tag, const std::string& metrics_listen,
                           const ClusterCredentialFiles* credentials = nullptr) -> absl::StatusOr<std::string> {
    const std::string addr_file = absl::StrCat(dir, "/", tag, "scheduler.addr");
    std::vector<std::string> scheduler_argv = {self, "scheduler", "--listen", "127.0.0.1:0", "--config",
                                               dir + "/cluster.pbtxt", "--port-file", addr_file};
    if (credentials) scheduler_argv.insert(scheduler_argv.end(), {"--security-config", credentials->scheduler_config});
    if (absl::Status s = spawn(tag + "scheduler", scheduler_argv); !s.ok()) return s;
    auto scheduler = WaitForAddressFile(addr_file, children, absl::Now() + absl::Seconds(30));
    if (!scheduler.ok()) return scheduler.status();
    for (int i = 0; i < o.servers; ++i) {
      std::vector<std::string> argv = {self, "server", "--scheduler", *scheduler, "--listen", "tcp://127.0.0.1:0"};
      if (credentials) argv.insert(argv.end(), {"--security-config", credentials->node_config});
      if (metrics_listen.empty()) {
        if (absl::Status s = spawn(absl::StrCat(tag, "server ", i), argv); !s.ok()) return s;
        continue;
      }
      auto listen = ServerMetricsListen(metrics_listen, i);
      if (!listen.ok()) return listen.status();
      // Server i on PORT + i: the scheduler numbers servers as they
      // register, so each is registered before the next starts.
      const std::string info_file = absl::StrCat(dir, "/", tag, "server.", i, ".info");
      argv.insert(argv.end(), {"--metrics-listen", *listen, "--info-file", info_file});
      if (absl::Status s = spawn(absl::StrCat(tag, "server ", i), argv); !s.ok()) return s;
      auto registered = WaitForAddressFile(info_file, children, absl::Now() + absl::Seconds(30));
      if (!registered.ok()) return registered.status();
    }
    return scheduler;
  };
  auto scheduler = start_cluster("", o.metrics_listen);
  if (!scheduler.ok()) return scheduler.status();
  auto ours_fn = Ours(o, *scheduler);
  if (!ours_fn.ok()) return ours_fn.status();
  // Measures the same round trips against a second cluster, in alternating blocks.
  auto compare = [&](const std::string& tag, const std::string& metrics_listen,
                     const ClusterCredentialFiles* credentials, const SecurityCredentials& security,
                     const Comparison& comparison) -> absl::Status {
    auto other = start_cluster(tag, metrics_listen, credentials);
    if (!other.ok()) return other.status();
    auto other_fn = Ours(o, *other, security);
    if (!other_fn.ok()) return other_fn.status();
    auto m = Interleaved(o, *ours_fn, *other_fn);
    if (!m.ok()) return m.status();
    ReportComparison(o, comparison, m->first, m->second);
    return absl::OkStatus();
  };
  if (o.secure) {
    auto credentials = WriteClusterCredentials(dir + "/credentials", {}, /*mutual=*/true);
    if (!credentials.ok()) return credentials.status();
    if (o.data_cipher == "curve") {
      if (absl::Status s = SetDataCipher(credentials->node_config, CURVE); !s.ok()) return s;
    }
    auto security = LoadSecurityCredentialsFile(credentials->node_config, /*for_scheduler=*/false);
    if (!security.ok()) return security.status();
    return compare("secure-", "", &*credentials, *security,
                   {o.data_cipher == "curve" ? "plain and secured (TLS + token, CURVE)"
                                             : "plain and secured (TLS + token, AES-256-GCM sealed data)",
                    "plain", "secured", "plain", "secure", "secure_ratio",
                    "secure_p50_ratio"});
  }
  if (o.metrics_compare) {
    return compare("metrics-", "127.0.0.1:0", nullptr, {},
                   {"server metrics off and on", "metrics off", "metrics on", "metrics_off", "metrics_on",
                    "metrics_goodput_ratio", "metrics_latency_ratio"});
  }
  auto measured = Interleaved(o, *ours_fn, raw);
  if (!measured.ok()) return measured.status();
  const Measured* ours = &measured->first;
  const Measured* raw_m = &measured->second;

  const double trips = static_cast<double>(ours->latencies_us.size());
  const double raw_trips = static_cast<double>(raw_m->latencies_us.size());
  const double rt_s = trips / ours->seconds, raw_rt_s = raw_trips / raw_m->seconds;
  const double gbps = rt_s * o.bytes / 1e9, raw_gbps = raw_rt_s * o.bytes / 1e9;
  const double p50 = Percentile(ours->latencies_us, 0.5), p99 = Percentile(ours->latencies_us, 0.99);
  const double raw_p50 = Percentile(raw_m->latencies_us, 0.5);
  std::cout << absl::StrFormat(
      "bench %s: %d bytes, %d servers, %d workers, %d round trips each\n"
      "  shardps : %8.3f GB/s pushed, %8.3f GB/s pulled, %9.0f round trips/s, p50 %8.1f us, p99 %8.1f us\n"
      "  raw zmq : %8.3f GB/s each way,              %9.0f round trips/s, p50 %8.1f us\n"
      "  ratio   : goodput %.3f, latency %.3f\n",
      o.op, o.bytes, o.servers, o.workers, o.iters, gbps, gbps, rt_s, p50, p99, raw_gbps, raw_rt_s, raw_p50,
      rt_s / raw_rt_s, p50 / raw_p50);
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"op\": \"%s\", \"bytes\": %d, \"servers\": %d, \"workers\": %d, \"iters\": %d, \"push_gbps\": %.4f, "
        "\"pull_gbps\": %.4f, \"round_trips_per_s\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"raw_gbps\": %.4f, "
        "\"raw_round_trips_per_s\": %.1f, \"raw_p50_us\": %.1f, \"goodput_ratio\": %.4f, \"latency_ratio\": %.4f}\n",
        o.op, o.bytes, o.servers, o.workers, o.iters, gbps, gbps, rt_s, p50, p99, raw_gbps, raw_rt_s, raw_p50,
        rt_s / raw_rt_s, p50 / raw_p50);
  }
  return absl::OkStatus();
}

}  // namespace

int BenchCommand(const Args& args) {
  BenchOptions o;
  CliFlags flags("bench");
  flags.Int("servers", &o.servers, "server processes");
  flags.Int("workers", &o.workers, "worker clients (threads of this process)");
  flags.Int("bytes", &o.bytes, "tensor size in bytes");
  flags.Int("iters", &o.iters, "measured round trips per worker");
  flags.Int("warmup", &o.warmup, "round trips per worker before measuring");
  flags.Int("partition-bytes", &o.partition_bytes, "partition size");
  flags.String("op", &o.op, "pushpull (one request) or push-then-pull");
  flags.String("consistency", &o.consistency, "sync, ssp or async");
  flags.Bool("json", &o.json, "print one JSON object as the last line");
  flags.String("metrics-listen", &o.metrics_listen,
               "HOST:PORT: start the servers with Prometheus metrics, server i on PORT + i (0: any free port)");
  flags.Bool("metrics-compare", &o.metrics_compare,
             "compare round trips against a second cluster whose servers serve metrics (instead of raw ZeroMQ)");
  flags.Bool("secure", &o.secure,
             "compare round trips against a second cluster with both planes secured (instead of raw ZeroMQ)");
  flags.String("data-cipher", &o.data_cipher,
               "with --secure: how servers protect the data plane, aes-256-gcm (default) or curve");
  flags.Repeated("set", &o.sets, "override one config field, e.g. --set replication=1");
  flags.String("scheduler", &o.scheduler,
               "HOST:PORT of a running cluster: start nothing, measure only its round trips (no raw baseline)");
  flags.Int("rank", &o.rank, "with --scheduler: rank of the first worker client");
  flags.String("tensor-bytes", &o.tensor_bytes,
               "with --scheduler: comma-separated tensor sizes in bytes, all pushed/pulled each round trip");
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::cerr << "shardps bench: " << s.message() << "\n";
    return 2;
  }
  if (flags.help()) return 0;
  if (absl::Status s = CheckBenchFlags(o); !s.ok()) {
    std::cerr << "shardps bench: " << s.message() << "\n";
    return 2;
  }
  InitLogging("shardps-bench", false);
  if (absl::Status s = RunBench(o); !s.ok()) {
    std::cerr << "shardps bench: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

// Hidden helper of `bench`: a ROUTER that sends every message back unchanged.
int EchoServerCommand(const Args& args) {
  std::string port_file;
  CliFlags flags("echo-server");
  flags.String("port-file", &port_file, "write the bound endpoint here");
  if (absl::Status s = flags.Parse(args); !s.ok()) return 2;
  InstallStopSignals();
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::sndhwm, 0);
  router.set(zmq::sockopt::rcvhwm, 0);
  router.bind("tcp://127.0.0.1:*");
  if (!WriteFileDurably(port_file, router.get(zmq::sockopt::last_endpoint)).ok()) return 1;
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  while (!StopRequested()) {
    PollOrInterrupted(&item, 1, std::chrono::milliseconds(50));
    zmq::message_t frame;
    while (router.recv(frame, zmq::recv_flags::dontwait)) {
      bool more = frame.more();
      router.send(frame, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
      while (more) {
        (void)router.recv(frame);
        more = frame.more();
        router.send(frame, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    }
  }
  return 0;
}

}  // namespace shardps
