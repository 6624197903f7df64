// Metrics and health of live daemons: a scheduler and a server in this
// process, a worker pushing through ZeroMQ, and the Prometheus endpoint read
// over plain HTTP the way Prometheus reads it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include <atomic>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/tensor_spec.h"
#include "scheduler/scheduler.h"
#include "server/partition_metrics.h"
#include "server/server.h"
#include "tools/daemon_metrics.h"
#include "tools/process.h"
#include "tools/status_view.h"
#include "worker/worker.h"

namespace shardps {
namespace {

// A TCP connection to `address` (HOST:PORT, IPv4), its reads timing out
// after 5 s; its descriptor, or an error.
absl::StatusOr<int> Connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return absl::InvalidArgumentError(address);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(address);
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  const timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// GET `path` from `address` (HOST:PORT, IPv4); the whole answer, headers and
// body, or an error.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  auto fd = Connect(address);
  if (!fd.ok()) return fd.status();
  (void)write(*fd, request.data(), request.size());
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = read(*fd, buf, sizeof(buf))) > 0;) answer.append(buf, n);
  close(*fd);
  return answer;
}

// The value of series `series` (name and labels, exactly as exposed) in a
// Prometheus text answer; nullopt if absent.
std::optional<double> Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  double v = 0;
  const size_t start = at + series.size() + 2;
  if (!absl::SimpleAtod(text.substr(start, text.find('\n', start) - start), &v)) return std::nullopt;
  return v;
}

// A scheduler daemon that serves nothing: its status (worker rank 0, dead or
// not) and its count of deaths are what the test sets.
class ScriptedScheduler : public SchedulerDaemon {
 public:
  std::string address() const override { return ""; }
  void Wait() override {}
  void Shutdown() override {}
  absl::Status Failure() override { return absl::OkStatus(); }
  StatusResponse Status() override {
    absl::MutexLock lock(&mu_);
    StatusResponse status;
    NodeStatus* n = status.add_nodes();
    n->set_role(WORKER);
    n->set_declared_dead(dead_);
    n->set_alive(!dead_);
    return status;
  }
  uint64_t NodesDeclaredDead() override {
    absl::MutexLock lock(&mu_);
    return declared_;
  }
  void Set(bool dead, uint64_t declared) {
    absl::MutexLock lock(&mu_);
    dead_ = dead;
    declared_ = declared;
  }

 private:
  absl::Mutex mu_;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t declared_ ABSL_GUARDED_BY(mu_) = 0;
};

