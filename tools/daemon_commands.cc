// `shardps scheduler`, `server`, `train` and `status`.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_store.h"
#include "common/config.h"
#include "tools/local_cluster.h"
#include "common/logging.h"
#include "common/scheduler_client.h"
#include "compression/codec_policy.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/daemon_metrics.h"
#include "tools/status_view.h"
#include "common/durable_file.h"
#include "common/endpoint.h"
#include "tools/process.h"
#include "tools/train/fashion_mnist.h"
#include "tools/train_job.h"
#include "worker/local_tier/device.h"
#include "worker/worker.h"

namespace shardps {
namespace {

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop.store(true); }

int Fail(const std::string& command, const absl::Status& s) {
  std::cerr << "shardps " << command << ": " << s.message() << "\n";
  return 1;
}

// A command line that cannot run: exit code 2, as every other command gives.
int UsageError(const std::string& command, const absl::Status& s) {
  Fail(command, s);
  return 2;
}

// A wait given in seconds: NaN, 0 or a negative one would fail at once.
absl::Status RequirePositiveSeconds(absl::string_view flag, double seconds) {
  if (seconds > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", seconds, " must be above 0 (seconds)"));
}

// The nodes have no default scheduler: the daemons' commands need --scheduler.
absl::Status RequireScheduler(const std::string& address) {
  if (!address.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("--scheduler is missing: the HOST:PORT the scheduler serves on (its --listen)");
}

// The server's address flags, checked before anything starts: the same
// checks later (ParameterServer::Create, ServeMetrics) would fail as a run
// that failed (exit 1), and --listen would be named "server listen address".
absl::Status CheckServerAddresses(const ServerOptions& options, const std::string& metrics_listen) {
  if (absl::Status s = CheckSchedulerAddress(options.scheduler_address); !s.ok()) return s;
  if (auto e = ParseTcpEndpoint(options.bind_address, "--listen", {.allow_port_zero = true, .allow_wildcard = true});
      !e.ok()) {
    return e.status();
  }
  return metrics_listen.empty() ? absl::OkStatus() : CheckMetricsListen(metrics_listen);
}

// While alive, a stop signal ends the process at once with `code`, after
// `message` on stderr: for a node still waiting to join its cluster
// (registration retries for up to its timeout and checks no stop), which
// holds nothing to hand on yet. A wait that ends within 2 s of the stop
// (the scheduler answered just then) is let return: the node then stops as
// a member does, leaving the job, instead of falling silent.
class StopEndsProcess {
 public:
  StopEndsProcess(std::string message, int code)
      : thread_([this, message = std::move(message), code] {
          // The signal thread only sets g_stop: look every 50 ms, and end
          // the look at once when the wait is over.
          while (!joined_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
            if (g_stop.load()) {
              if (joined_.WaitForNotificationWithTimeout(absl::Seconds(2))) return;
              std::cerr << message << "\n";
              std::_Exit(code);
            }
          }
        }) {}
  ~StopEndsProcess() {
    joined_.Notify();
    thread_.join();
  }

 private:
  absl::Notification joined_;
  std::thread thread_;
};

}  // namespace

bool StopRequested() { return g_stop.load(); }

void InstallStopSignals() {
  static std::once_flag once;
  std::call_once(once, [] {
    // SIGINT ignored at start stays ignored, as the GNU coding standards ask:
    // a shell starts background jobs so, and a launcher starts its daemons so
    // that a terminal's Ctrl-C, sent to the whole group, leaves them serving
    // until it has stopped the workers (tools/local_cluster.cc).
    struct sigaction at_start {};
    sigaction(SIGINT, nullptr, &at_start);
    const bool interrupts = at_start.sa_handler != SIG_IGN;
    // A handler for threads that were started before this call and do not
    // block the signals.
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    if (interrupts) sigaction(SIGINT, &sa, nullptr);
    // Every thread started from here on blocks them, and one thread takes
    // them with sigwait. A handler runs on whichever thread the kernel picks,
    // and under ThreadSanitizer it is held back until that thread next enters
    // the runtime: a thread parked in a futex for good (gRPC's, absl's) kept
    // SIGTERM from ever stopping a daemon. Children get an empty mask back
    // (tools/process.cc).
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    if (interrupts) sigaddset(&stop, SIGINT);  // blocked, an ignored one would wait for sigwait
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    std::thread([stop] {
      int sig = 0;
      while (sigwait(&stop, &sig) == 0) g_stop.store(true);
    }).detach();
  });
}

int SchedulerCommand(const Args& args) {
  std::string listen = "0.0.0.0:7000", config_path, port_file, state_dir;
  std::string restore;
  std::vector<std::string> sets;
  bool verbose = false;
  CliFlags flags("scheduler");
  flags.String("state-dir", &state_dir,
               "persist the cluster state here after every change; a restarted scheduler resumes it");
  flags.String("listen", &listen, "host:port to serve the scheduler on (port 0 = any free port)");
  std::string etcd, etcd_prefix, advertise;
  flags.String("etcd", &etcd,
               "http://HOST:PORT[,...] or https://HOST:PORT[,...]: keep the state in etcd and elect the active scheduler with a lease; "
               "others started alike are standbys (exclusive with --state-dir)");
  EtcdTlsFiles etcd_tls;
  flags.String("etcd-ca", &etcd_tls.ca_file, "PEM file of the CA that signed etcd's certificate (https:// endpoints)");
  flags.String("etcd-cert", &etcd_tls.cert_file,
               "PEM client certificate for etcd's --client-cert-auth (with --etcd-key)");
  flags.String("etcd-key", &etcd_tls.key_file, "PEM key of --etcd-cert");
  flags.String("etcd-prefix", &etcd_prefix, "etcd key prefix of this cluster (default /shardps/<config digest>)");
  flags.String("advertise", &advertise,
               "host:port nodes reach this scheduler at, published in etcd (default: the bound address)");
  flags.String("config", &config_path, "cluster configuration file (protobuf text, proto/config.proto)");
  std::string security_config;
  flags.String("security-config", &security_config,
               "config file whose security { } block replaces the cluster config's (README: Security)");
  flags.Repeated("set", &sets, "override one config field, e.g. --set consistency=async");
  flags.String("port-file", &port_file, "write the bound host:port to this file once serving");
  flags.String("restore", &restore,
               "restart the cluster from this checkpoint directory (its latest complete round) or round directory");
  flags.Bool("verbose", &verbose, "log INFO messages");
  std::string metrics_listen;
  flags.String("metrics-listen", &metrics_listen, "HOST:PORT to serve Prometheus /metrics and /healthz on (off if empty)");
  if (absl::Status s = flags.Parse(args); !s.ok()) return UsageError("scheduler", s);
  if (flags.help()) return 0;
  if (!metrics_listen.empty()) {
    if (absl::Status s = CheckMetricsListen(metrics_listen); !s.ok()) return UsageError("scheduler", s);
  }
  InitLogging("shardps-scheduler", verbose);
  ClusterConfig config;
  if (!config_path.empty()) {
    auto loaded = LoadConfigFile(config_path);
    if (!loaded.ok()) return Fail("scheduler", loaded.status());
    config = *loaded;
  }
  if (absl::Status s = ApplyConfigSets(sets, &config); !s.ok()) return UsageError("scheduler", s);
  if (!restore.empty()) {
    if (absl::Status st = SetRestorePoint(restore, &config); !st.ok()) return Fail("scheduler", st);
    std::cerr << "shardps scheduler: restoring round " << config.checkpoint().restore_round() << " from "
              << config.checkpoint().restore_dir() << "\n";
  }
  for (const MeasuredDefault& d : ApplyMeasuredDefaults(&config)) std::cerr << "shardps scheduler: " << d.line << "\n";
  // The scheduler hands this config to every node: refuse a bad codec here,
  // not in each server.
  if (absl::Status s = compression::ValidateCompressionConfig(config); !s.ok()) return Fail("scheduler", s);
  if (!security_config.empty()) {
    auto loaded = LoadConfigFile(security_config);
    if (!loaded.ok()) return Fail("scheduler", loaded.status());
    *config.mutable_security() = loaded->security();
  }
  auto security = LoadSecurityCredentials(config.security(), /*for_scheduler=*/true);
  if (!security.ok()) {  // named like a node's (LoadSecurityCredentialsFile): the file the block came from
    const std::string& from = security_config.empty() ? config_path : security_config;
    return Fail("scheduler", absl::Status(security.status().code(),
                                          absl::StrCat(from, ": ", security.status().message())));
  }
  InstallStopSignals();
  SchedulerOptions options;
  options.listen_address = listen;
  options.config = config;
  options.state_dir = state_dir;
  options.etcd_endpoints = etcd;
  options.etcd_prefix = etcd_prefix;
  options.etcd_tls = etcd_tls;
  options.advertise_address = advertise;
  options.security = *std::move(security);
  auto scheduler = SchedulerDaemon::Create(options);
  // Its options come from the flags: flags that exclude or need each other,
  // or a value it cannot take, are a command line that cannot run.
  if (!scheduler.ok() && scheduler.status().code() == absl::StatusCode::kInvalidArgument) {
    return UsageError("scheduler", scheduler.status());
  }
  if (!scheduler.ok()) return Fail("scheduler", scheduler.status());
  std::unique_ptr<MetricsRegistry> metrics = MetricsRegistry::Create();
  std::unique_ptr<MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    AddSchedulerMetrics(*metrics, **scheduler);
    auto served = ServeMetrics("scheduler", metrics_listen, *metrics);
    if (!served.ok()) return Fail("scheduler", served.status());
    exposer = *std::move(served);
  }
  std::cerr << "shardps scheduler: serving on " << (*scheduler)->address() << (options.security.enabled ? " (TLS, token" : "")
            << (options.security.require_client_cert ? ", client certificates" : "")
            << (options.security.enabled ? ")" : "") << " ("
            << ConsistencyName(config.consistency()) << ", " << config.num_servers() << " servers, "
            << config.num_workers() << " workers)\n";
  if (!port_file.empty()) {
    if (absl::Status s = WriteFileDurably(port_file, (*scheduler)->address()); !s.ok()) return Fail("scheduler", s);
  }
  std::atomic<bool> stopped{false};  // by itself: an etcd lease lost
  std::thread stopper([&] {
    while (!StopRequested() && !stopped.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*scheduler)->Shutdown();
  });
  (*scheduler)->Wait();
  stopped.store(true);
  stopper.join();
  if (absl::Status failure = (*scheduler)->Failure(); !failure.ok()) return Fail("scheduler", failure);
  return 0;
}

int ServerCommand(const Args& args) {
  ServerOptions options;
  double register_timeout_s = 30, drain_on_stop_s = 0;
  bool verbose = false;
  CliFlags flags("server");
  flags.String("scheduler", &options.scheduler_address,
               "scheduler host:port, required (several, comma-separated: schedulers on etcd)");
  flags.String("listen", &options.bind_address, "ZeroMQ endpoint to bind (port 0 = any free port)");
  flags.String("advertise-host", &options.advertise_host, "host name or IP workers use to reach this server");
  flags.Double("register-timeout", &register_timeout_s, "seconds to wait for the scheduler");
  flags.Double("drain-on-stop", &drain_on_stop_s,
               "on SIGTERM, first move this server's copies to the others while training goes on (`shardps drain`), "
               "for at most this many seconds; 0: stop at once (its partitions fail over)");
  std::string security_config;
  flags.String("security-config", &security_config,
               "config file whose security { } block this node uses to reach a secured cluster (README: Security)");
  std::string info_file, updates_file;
  flags.String("info-file", &info_file, "once registered, write 'INDEX DATA_ADDRESS' here");
  flags.String("updates-file", &updates_file,
               "on exit, write per partition this server is the primary of: 'ID COMPLETED [APPLIED_BY_WORKER...]', "
               "per synced backup copy the same after 'backup ', then 'staleness GRADIENTS SUM MAX' (rounds)");
  flags.Bool("verbose", &verbose, "log INFO messages");
  std::string metrics_listen;
  flags.String("metrics-listen", &metrics_listen, "HOST:PORT to serve Prometheus /metrics and /healthz on (off if empty)");
  int64_t max_partition_series = static_cast<int64_t>(options.metrics_max_partitions);
  flags.Count("metrics-max-partitions", &max_partition_series,
            "partitions (lowest ids) that get per-partition metric series; the rest are only counted");
  if (absl::Status s = flags.Parse(args); !s.ok()) return UsageError("server", s);
  if (flags.help()) return 0;
  if (absl::Status s = RequireScheduler(options.scheduler_address); !s.ok()) return UsageError("server", s);
  if (absl::Status s = RequirePositiveSeconds("register-timeout", register_timeout_s); !s.ok()) {
    return UsageError("server", s);
  }
  if (absl::Status s = CheckServerAddresses(options, metrics_listen); !s.ok()) return UsageError("server", s);
  options.metrics_max_partitions = static_cast<size_t>(max_partition_series);
  InitLogging("shardps-server", verbose);
  std::unique_ptr<MetricsRegistry> metrics = MetricsRegistry::Create();
  std::unique_ptr<MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto served = ServeMetrics("server", metrics_listen, *metrics);
    if (!served.ok()) return Fail("server", served.status());
    exposer = *std::move(served);
    options.metrics = metrics.get();
  }
  options.register_timeout = absl::Seconds(register_timeout_s);
  if (!(drain_on_stop_s >= 0)) {
    return UsageError("server", absl::InvalidArgumentError(absl::StrCat("--drain-on-stop ", drain_on_stop_s,
                                                                        ": expected seconds, 0 or more")));
  }
  options.drain_on_stop = absl::Seconds(drain_on_stop_s);
  auto security = LoadSecurityCredentialsFile(security_config, /*for_scheduler=*/false);
  if (!security.ok()) return Fail("server", security.status());
  options.security = *std::move(security);
  InstallStopSignals();
  absl::StatusOr<std::unique_ptr<ParameterServer>> server;
  {
    // Exit 0: a daemon stopped as asked (systemctl stop, a pod deleted).
    StopEndsProcess stop("shardps server: stopped by a signal before it registered with the scheduler", 0);
    server = ParameterServer::Create(options);
  }
  if (!server.ok()) return Fail("server", server.status());
  if (!info_file.empty()) {
    absl::Status s = WriteFileDurably(info_file, absl::StrCat((*server)->index(), " ", (*server)->data_address(), "\n"));
    if (!s.ok()) return Fail("server", s);
  }
  std::thread stopper([&] {
    while (!StopRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (*server)->RequestStop();
  });
  absl::Status s = (*server)->Run();
  g_stop.store(true);
  stopper.join();
  if (!s.ok()) return Fail("server", s);
  if (!updates_file.empty()) {
    std::string text;
    auto lines = [&text](absl::string_view prefix, const std::vector<PartitionUpdates>& updates) {
      for (const PartitionUpdates& u : updates) {
        absl::StrAppend(&text, prefix, u.partition, " ", u.completed);
        for (uint64_t n : u.applied_by_worker) absl::StrAppend(&text, " ", n);
        if (!u.applied_digest_by_worker.empty()) text += " digests";
        for (uint64_t d : u.applied_digest_by_worker) absl::StrAppend(&text, " ", d);
        text += "\n";
      }
    };
    lines("", (*server)->UpdateCounts());
    lines("backup ", (*server)->BackupUpdateCounts());
    const EngineStats stats = (*server)->Stats();
    absl::StrAppendFormat(&text, "staleness %d %.17g %.17g\n", stats.stale_gradients, stats.staleness_sum,
                          stats.staleness_max);
    if (absl::Status w = WriteFileDurably(updates_file, text); !w.ok()) return Fail("server", w);
  }
  return 0;
}

int TrainCommand(const Args& args) {
  WorkerOptions worker_options;
  TrainOptions train;
  int64_t rank = 0, epochs = train.epochs, batch = train.batch_size, seed = train.seed, train_limit = 0,
          test_limit = 0, max_steps = 0, log_every = train.log_every, devices_per_worker = 1, eval_every = 0;
  double rendezvous_s = 60;
  std::string result_file;
  bool verbose = false;
  CliFlags flags("train");
  flags.Double("slow-factor", &train.slow_factor,
               "make this worker's compute F times slower (sleeps (F-1) x each step's compute time)");
  flags.String("scheduler", &worker_options.scheduler_address,
               "scheduler host:port, required (several, comma-separated: schedulers on etcd)");
  flags.Int("rank", &rank, "this worker's rank");
  flags.Int("epochs", &epochs, "training epochs");
  flags.Int("batch-size", &batch, "images per step per worker");
  flags.Int("devices-per-worker", &devices_per_worker,
            "CPU devices (model replicas) per worker, each on batch-size / D images; gradients merged locally");
  flags.String("devices", &train.devices,
               "local-tier devices, e.g. cuda:0,cuda:1 or cpu:4 (count must equal --devices-per-worker)");
  flags.Int("seed", &seed, "seed of initial weights and data order");
  flags.Count("train-limit", &train_limit, "use only the first N training images (0 = all)");
  flags.Count("test-limit", &test_limit, "use only the first N test images (0 = all)");
  flags.Count("max-steps", &max_steps, "stop after N steps (0 = no limit)");
  flags.Int("log-every", &log_every, "progress line every N steps (0 = none)");
  flags.Int("eval-every", &eval_every,
            "rank 0: test accuracy every N steps and of the final weights, one JSON line each on stderr (0 = none)");
  flags.String("data-dir", &train.data_dir, "directory of the Fashion-MNIST .gz files");
  std::string hidden = "256,128";
  flags.String("hidden", &hidden, "hidden layer widths of the MLP, comma-separated");
  flags.Double("rendezvous-timeout", &rendezvous_s, "seconds to wait for the cluster");
  std::string security_config;
  flags.String("security-config", &security_config,
               "config file whose security { } block this node uses to reach a secured cluster (README: Security)");
  flags.String("result-file", &result_file, "write the result (key value lines) here");
  flags.String("progress-file", &train.progress_file, "write the number of steps taken here after every step");
  std::string metrics_listen;
  flags.String("metrics-listen", &metrics_listen, "HOST:PORT to serve this worker's Prometheus /metrics on (off if empty)");
  bool no_overlap = false;
  flags.Bool("no-overlap", &no_overlap,
             "push every tensor after the whole backward and await every answer before the next step "
             "(default: push each gradient as backward computes it, await each weight as forward reaches it)");
  flags.Bool("verbose", &verbose, "log INFO messages");
  if (absl::Status s = flags.Parse(args); !s.ok()) return UsageError("train", s);
  train.overlap = !no_overlap;
  if (flags.help()) return 0;
  if (absl::Status s = RequireScheduler(worker_options.scheduler_address); !s.ok()) return UsageError("train", s);
  if (absl::Status s = CheckSchedulerAddress(worker_options.scheduler_address); !s.ok()) return UsageError("train", s);
  if (absl::Status s = RequirePositiveSeconds("rendezvous-timeout", rendezvous_s); !s.ok()) {
    return UsageError("train", s);
  }
  if (rank < 0 || rank > std::numeric_limits<int32_t>::max()) {
    return UsageError("train", absl::InvalidArgumentError(absl::StrCat("--rank ", rank, " is negative or too large")));
  }
  InitLogging("shardps-train", verbose);
  worker_options.rank = static_cast<uint32_t>(rank);
  worker_options.rendezvous_timeout = absl::Seconds(rendezvous_s);
  train.epochs = static_cast<int>(std::clamp<int64_t>(epochs, -1, 1 << 30));  // validated below
  train.batch_size = batch;
  train.devices_per_worker = static_cast<int>(std::clamp<int64_t>(devices_per_worker, 0, 1025));  // validated below
  train.seed = seed;
  train.train_limit = train_limit;
  train.test_limit = test_limit;
  train.max_steps = max_steps;
  train.log_every = log_every;
  train.eval_every = static_cast<int>(std::clamp<int64_t>(eval_every, -(1 << 30), 1 << 30));  // validated below
  auto layers = ParseLayers(hidden);
  if (!layers.ok()) {
    return UsageError("train", absl::InvalidArgumentError(absl::StrCat("--hidden: ", layers.status().message())));
  }
  train.layers = *layers;
  if (absl::Status s = ValidateTrainOptions(train); !s.ok()) return UsageError("train", s);
  // The device spec before joining: one the local tier cannot open, or that
  // names another number of devices, would fail after this rank joined.
  if (!train.devices.empty()) {
    auto devices = CreateDevices(train.devices);
    if (!devices.ok()) {
      return UsageError("train", absl::InvalidArgumentError(absl::StrCat("--devices: ", devices.status().message())));
    }
    if (static_cast<int64_t>(devices->size()) != devices_per_worker) {
      return UsageError("train", absl::InvalidArgumentError(absl::StrCat(
                                     "--devices '", train.devices, "' names ", devices->size(),
                                     " devices; --devices-per-worker is ", devices_per_worker)));
    }
  }
  // Before joining: a bad address found after it would leave the job at once.
  if (!metrics_listen.empty()) {
    if (absl::Status s = CheckMetricsListen(metrics_listen); !s.ok()) return UsageError("train", s);
  }
  auto security = LoadSecurityCredentialsFile(security_config, /*for_scheduler=*/false);
  if (!security.ok()) return Fail("train", security.status());
  worker_options.security = *std::move(security);
  // A wrong --data-dir fails here, not after this rank has joined (and then
  // left the others waiting at) the cluster.
  for (train::Split split : {train::Split::kTrain, train::Split::kTest}) {
    if (auto probe = train::LoadFashionMnist(train.data_dir, split, /*limit=*/1); !probe.ok()) {
      return Fail("train", probe.status());
    }
  }
  // SIGTERM (a pod deleted, systemctl stop) or SIGINT ends training before
  // the next step, and the worker leaves the job as it is destroyed: the
  // others go on at once, and a process started again for this rank
  // rejoins, rather than wait for this one to be declared dead.
  InstallStopSignals();
  train.stop_requested = StopRequested;
  // Until the worker has joined, a stop ends the process at once, as the
  // signal itself did before it was taken for a leave between steps:
  // Worker::Create waits for the cluster (up to --rendezvous-timeout, or
  // for a previous process of this rank to be declared dead) and checks no
  // stop, and a process not in the job yet has nothing to leave.
  absl::StatusOr<std::unique_ptr<Worker>> worker;
  {
    StopEndsProcess stop("shardps train: stopped by a signal before joining the job", 1);
    worker = Worker::Create(worker_options);
  }
  if (!worker.ok()) return Fail(absl::StrCat("train (rank ", rank, ")"), worker.status());
  std::unique_ptr<MetricsRegistry> metrics = MetricsRegistry::Create();
  std::unique_ptr<MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    AddWorkerMetrics(*metrics, **worker, worker_options.rank);
    auto served = ServeMetrics("train", metrics_listen, *metrics);
    if (!served.ok()) return Fail("train", served.status());
    exposer = *std::move(served);
  }
  auto result = RunTrainingWorker(**worker, train, std::cerr);
  if (!result.ok()) {
    // The leave as the worker is destroyed says why (listed as failed), as
    // shardps_fail does for a binding; a stop by a signal is no failure.
    if (!StopRequested()) (*worker)->SetLeavingError(result.status().ToString());
    return Fail(absl::StrCat("train (rank ", rank, ")"), result.status());
  }
  std::string text = absl::StrFormat(
      "test_accuracy %.6f\nfinal_loss %.6f\nsteps %d\nsamples %d\nwall_seconds %.6f\nbytes_pushed %d\n"
      "bytes_pulled %d\nwait_seconds %.6f\n",
      result->test_accuracy, result->final_loss, result->steps, result->samples, result->wall_seconds,
      result->bytes_pushed, result->bytes_pulled, result->wait_seconds);
  for (const auto& [partition, n] : result->acked_pushes) absl::StrAppend(&text, "acked.", partition, " ", n, "\n");
  for (const auto& [partition, d] : result->acked_push_digests) {
    absl::StrAppend(&text, "acked_digest.", partition, " ", d, "\n");
  }
  absl::StrAppend(&text, "rejoin_round ", result->rejoin_round, "\n");
  if (!result_file.empty()) {
    if (absl::Status s = WriteFileDurably(result_file + ".sha256", WeightsSha256(result->params)); !s.ok()) {
      return Fail("train", s);
    }
    if (absl::Status s = WriteFileDurably(result_file, text); !s.ok()) return Fail("train", s);
  } else {
    std::cout << text;
  }
  return 0;
}

