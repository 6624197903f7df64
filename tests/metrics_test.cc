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

#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/tensor_spec.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tools/daemon_metrics.h"
#include "worker/worker.h"

namespace shardps {
namespace {

// GET `path` from `address` (HOST:PORT, IPv4); the whole answer, headers and
// body, or an error.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
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
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  (void)write(fd, request.data(), request.size());
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, n);
  close(fd);
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

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(1);
    config.set_num_workers(1);
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

    server_metrics_ = MetricsRegistry::Create();
    auto exposer = MetricsExposer::Start("127.0.0.1:0", *server_metrics_);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    server_exposer_ = *std::move(exposer);
    auto server = ParameterServer::Create({.scheduler_address = scheduler_->address(),
                                           .bind_address = "tcp://127.0.0.1:0",
                                           .metrics = server_metrics_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    serving_ = std::thread([this] { (void)server_->Run(); });
    auto worker = Worker::Create({.scheduler_address = scheduler_->address(), .rank = 0});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    ASSERT_TRUE(worker_->DefineTensors({Float32Tensor("w", 1024)}).ok());
  }

  void TearDown() override {
    worker_.reset();
    if (server_) server_->RequestStop();
    if (serving_.joinable()) serving_.join();
    server_.reset();
    server_exposer_.reset();
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

  // Scrapes the server until `series` reaches `at_least` (the engine thread
  // publishes every 100 ms); returns the last value read.
  double ScrapeUntil(const std::string& series, double at_least) {
    double value = -1;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      auto text = HttpGet(server_exposer_->address(), "/metrics");
      EXPECT_TRUE(text.ok()) << text.status();
      if (!text.ok()) return value;
      value = Sample(*text, series).value_or(-1);
      if (value >= at_least) return value;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return value;
  }

  std::unique_ptr<SchedulerDaemon> scheduler_;
  std::unique_ptr<MetricsRegistry> scheduler_metrics_, server_metrics_;
  std::unique_ptr<MetricsExposer> scheduler_exposer_, server_exposer_;
  std::unique_ptr<ParameterServer> server_;
  std::thread serving_;
  std::unique_ptr<Worker> worker_;
};

TEST_F(MetricsTest, ServerCountersGrowWithPushPulls) {
  const std::string push_pulls = R"(shardps_server_requests_total{op="push_pull",server="0"})";
  PushPull(5);
  EXPECT_EQ(ScrapeUntil(push_pulls, 5), 5);
  PushPull(7);
  EXPECT_EQ(ScrapeUntil(push_pulls, 12), 12);
  auto text = HttpGet(server_exposer_->address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sample(*text, R"(shardps_server_updates_total{server="0"})"), 12);
  EXPECT_EQ(Sample(*text, R"(shardps_server_received_bytes_total{server="0"})"), 12 * 4096);
  EXPECT_EQ(Sample(*text, R"(shardps_server_errors_total{code="invalid_argument",server="0"})"), 0);
  EXPECT_EQ(Sample(*text, R"(shardps_server_shard_map_epoch{server="0"})"), 1);
  EXPECT_EQ(Sample(*text, R"(shardps_server_request_handling_seconds_count{server="0"})"), 12);
  // Every push says which weights it was computed on; in sync none is stale.
  EXPECT_EQ(Sample(*text, R"(shardps_server_gradients_total{server="0"})"), 12);
  EXPECT_EQ(Sample(*text, R"(shardps_server_gradient_staleness_rounds_total{server="0"})"), 0);
}

TEST_F(MetricsTest, ServerAnswersHealthProbe) {
  auto text = HttpGet(server_exposer_->address(), "/healthz");
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