// A rejoin clears the dead entry; the second death must count all the same.
TEST(SchedulerMetricsTest, DeclaredDeadCountsEveryDeathOfARankThatRejoined) {
  ScriptedScheduler scheduler;
  auto registry = MetricsRegistry::Create();
  AddSchedulerMetrics(*registry, scheduler);
  auto exposer = MetricsExposer::Start("127.0.0.1:0", *registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  auto declared_dead = [&] {
    auto text = HttpGet((*exposer)->address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? Sample(*text, "shardps_scheduler_nodes_declared_dead_total").value_or(-1) : -1;
  };
  scheduler.Set(/*dead=*/true, /*declared=*/1);
  EXPECT_EQ(declared_dead(), 1);
  scheduler.Set(/*dead=*/false, /*declared=*/1);  // rejoined
  EXPECT_EQ(declared_dead(), 1);
  scheduler.Set(/*dead=*/true, /*declared=*/2);  // and died again
  EXPECT_EQ(declared_dead(), 2);
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCluster(/*servers=*/1, /*replication=*/0, /*partition_bytes=*/4096); }

  // A scheduler, `servers` servers (each with its own registry and
  // listener) and one worker that defines tensor "w" of 1024 floats, cut
  // into partitions of `partition_bytes`.
  void StartCluster(uint32_t servers, uint32_t replication, uint64_t partition_bytes) {
    ClusterConfig config;
    config.set_num_servers(servers);
    config.set_num_workers(1);
    config.set_replication(replication);
    config.set_partition_bytes(partition_bytes);
    config.set_heartbeat_interval_ms(100);
    config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    config.mutable_optimizer()->set_learning_rate(0.1f);
    auto scheduler = SchedulerDaemon::Create({.listen_address = "127.0.0.1:0", .config = config});
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
    scheduler_metrics_ = MetricsRegistry::Create();
    AddSchedulerMetrics(*scheduler_metrics_, *scheduler_);
    auto scheduler_exposer = MetricsExposer::Start("127.0.0.1:0", *scheduler_metrics_);
    ASSERT_TRUE(scheduler_exposer.ok()) << scheduler_exposer.status();
    scheduler_exposer_ = *std::move(scheduler_exposer);

    for (uint32_t i = 0; i < servers; ++i) {
      server_metrics_.push_back(MetricsRegistry::Create());
      auto exposer = MetricsExposer::Start("127.0.0.1:0", *server_metrics_.back());
      ASSERT_TRUE(exposer.ok()) << exposer.status();
      server_exposers_.push_back(*std::move(exposer));
      auto server = ParameterServer::Create({.scheduler_address = scheduler_->address(),
                                             .bind_address = "tcp://127.0.0.1:0",
                                             .metrics = server_metrics_.back().get()});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
      ParameterServer* started = servers_.back().get();
      serving_.emplace_back([started] { (void)started->Run(); });
    }
    auto worker = Worker::Create({.scheduler_address = scheduler_->address(), .rank = 0});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    ASSERT_TRUE(worker_->DefineTensors({Float32Tensor("w", 1024)}).ok());
  }

  void TearDown() override {
    worker_.reset();
    for (auto& server : servers_) server->RequestStop();
    for (std::thread& t : serving_) t.join();
    servers_.clear();
    server_exposers_.clear();
    scheduler_exposer_.reset();
    if (scheduler_) scheduler_->Shutdown();
  }

  void PushPull(int rounds) {
    std::vector<float> grad(1024, 1.0f), out(1024);
    for (int i = 0; i < rounds; ++i) {
      auto h = worker_->PushPull("w", grad, absl::MakeSpan(out));
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(worker_->Wait(*h, absl::Seconds(10)).ok());
    }
  }

  // Scrapes server `server` until `series` reaches `at_least` (the engine
  // thread publishes every 100 ms); returns the last value read (the whole
  // answer is kept in last_scrape_).
  double ScrapeUntil(const std::string& series, double at_least, size_t server = 0) {
    double value = -1;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      auto text = HttpGet(server_exposers_[server]->address(), "/metrics");
      EXPECT_TRUE(text.ok()) << text.status();
      if (!text.ok()) return value;
      last_scrape_ = *text;
      value = Sample(*text, series).value_or(-1);
      if (value >= at_least) return value;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return value;
  }

  std::unique_ptr<SchedulerDaemon> scheduler_;
  std::unique_ptr<MetricsRegistry> scheduler_metrics_;
  std::vector<std::unique_ptr<MetricsRegistry>> server_metrics_;
  std::unique_ptr<MetricsExposer> scheduler_exposer_;
  std::vector<std::unique_ptr<MetricsExposer>> server_exposers_;
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::thread> serving_;
  std::unique_ptr<Worker> worker_;
  std::string last_scrape_;  // ScrapeUntil's last answer
};

// Two servers, two copies of each of the two partitions of "w": each server
// is the primary of one partition and the backup of the other.
class ReplicatedMetricsTest : public MetricsTest {
 protected:
  void SetUp() override { StartCluster(/*servers=*/2, /*replication=*/2, /*partition_bytes=*/2048); }
};

// The name and labels of a per-partition series, as exposed (labels sorted).
std::string PartitionSeries(const std::string& name, const PartitionInfo& p, const char* role, uint32_t server) {
  return absl::StrCat(name, "{partition=\"", p.id(), "\",role=\"", role, "\",server=\"", server,
                      "\",tensor=\"w\"}");
}

TEST_F(MetricsTest, ServerCountersGrowWithPushPulls) {
  const std::string push_pulls = R"(shardps_server_requests_total{op="push_pull",server="0"})";
  PushPull(5);
  EXPECT_EQ(ScrapeUntil(push_pulls, 5), 5);
  PushPull(7);
  EXPECT_EQ(ScrapeUntil(push_pulls, 12), 12);
  auto text = HttpGet(server_exposers_[0]->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, R"(shardps_server_updates_total{server="0"})"), 12);
  EXPECT_EQ(Sample(*text, R"(shardps_server_received_bytes_total{server="0"})"), 12 * 4096);
  EXPECT_EQ(Sample(*text, R"(shardps_server_errors_total{code="invalid_argument",server="0"})"), 0);
  EXPECT_EQ(Sample(*text, R"(shardps_server_shard_map_epoch{server="0"})"), 1);
  EXPECT_EQ(Sample(*text, R"(shardps_server_request_handling_seconds_count{server="0"})"), 12);
  // Every push says which weights it was computed on; in sync none is stale.
  EXPECT_EQ(Sample(*text, R"(shardps_server_gradients_total{server="0"})"), 12);
  EXPECT_EQ(Sample(*text, R"(shardps_server_gradient_staleness_rounds_total{server="0"})"), 0);
  // Nothing is held once every push is answered (the engine tests fill these queues).
  EXPECT_EQ(Sample(*text, R"(shardps_server_bounded_answers{server="0"})"), 0);
  EXPECT_EQ(Sample(*text, R"(shardps_server_handoff_held_requests{server="0"})"), 0);
  // No copy lost an update, so none was re-created or asked after.
  EXPECT_EQ(Sample(*text, R"(shardps_server_snapshots_sent_total{server="0"})"), 0);
  EXPECT_EQ(Sample(*text, R"(shardps_server_snapshot_probes_total{server="0"})"), 0);
}