int StatusCommand(const Args& args) {
  std::string address = "127.0.0.1:7000";
  double timeout_s = 5, interval_s = 2;
  bool watch = false, json = false;
  CliFlags flags("status");
  flags.String("scheduler", &address, "scheduler host:port (several, comma-separated: schedulers on etcd)");
  flags.Double("timeout", &timeout_s, "seconds to wait for an answer");
  flags.Bool("watch", &watch,
             "refresh every --interval seconds until interrupted (rates: between refreshes)");
  flags.Double("interval", &interval_s, "seconds between refreshes with --watch");
  flags.Bool("json", &json, "print each snapshot as one line of JSON");
  std::string security_config;
  flags.String("security-config", &security_config, "config file whose security { } block reaches a secured scheduler");
  if (absl::Status s = flags.Parse(args); !s.ok()) return UsageError("status", s);
  if (flags.help()) return 0;
  // --interval 0 would ask the scheduler for its status in a busy loop.
  if (!(interval_s >= 0.1)) {
    return UsageError("status", absl::InvalidArgumentError(
                                    absl::StrCat("--interval ", interval_s, " must be at least 0.1 (seconds)")));
  }
  if (absl::Status s = RequirePositiveSeconds("timeout", timeout_s); !s.ok()) return UsageError("status", s);
  auto security = LoadSecurityCredentialsFile(security_config, /*for_scheduler=*/false);
  if (!security.ok()) return Fail("status", security.status());
  auto client = SchedulerClient::Create(address, *security);
  if (!client.ok()) {  // a --scheduler that does not parse is the command line's
    return client.status().code() == absl::StatusCode::kInvalidArgument ? UsageError("status", client.status())
                                                                        : Fail("status", client.status());
  }
  if (watch) InstallStopSignals();
  const bool clear = watch && !json && isatty(STDOUT_FILENO);
  std::optional<StatusResponse> previous;  // --watch: rates between refreshes
  absl::Time previous_at;
  do {
    auto status = (*client)->Status(absl::Seconds(timeout_s));
    if (!status.ok() && !watch) return Fail("status", status.status());
    if (clear) std::cout << "\033[H\033[2J";
    if (!status.ok()) {
      std::cout << "scheduler " << address << ": " << status.status().message() << "\n";
    } else {
      const absl::Time now = absl::Now();
      if (previous) RatesSinceSnapshot(*previous, absl::ToDoubleSeconds(now - previous_at), &*status);
      previous = *status;
      previous_at = now;
      std::cout << (json ? StatusJson(*status) + "\n" : StatusTable(*status));
    }
    std::cout.flush();
    for (double waited = 0; watch && waited < interval_s && !StopRequested(); waited += 0.05) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } while (watch && !StopRequested());
  return 0;
}

}  // namespace shardps