TEST_F(MetricsTest, ServerAnswersHealthProbe) {
  auto text = HttpGet(server_exposers_[0]->address(), "/healthz");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->rfind("HTTP/1.1 200", 0), 0u) << *text;
  EXPECT_EQ(Sample(*text, "shardps_up"), 1);
}

TEST_F(MetricsTest, SchedulerExposesMembershipAndEpoch) {
  auto text = HttpGet(scheduler_exposer_->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, R"(shardps_scheduler_nodes{role="server",state="alive"})"), 1);
  EXPECT_EQ(Sample(*text, R"(shardps_scheduler_nodes{role="worker",state="alive"})"), 1);
  EXPECT_EQ(Sample(*text, R"(shardps_scheduler_nodes{role="server",state="dead"})"), 0);
  EXPECT_EQ(Sample(*text, "shardps_scheduler_shard_map_epoch"), 1);
  EXPECT_EQ(Sample(*text, "shardps_scheduler_nodes_declared_dead_total"), 0);
  EXPECT_EQ(Sample(*text, "shardps_scheduler_servers_draining"), 0);
  EXPECT_EQ(Sample(*text, "shardps_scheduler_copy_moves"), 0);
  EXPECT_EQ(Sample(*text, "shardps_scheduler_handoffs"), 0);
}

// grpc.health.v1.Health/Check with an empty request (service ""); the answer
// is HealthCheckResponse{status: SERVING}, field 1 = 1, encoded 08 01.
TEST_F(MetricsTest, SchedulerAnswersGrpcHealthCheck) {
  auto channel = grpc::CreateChannel(scheduler_->address(), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check", grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(channel.get(), method,
                                                                                        &context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(MetricsTest, PartitionSeriesFollowVersionAndStaleness) {
  const ShardMap map = scheduler_->Status().shard_map();
  ASSERT_EQ(map.partitions_size(), 1);
  const PartitionInfo& p = map.partitions(0);
  const std::string version = PartitionSeries("shardps_server_partition_version", p, "primary", 0);
  PushPull(3);
  EXPECT_EQ(ScrapeUntil(version, 3), 3);
  PushPull(4);
  EXPECT_EQ(ScrapeUntil(version, 7), 7);
  // The version stops changing: its age grows past a few publications.
  const std::string age = PartitionSeries("shardps_server_partition_version_age_seconds", p, "primary", 0);
  EXPECT_GE(ScrapeUntil(age, 0.3), 0.3);
  auto text = HttpGet(server_exposers_[0]->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, PartitionSeries("shardps_server_partition_gradients_total", p, "primary", 0)), 7);
  EXPECT_EQ(Sample(*text, PartitionSeries("shardps_server_partition_gradient_staleness_rounds_total", p, "primary", 0)),
            0);
  EXPECT_EQ(Sample(*text, PartitionSeries("shardps_server_partition_gradient_staleness_max_rounds", p, "primary", 0)),
            0);
  EXPECT_EQ(Sample(*text, R"(shardps_server_partitions_unreported{server="0"})"), 0);
  // A new version restarts the age: read both from the scrape that shows it.
  PushPull(1);
  ASSERT_EQ(ScrapeUntil(version, 8), 8);
  const std::optional<double> fresh = Sample(last_scrape_, age);
  ASSERT_TRUE(fresh.has_value()) << last_scrape_;
  EXPECT_LT(*fresh, 0.3);
}

TEST_F(ReplicatedMetricsTest, PartitionSeriesOnPrimariesAndBackupsWithReplicationLag) {
  const ShardMap map = scheduler_->Status().shard_map();
  ASSERT_EQ(map.partitions_size(), 2);
  PushPull(5);
  for (const PartitionInfo& p : map.partitions()) {
    const uint32_t primary = p.server();
    const uint32_t backup = 1 - primary;
    EXPECT_EQ(ScrapeUntil(PartitionSeries("shardps_server_partition_version", p, "primary", primary), 5, primary), 5)
        << "partition " << p.id();
    // Answers wait for the backups: the backup copy holds every round too.
    EXPECT_EQ(ScrapeUntil(PartitionSeries("shardps_server_partition_version", p, "backup", backup), 5, backup), 5)
        << "partition " << p.id();
    auto text = HttpGet(server_exposers_[primary]->address(), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    std::string lag = PartitionSeries("shardps_server_partition_replication_lag_updates", p, "primary", primary);
    lag.insert(lag.find('{') + 1, absl::StrCat("backup=\"", backup, "\","));
    EXPECT_EQ(Sample(*text, lag), 0) << lag << " in\n" << *text;
    EXPECT_EQ(Sample(*text, PartitionSeries("shardps_server_partition_gradients_total", p, "primary", primary)), 5);
  }
}

// Servers report their counters in heartbeats; the scheduler's status turns
// them into rates, which `shardps status` shows.
TEST_F(ReplicatedMetricsTest, StatusShowsRoundsPerSecondOfEveryServerWhileTraining) {
  StatusResponse status;
  auto training = [&status] {
    for (const NodeStatus& n : status.nodes()) {
      if (n.role() == SERVER && n.rates().rounds() <= 0) return false;
      if (n.role() == WORKER && n.rates().steps() <= 0) return false;
    }
    return status.nodes_size() == 3;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!training() && absl::Now() < deadline) {
    PushPull(1);
    status = scheduler_->Status();
  }
  ASSERT_TRUE(training()) << StatusJson(status);
  for (const NodeStatus& n : status.nodes()) {
    EXPECT_GT(n.rates().bytes_in(), 0) << StatusJson(status);
    EXPECT_GT(n.rates().bytes_out(), 0) << StatusJson(status);
    EXPECT_GT(n.role() == SERVER ? n.counters().updates_applied() : n.counters().steps(), 0u) << StatusJson(status);
  }
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find("rounds/s"), std::string::npos) << table;
  EXPECT_NE(table.find("steps/s"), std::string::npos) << table;
  EXPECT_NE(StatusJson(status).find("\"rates\""), std::string::npos);
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

PartitionReport Report(uint64_t id, bool primary, uint64_t version) {
  PartitionReport r;
  r.partition = id;
  r.tensor = "w";
  r.primary = primary;
  r.version = version;
  return r;
}

// The bound, and series that follow partitions leaving and changing role,
// read the way Prometheus reads them.
TEST(PartitionMetricsTest, SeriesAreBoundedAndFollowPartitionsAndRoles) {
  auto registry = MetricsRegistry::Create();
  auto exposer = MetricsExposer::Start("127.0.0.1:0", *registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  PartitionMetrics metrics(*registry, 3, /*max_partitions=*/2);
  const auto now = std::chrono::steady_clock::now();
  auto series = [](uint64_t id, const char* role) {
    return absl::StrCat("shardps_server_partition_version{partition=\"", id, "\",role=\"", role,
                        "\",server=\"3\",tensor=\"w\"}");
  };
  metrics.Publish({Report(0, true, 4), Report(1, true, 5)}, /*held=*/3, now);
  auto text = HttpGet((*exposer)->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, series(0, "primary")), 4);
  EXPECT_EQ(Sample(*text, series(1, "primary")), 5);
  EXPECT_EQ(Sample(*text, R"(shardps_server_partitions_unreported{server="3"})"), 1);
  // Partition 0 left; partition 1 is a backup now; 2 came within the bound.
  metrics.Publish({Report(1, false, 6), Report(2, true, 1)}, /*held=*/2, now);
  text = HttpGet((*exposer)->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, series(0, "primary")), std::nullopt) << *text;
  EXPECT_EQ(Sample(*text, series(1, "primary")), std::nullopt) << *text;
  EXPECT_EQ(Sample(*text, series(1, "backup")), 6);
  EXPECT_EQ(Sample(*text, series(2, "primary")), 1);
  EXPECT_EQ(Sample(*text, R"(shardps_server_partitions_unreported{server="3"})"), 0);
}

// /healthz is the kubelet's liveness probe (deploy/k8s, 1 s): anyone who
// reaches the port must not hold it. Two idle connections used to take both
// HTTP threads for 30 s each, and again as they reconnected.
TEST(MetricsHttpTest, IdleOrTricklingConnectionsDoNotHoldTheHealthProbe) {
  auto registry = MetricsRegistry::Create();
  auto exposer = MetricsExposer::Start("127.0.0.1:0", *registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const std::string address = (*exposer)->address();
  auto probe = [&] {
    const absl::Time start = absl::Now();
    auto text = HttpGet(address, "/healthz");
    EXPECT_TRUE(text.ok() && text->find("shardps_up 1") != std::string::npos) << (text.ok() ? *text : "");
    return absl::Now() - start;
  };
  std::vector<int> idle;
  for (int i = 0; i + 1 < MetricsExposer::kHttpThreads; ++i) {
    auto fd = Connect(address);
    ASSERT_TRUE(fd.ok()) << fd.status();
    idle.push_back(*fd);
  }
  EXPECT_LT(probe(), absl::Milliseconds(500)) << "fewer idle connections than threads held the probe";
  for (int fd : idle) close(fd);
  // As many as the threads, each sending a byte of its request every 100 ms:
  // closed at the request deadline, whatever they still send.
  std::vector<int> trickling;
  for (int i = 0; i < MetricsExposer::kHttpThreads; ++i) {
    auto fd = Connect(address);
    ASSERT_TRUE(fd.ok()) << fd.status();
    trickling.push_back(*fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const std::string request = "GET /healthz HTTP/1.0\r\nX: ";  // never finished
    for (size_t sent = 0; !done.load(); ++sent) {
      for (int fd : trickling) (void)send(fd, &request[sent % request.size()], 1, MSG_NOSIGNAL);
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LT(probe(), absl::Milliseconds(MetricsExposer::kRequestTimeoutMs + 1000))
      << "trickling connections held the probe past the request deadline";
  done.store(true);
  trickle.join();
  for (int fd : trickling) close(fd);
}

// A port that can be bound now, with the `count` - 1 after it too, for a
// command that serves on PORT + i. Drawn below the ephemeral range (32768
// and up on Linux): a port a bind to port 0 gave was checked for a listener
// only, and one of the run was taken meanwhile as the local port of another
// test's connection, so a server could not serve its metrics there.
int FreePortRun(int count) {
  std::mt19937 random(static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())) ^ static_cast<uint32_t>(getpid()));
  std::uniform_int_distribution<int> bases(20000, 32000 - count);
  auto bindable = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
    close(fd);
    return ok;
  };
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = bases(random);
    bool free = true;
    for (int i = 0; free && i < count; ++i) free = bindable(base + i);
    if (free) return base;
  }
  return 0;
}

// README and `shardps bench --help`: "server i on PORT + i". The servers
// were started in order but took their indices in the order they
// registered, so server 0's metrics could be on PORT + 1
// (deploy/metrics_check.sh reads them by port).
TEST(BenchMetricsTest, BenchServerIServesItsMetricsOnPortPlusI) {
  constexpr int kServers = 3;
  const int base = FreePortRun(kServers);
  ASSERT_NE(base, 0);
  auto bench = Spawn("bench", {SHARDPS_BINARY, "bench", "--servers", absl::StrCat(kServers), "--workers", "1",
                               "--bytes", "4096", "--iters", "30000", "--metrics-listen",
                               absl::StrCat("127.0.0.1:", base)},
                     SpawnOptions::JobChild());
  ASSERT_TRUE(bench.ok()) << bench.status();
  for (int i = 0; i < kServers; ++i) {
    const std::string address = absl::StrCat("127.0.0.1:", base + i);
    std::string text;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
      auto answer = HttpGet(address, "/metrics");
      if (answer.ok() && answer->find("shardps_server_shard_map_epoch{") != std::string::npos) {
        text = *answer;
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_NE(text.find(absl::StrCat("shardps_server_shard_map_epoch{server=\"", i, "\"}")), std::string::npos)
        << address << " serves another server's metrics:\n" << text.substr(0, 2000);
  }
  Stop(*bench, absl::Seconds(10));
}

}  // namespace
}  // namespace shardps
