// The defects an attacker found with an independent client (issue 12), each
// against real scheduler and server processes: forged request ids, NaN
// gradients, bad and stolen addresses, duplicate ranks, oversized models,
// calls that block, bad ports, a reader that never reads, and connections
// that send nothing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <thread>

#include <zmq.hpp>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/data_message.h"
#include "common/protocol.h"
#include "common/scheduler_client.h"
#include "common/tensor_spec.h"
#include "scheduler/scheduler.h"
#include "tests/sanitizer_slowdown.h"
#include "tests/test_cluster.h"
#include "tools/train/fashion_mnist.h"
#include "tools/train/mlp.h"
#include "worker/c_api.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Threads of process `pid` (/proc/PID/task).
size_t ThreadCount(pid_t pid) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) ++n;
  return n;
}

// Runs a shell command; returns its exit status and output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  return {pclose(pipe), out};
}

// One async server holding tensor "w" (kN floats at 7.0), worker 0 in the
// test, and a raw ZeroMQ client that plays an attacker.
class AttackedServerTest : public ::testing::Test {
 protected:
  static constexpr int kN = 64;

  void StartCluster(ClusterConfig config, int n = kN) {
    n_ = n;
    auto started = StartWithRawClient(config, n, 7.0f, context_);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(started->cluster);
    worker_ = std::move(started->worker);
    socket_ = std::move(started->socket);
  }

  static ClusterConfig AsyncSgd() {
    ClusterConfig config;
    config.set_consistency(ASYNC);
    config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    config.mutable_optimizer()->set_learning_rate(1.0f);
    // Plain arithmetic on the weights: pushes without pulls in between are
    // stale, and would otherwise get smaller steps.
    config.set_staleness_aware_lr(false);
    return config;
  }

  DataHeader Forged(Op op, uint64_t request_id) {
    DataHeader h;
    h.set_protocol_version(kProtocolVersion);
    h.set_op(op);
    h.set_epoch(1);
    h.set_partition_id(0);
    h.set_worker_rank(0);
    h.set_request_id(request_id);
    h.set_dtype(FLOAT32);
    h.set_num_elements(n_);
    return h;
  }

  DataHeader Exchange(const DataHeader& h, const std::vector<float>& payload) {
    const std::string head = h.SerializeAsString();
    socket_.send(zmq::buffer(head), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t answer;
    EXPECT_TRUE(socket_.recv(answer).has_value()) << "no answer from the server";
    DataHeader out;
    out.ParseFromArray(answer.data(), answer.size());
    while (answer.more()) (void)socket_.recv(answer);
    return out;
  }

  std::vector<float> Weights() {
    std::vector<float> out(n_);
    auto h = worker_->Pull("w", absl::MakeSpan(out));
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(worker_->Wait(*h, absl::Seconds(10)).ok());
    return out;
  }

  void PushOnes() {
    std::vector<float> g(n_, 1.0f);
    auto h = worker_->Push("w", g);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(worker_->Wait(*h, absl::Seconds(10)).ok());
  }

  int n_ = kN;
  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Worker> worker_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

TEST_F(AttackedServerTest, AForgedRequestIdDoesNotMakeTheServerDropTheWorkersLaterPushes) {
  StartCluster(AsyncSgd());
  DataHeader answer = Exchange(Forged(PUSH, std::numeric_limits<uint64_t>::max()), std::vector<float>(kN, 0.0f));
  EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer.error(), HasSubstr("request id 18446744073709551615 from worker 0"));
  // Every push of the real worker 0 is applied: 7 - 5 * 1.0.
  for (int i = 0; i < 5; ++i) PushOnes();
  EXPECT_EQ(Weights(), std::vector<float>(kN, 2.0f)) << "pushes after the forged id were dropped";
}

TEST_F(AttackedServerTest, NonFiniteGradientsAreRefusedWithAnErrorAndChangeNoWeight) {
  StartCluster(AsyncSgd());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> g(kN, 0.5f);
    g[3] = bad;
    DataHeader answer = Exchange(Forged(PUSH, 5), g);
    EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(answer.error(), HasSubstr("at element 3"));
    EXPECT_THAT(answer.error(), HasSubstr("reject_non_finite"));
  }
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
  // The worker's own push error says the same.
  std::vector<float> g(kN, std::numeric_limits<float>::quiet_NaN());
  auto h = worker_->Push("w", g);
  ASSERT_TRUE(h.ok());
  absl::Status s = worker_->Wait(*h, absl::Seconds(10));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("nan"));
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f));
}

TEST_F(AttackedServerTest, AReaderThatNeverReadsCannotGrowTheServer) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine keeps freed blocks resident (256 MiB by default), so a
  // server's RSS says nothing about what it holds; the plain build measures it.
  GTEST_SKIP() << "RSS bounds are not measurable under AddressSanitizer";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "RSS bounds are not measurable under AddressSanitizer";
#endif
#endif
  constexpr int kBig = 1 << 20;  // 4 MiB partition
  ClusterConfig config = AsyncSgd();
  config.set_partition_bytes(4 << 20);
  config.mutable_optimizer()->set_learning_rate(1e-6f);
  config.mutable_limits()->set_max_inflight_bytes_per_worker(16 << 20);
  config.mutable_limits()->set_socket_receive_hwm(4);
  StartCluster(config, kBig);
  const uint64_t before = ResidentBytes(cluster_->server_pid(0));
  // 200 push-pulls (800 MiB of answers) sent, none read.
  const std::string head = Forged(PUSH_PULL, 0).SerializeAsString();
  const std::vector<float> g(kBig, 1.0f);
  socket_.set(zmq::sockopt::sndtimeo, 2000);
  for (uint64_t i = 0; i < 200; ++i) {
    DataHeader h = Forged(PUSH_PULL, 10 + i);
    const std::string bytes = h.SerializeAsString();
    if (!socket_.send(zmq::buffer(bytes), zmq::send_flags::sndmore)) break;
    (void)socket_.send(zmq::buffer(g), zmq::send_flags::none);
  }
  // The server still answers a legitimate worker...
  PushOnes();
  EXPECT_EQ(Weights().size(), static_cast<size_t>(kBig));
  // ...and holds at most the in-flight limit, a few queued requests and one
  // copy of the weights more than before, not 800 MiB of answers.
  const uint64_t after = ResidentBytes(cluster_->server_pid(0));
  EXPECT_LT(after, before + (120u << 20)) << "server RSS grew from " << before << " to " << after << " bytes";
}

// TCP connections to `address` (tcp://IP:PORT) from `source`, that send
// nothing; -1 for one that could not connect.
std::vector<int> OpenIdleConnections(const std::string& address, const char* source, int count) {
  const size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(std::stoi(address.substr(colon + 1)));
  inet_pton(AF_INET, address.substr(6, colon - 6).c_str(), &to.sin_addr);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      close(fd);
      fd = -1;
    }
    fds.push_back(fd);
  }
  return fds;
}

// How many of `fds` the other end closes within `wait` (each closed one is
// closed here too, and set to -1).
int ClosedByPeerWithin(std::vector<int>& fds, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  int closed = 0;
  while (absl::Now() < deadline) {
    std::vector<pollfd> open;
    for (int fd : fds) {
      if (fd >= 0) open.push_back(pollfd{.fd = fd, .events = POLLIN, .revents = 0});
    }
    if (open.empty() || poll(open.data(), open.size(), 100) <= 0) continue;
    for (const pollfd& p : open) {
      char byte[64];
      // The server's ZeroMQ greeting arrives first: only the end counts.
      if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0 || read(p.fd, byte, sizeof(byte)) > 0) continue;
      close(p.fd);
      *std::find(fds.begin(), fds.end(), p.fd) = -1;
      ++closed;
    }
  }
  return closed;
}

// Anyone who reaches a server's data port could open connections and send
// nothing: ZeroMQ kept each (about 35 KB and a descriptor) until the
// server's RLIMIT_NOFILE refused the workers' own. A connection past
// limits.max_connections_per_address from one address is closed at once.
TEST_F(AttackedServerTest, IdleConnectionsPastThePerAddressLimitAreClosedAndTheWorkerTrainsOn) {
  ClusterConfig config = AsyncSgd();
  config.mutable_limits()->set_max_connections_per_address(8);
  StartCluster(config);
  auto addresses = cluster_->ServerAddresses();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  // From another loopback address than the worker's and the raw client's.
  std::vector<int> idle = OpenIdleConnections((*addresses)[0], "127.0.0.2", 40);
  ASSERT_EQ(absl::c_count(idle, -1), 0) << "connections the kernel refused";
  // Well within ZeroMQ's own handshake timeout (10 s), which would close them too.
  const int closed = ClosedByPeerWithin(idle, absl::Seconds(3));
  EXPECT_EQ(closed, 40 - 8) << "connections from one address past the limit of 8 still open";
  PushOnes();
  EXPECT_EQ(Weights(), std::vector<float>(kN, 6.0f));
  for (int fd : idle) {
    if (fd >= 0) close(fd);
  }
}

// A ZeroMQ client that completes its handshake and sends nothing answers
// the server's heartbeats, so ZeroMQ never closed its connection. One that
// carries no valid message within the longer of heartbeat_timeout_ms and
// request_timeout_ms is closed; one that did stays.
TEST_F(AttackedServerTest, AConnectionThatSendsNoValidMessageIsClosedAfterTheDeadline) {
  ClusterConfig config = AsyncSgd();
  config.set_heartbeat_interval_ms(500);
  config.set_heartbeat_timeout_ms(2000);
  config.set_request_timeout_ms(2000);
  config.mutable_limits()->set_max_idle_connections(0);  // the job's nodes all send: none is its
  StartCluster(config);
  auto addresses = cluster_->ServerAddresses();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  // The raw client's connection carries a valid (plain) request, answered.
  (void)Exchange(Forged(PULL, 1), {});
  auto watched = WatchConnections(context_, socket_, "inproc://raw-client", ZMQ_EVENT_DISCONNECTED);
  ASSERT_TRUE(watched.ok()) << watched.status();
  zmq::socket_t idle(context_, zmq::socket_type::dealer);
  idle.set(zmq::sockopt::linger, 0);
  idle.set(zmq::sockopt::reconnect_ivl, -1);  // one connection, not made again
  auto idle_watched =
      WatchConnections(context_, idle, "inproc://idle-client", ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED);
  ASSERT_TRUE(idle_watched.ok()) << idle_watched.status();
  const absl::Time start = absl::Now();
  idle.connect((*addresses)[0]);
  std::vector<uint16_t> events;
  while (absl::c_count(events, ZMQ_EVENT_DISCONNECTED) == 0 && absl::Now() - start < absl::Seconds(8)) {
    absl::SleepFor(absl::Milliseconds(50));
    for (uint16_t e : TakeConnectionEvents(*idle_watched)) events.push_back(e);
  }
  ASSERT_THAT(events, ::testing::Contains(ZMQ_EVENT_HANDSHAKE_SUCCEEDED)) << "the idle client never got in";
  EXPECT_THAT(events, ::testing::Contains(ZMQ_EVENT_DISCONNECTED)) << "an idle connection open after 8 s";
  EXPECT_GE(absl::Now() - start, absl::Seconds(2)) << "closed before its deadline";
  EXPECT_THAT(TakeConnectionEvents(*watched), Not(::testing::Contains(ZMQ_EVENT_DISCONNECTED)))
      << "the connection that carried a valid request was closed";
  PushOnes();
  EXPECT_EQ(Weights(), std::vector<float>(kN, 6.0f));
  (void)zmq_socket_monitor(idle.handle(), nullptr, 0);
  (void)zmq_socket_monitor(socket_.handle(), nullptr, 0);
}

// The deadline cannot tell a worker with nothing to send a server from an
// attacker: past limits.max_idle_connections (a flood of idle ones), its
// connection to a server that holds only a backup is closed each deadline.
// Its socket connects again by itself, and once that server becomes the
// primary (the other stopped) the worker's requests reach it.
TEST(IdleConnectionTest, AWorkersConnectionClosedForCarryingNothingCarriesItsRequestsOnceItHasSome) {
  ClusterConfig config;
  config.set_num_servers(2);
  config.set_num_workers(1);
  config.set_heartbeat_interval_ms(500);
  config.set_heartbeat_timeout_ms(2000);
  config.set_request_timeout_ms(2000);  // the deadline: 2 s
  config.mutable_limits()->set_max_idle_connections(0);  // as under a flood of idle ones
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Float32Tensor("w", 64)}).ok());  // one partition
  ASSERT_TRUE((*worker)->InitTensor("w", std::vector<float>(64, 1.0f), absl::Seconds(10)).ok());
  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto status = (*client)->Status(absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->shard_map().partitions_size(), 1);
  const uint32_t primary = status->shard_map().partitions(0).server();
  // The connection to the backup is closed twice meanwhile.
  absl::SleepFor(absl::Seconds(5));
  std::vector<float> out(64);
  auto pulled = (*worker)->Pull("w", absl::MakeSpan(out));
  ASSERT_TRUE(pulled.ok());
  ASSERT_TRUE((*worker)->Wait(*pulled, absl::Seconds(10)).ok());
  ASSERT_EQ((*cluster)->StopServer(primary), 0);
  std::vector<float> g(64, 0.5f);
  auto pushed = (*worker)->PushPull("w", g, absl::MakeSpan(out));
  ASSERT_TRUE(pushed.ok());
  absl::Status s = (*worker)->Wait(*pushed, absl::Seconds(15));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(RegisterTest, InvalidUnreachableAndStolenAddressesAndDuplicateRanksAreRefused) {
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto addresses = (*cluster)->ServerAddresses();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok());
  auto server = [](const std::string& address) {
    RegisterRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_role(SERVER);
    r.set_data_address(address);
    return r;
  };
  struct Case {
    std::string address, expect;
  };
  for (const Case& c : std::vector<Case>{{"not-an-endpoint", "is not tcp://host:port"},
                                         {"tcp://127.0.0.1:99999", "no valid port"},
                                         {"tcp://no-such-host.invalid:5000", "does not resolve"},
                                         {"tcp://127.0.0.1:1",
                                          "not reachable: Connection refused (seen from the scheduler"},
                                         {(*addresses)[0], "is alive"}}) {
    auto r = (*client)->Register(server(c.address), absl::Seconds(10));
    ASSERT_FALSE(r.ok()) << c.address;
    EXPECT_THAT(r.status().message(), HasSubstr(c.expect)) << c.address;
    EXPECT_THAT(r.status().message(), Not(HasSubstr("cannot reach the scheduler"))) << c.address;
  }
  // Rank 0 waits for rank 1; a second rank 0 is refused at once.
  RegisterRequest rank0;
  rank0.set_protocol_version(kProtocolVersion);
  rank0.set_role(WORKER);
  rank0.set_rank(0);
  std::thread first([&] {
    auto r = (*client)->Register(rank0, absl::Seconds(30));
    EXPECT_TRUE(r.ok()) << r.status();
  });
  bool waiting = false;
  while (!waiting) {
    auto status = (*client)->Status(absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << status.status();
    for (const NodeStatus& n : status->nodes()) waiting |= n.role() == WORKER;
  }
  auto dup = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.status().message(), HasSubstr("worker rank 0 is already registered"));
  auto second = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 1});
  EXPECT_TRUE(second.ok()) << second.status() << " (the real nodes still form the cluster)";
  first.join();
}

// A cluster of one server and two workers whose rank 1 registered raw and
// never heartbeats (a process about to be SIGKILLed), with tensors defined
// by rank 0, which it returns.
absl::StatusOr<std::unique_ptr<Worker>> StartWithASilentRankOne(TestCluster& cluster) {
  auto client = SchedulerClient::Create(cluster.scheduler_address());
  if (!client.ok()) return client.status();
  RegisterRequest rank1;
  rank1.set_protocol_version(kProtocolVersion);
  rank1.set_role(WORKER);
  rank1.set_rank(1);
  absl::Status raw;
  std::thread silent([&] { raw = (*client)->Register(rank1, absl::Seconds(30)).status(); });
  auto rank0 = Worker::Create({.scheduler_address = cluster.scheduler_address(), .rank = 0});
  silent.join();
  if (!raw.ok()) return raw;
  if (!rank0.ok()) return rank0.status();
  if (absl::Status s = (*rank0)->DefineTensors({Float32Tensor("w", 4)}); !s.ok()) return s;
  return rank0;
}

// Heartbeats every 0.2 s, a node declared dead after 2 s of silence.
ClusterConfig FastHeartbeats(int servers, int workers) {
  ClusterConfig config;
  config.set_num_servers(servers);
  config.set_num_workers(workers);
  config.set_heartbeat_interval_ms(200);
  config.set_heartbeat_timeout_ms(2000);
  return config;
}

TEST(RegisterTest, ANewProcessForARankStillHeldWaitsForTheOldOneToBeDeclaredDeadThenRejoins) {
  // A pod or script started again at once for a killed rank: it used to be
  // refused ("already registered") until the old process was declared dead.
  auto cluster = TestCluster::Start(FastHeartbeats(1, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto rank0 = StartWithASilentRankOne(**cluster);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  auto again = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 1,
                               .rendezvous_timeout = absl::Seconds(60)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT((*again)->rejoin().round, 0u) << "taken as a rejoin of the running job";
}

TEST(RegisterTest, ATrainingWorkerStoppedWithSigtermLeavesTheJobRatherThanFallSilent) {
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(1);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string progress = std::filesystem::temp_directory_path() / absl::StrCat("sigterm-progress-", getpid());
  std::filesystem::remove(progress);
  auto train = Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", (*cluster)->scheduler_address(), "--epochs",
                               "100", "--train-limit", "3200", "--test-limit", "100", "--log-every", "0",
                               "--progress-file", progress},
                     true);
  ASSERT_TRUE(train.ok()) << train.status();
  int64_t steps = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60); steps < 5 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
    std::ifstream(progress) >> steps;
  }
  ASSERT_GE(steps, 5);
  kill(train->pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(train->pid, &status, 0), train->pid);
  EXPECT_TRUE(WIFEXITED(status)) << "ended by the signal, not by leaving";
  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok());
  auto cluster_status = (*client)->Status(absl::Seconds(5));
  ASSERT_TRUE(cluster_status.ok()) << cluster_status.status();
  bool left = false;
  for (const NodeStatus& n : cluster_status->nodes()) left |= n.role() == WORKER && n.left();
  EXPECT_TRUE(left) << cluster_status->ShortDebugString();
  std::filesystem::remove(progress);
}

// Worker rank `rank` (server index `rank` with role SERVER) as the
// scheduler's status lists it; nullopt if not listed (or no status).
std::optional<NodeStatus> WorkerStatus(TestCluster& cluster, uint32_t rank, Role role = WORKER) {
  auto client = SchedulerClient::Create(cluster.scheduler_address());
  if (!client.ok()) return std::nullopt;
  auto status = (*client)->Status(absl::Seconds(5));
  if (!status.ok()) return std::nullopt;
  for (const NodeStatus& n : status->nodes()) {
    if (n.role() == role && n.rank() == rank) return n;
  }
  return std::nullopt;
}

// Whether process `pid` exits within `wait` (its wait status in `*status`);
// SIGKILLed and reaped if not.
bool ExitsWithin(pid_t pid, absl::Duration wait, int* status) {
  for (const absl::Time deadline = absl::Now() + wait; absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
    if (waitpid(pid, status, WNOHANG) == pid) return true;
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

TEST(RegisterTest, ATrainingWorkerStoppedWithSigtermWhileWaitingForTheClusterExitsAtOnce) {
  // Rank 1 never comes: rank 0 waits in the rendezvous (60 s). A SIGTERM or
  // Ctrl-C then must end it now, as before `shardps train` took the signals
  // for a leave between steps, not once the cluster forms or the wait ends.
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto train = Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", (*cluster)->scheduler_address(), "--rank", "0",
                               "--rendezvous-timeout", "60", "--train-limit", "3200", "--test-limit", "100"},
                     true);
  ASSERT_TRUE(train.ok()) << train.status();
  bool waiting = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); !waiting && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
    waiting = WorkerStatus(**cluster, 0).has_value();
  }
  ASSERT_TRUE(waiting) << "rank 0 never registered";
  kill(train->pid, SIGTERM);
  int status = 0;
  EXPECT_TRUE(ExitsWithin(train->pid, absl::Seconds(10), &status)) << "still waiting for the cluster 10 s after SIGTERM";
}

TEST(RegisterTest, AServerStoppedWithSigtermWhileItCannotReachTheSchedulerExitsAtOnce) {
  // No scheduler listens (one that died as it registered the server, and
  // stays away): the server retries registering for --register-timeout.
  // A SIGTERM (systemctl stop, a pod deleted) must end it now, cleanly.
  auto server = Spawn("server", {SHARDPS_BINARY, "server", "--scheduler", "127.0.0.1:1", "--register-timeout", "60"},
                      true);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::SleepFor(absl::Seconds(1));
  kill(server->pid, SIGTERM);
  int status = 0;
  ASSERT_TRUE(ExitsWithin(server->pid, absl::Seconds(10), &status)) << "still registering 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(RegisterTest, AServerStoppedAsTheSchedulerRegistersItLeavesTheJobInsteadOfFallingSilent) {
  // The scheduler stalls (SIGSTOP) while a server joins the running job;
  // the SIGTERM comes as the server still waits, and the scheduler answers
  // soon after. Before, the server ended at once, registered or not: the
  // scheduler, which had registered it, found it silent a heartbeat timeout
  // later and declared it dead.
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(1);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Float32Tensor("w", 16)}).ok());
  ASSERT_EQ(kill((*cluster)->scheduler_pid(), SIGSTOP), 0);
  ASSERT_TRUE((*cluster)->AddServer().ok());
  absl::SleepFor(absl::Seconds(1));  // its register call is sent, unanswered
  kill((*cluster)->server_pid(1), SIGTERM);
  absl::SleepFor(absl::Milliseconds(300));  // the stop is seen (every 50 ms) before the answer
  ASSERT_EQ(kill((*cluster)->scheduler_pid(), SIGCONT), 0);
  std::optional<NodeStatus> joined;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    joined = WorkerStatus(**cluster, 1, SERVER);
    if (joined && joined->left()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(joined.has_value()) << "the scheduler never registered server 1";
  EXPECT_TRUE(joined->left()) << "registered, then silent: " << joined->ShortDebugString();
  EXPECT_EQ((*cluster)->StopServer(1), 0);
}

TEST(RegisterTest, ATrainingWorkerThatStopsOnAnErrorLeavesAsFailedWithIt) {
  // The two ranks define different models (--hidden): the one that defines
  // second fails on the mismatch, exits 1, and must be listed as failed
  // with why, as a Python job is (shardps_fail), not as a worker that ended.
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<ChildProcess> trains;
  for (const char* hidden : {"32", "16"}) {
    const std::string rank = std::to_string(trains.size());
    auto train = Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", (*cluster)->scheduler_address(), "--rank", rank,
                                 "--hidden", hidden, "--train-limit", "320", "--test-limit", "100", "--log-every", "0"},
                       true);
    ASSERT_TRUE(train.ok()) << train.status();
    trains.push_back(*std::move(train));
  }
  int code = 0;
  auto failed = WaitAny(trains, absl::Now() + absl::Seconds(60), &code);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_NE(code, 0);
  // The leave is sent before the process exits; on a loaded machine the
  // scheduler may apply it a moment after answering.
  std::optional<NodeStatus> worker;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    worker = WorkerStatus(**cluster, static_cast<uint32_t>(*failed));
    if (worker && worker->left()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (ChildProcess& t : trains) Kill(t);  // the other waits for the model
  ASSERT_TRUE(worker.has_value());
  EXPECT_TRUE(worker->left()) << worker->ShortDebugString();
  EXPECT_THAT(worker->left_error(), HasSubstr("differs from the defined")) << worker->ShortDebugString();
}

std::string FileText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `shardps drain --server 2 --wait 60` against a job of two servers and a
// third that joined, with server 2 stopped (SIGSTOP) once the drain is under
// way: it sends none of its copies and hands off no primary, so the drain
// stays under way. `drain_` is the command, its output in `Out()`/`Err()`.
class DrainWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(2);
    config.set_num_workers(1);
    config.set_heartbeat_timeout_ms(3000);
    auto cluster = TestCluster::Start(config);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    auto worker = Worker::Create({.scheduler_address = cluster_->scheduler_address(), .rank = 0});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    std::vector<TensorSpec> tensors;
    for (int t = 0; t < 6; ++t) tensors.push_back(Float32Tensor(absl::StrCat("w", t), 1 << 20));
    ASSERT_TRUE(worker_->DefineTensors(tensors).ok());
    // A third server joins the running job: server index 2 is the process
    // started third, and copies move to it.
    ASSERT_TRUE(cluster_->AddServer().ok());
    for (const absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;) {
      before_ = WorkerStatus(*cluster_, 2, SERVER);
      if (before_ && before_->copies() > 0 && before_->copies_synced() == before_->copies()) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(before_ && before_->copies() > 0 && before_->copies_synced() == before_->copies())
        << (before_ ? before_->ShortDebugString() : "server 2 not listed");
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    out_ = absl::StrCat(testing::TempDir(), "/", name, ".out");
    err_ = absl::StrCat(testing::TempDir(), "/", name, ".err");
    std::filesystem::remove(out_);  // a previous run's
    std::filesystem::remove(err_);
    auto drain = Spawn("drain", {"/bin/sh", "-c", absl::StrCat("exec ", SHARDPS_BINARY, " drain --scheduler ",
                                                              cluster_->scheduler_address(),
                                                              " --server 2 --wait 60 >", out_, " 2>", err_)},
                       false);
    ASSERT_TRUE(drain.ok()) << drain.status();
    drain_ = *drain;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
         absl::Now() < deadline && Out().find("drains from") == std::string::npos;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(kill(cluster_->server_pid(2), SIGSTOP), 0);
    ASSERT_THAT(Out(), HasSubstr("server 2 drains from shard map epoch")) << Err();
  }
  std::string Out() const { return FileText(out_); }
  std::string Err() const { return FileText(err_); }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Worker> worker_;
  std::optional<NodeStatus> before_;  // server 2, synced, before the drain
  ChildProcess drain_;
  std::string out_, err_;
};

TEST_F(DrainWaitTest, AServerThatDiesWhileItDrainsAndIsReplacedIsSaidToHaveDied) {
  // `shardps drain --wait` reads the status every 100 ms. Where the drained
  // server died and another took its place between two reads (a restarted
  // pod at the same place), it said "drained and stopped": it saw only a
  // new node at the index. The newcomer's status now says how its
  // predecessor ended.
  ASSERT_EQ(kill(drain_.pid, SIGSTOP), 0);  // the command misses what follows
  ASSERT_EQ(kill(cluster_->server_pid(2), SIGKILL), 0);
  std::optional<NodeStatus> dead;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;) {
    dead = WorkerStatus(*cluster_, 2, SERVER);
    if (dead && dead->declared_dead()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(dead && dead->declared_dead()) << (dead ? dead->ShortDebugString() : "not listed");
  ASSERT_TRUE(cluster_->AddServer().ok());
  std::optional<NodeStatus> newcomer;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(15); absl::Now() < deadline;) {
    newcomer = WorkerStatus(*cluster_, 2, SERVER);
    if (newcomer && newcomer->node_id() != before_->node_id()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(newcomer && newcomer->node_id() != before_->node_id()) << "no server took server 2's place";
  EXPECT_EQ(newcomer->replaced(), "declared dead");
  ASSERT_EQ(kill(drain_.pid, SIGCONT), 0);
  int status = 0;
  ASSERT_TRUE(ExitsWithin(drain_.pid, absl::Seconds(20), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << ": " << Out();
  EXPECT_THAT(Err(), HasSubstr("died while it drained"));
  EXPECT_THAT(Err(), HasSubstr("has taken its place"));
  EXPECT_THAT(Out(), Not(HasSubstr("drained and stopped")));
}

TEST_F(DrainWaitTest, ASchedulerRestartedWithoutItsStateIsNotTakenForADrainDone) {
  // review17: a scheduler restarted without its --state-dir lists no server
  // 2 (or another process at index 2), and the command said "drained and
  // stopped" of a server that was neither. It now sees another job's id.
  cluster_->KillScheduler();
  ASSERT_TRUE(cluster_->RestartScheduler(/*keep_state=*/false).ok());
  int status = 0;
  ASSERT_TRUE(ExitsWithin(drain_.pid, absl::Seconds(20), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << ": " << Out();
  EXPECT_THAT(Err(), HasSubstr("restarted without its state"));
  EXPECT_THAT(Out(), Not(HasSubstr("drained and stopped")));
  ASSERT_EQ(kill(cluster_->server_pid(2), SIGCONT), 0);
}

TEST(RegisterTest, AWorkerLeavingOnAnErrorThatIsNotUtf8StillLeavesWithTheError) {
  // A C caller's error in Latin-1: sent as is in a proto3 string, the
  // scheduler could not parse the leave, and the worker fell silent instead.
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Worker>> workers[2];
  std::thread one([&] { workers[1] = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 1}); });
  workers[0] = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  one.join();
  ASSERT_TRUE(workers[0].ok()) << workers[0].status();
  ASSERT_TRUE(workers[1].ok()) << workers[1].status();
  (*workers[1])->SetLeavingError("loss is nan in caf\xe9.py");
  workers[1]->reset();
  const std::optional<NodeStatus> rank1 = WorkerStatus(**cluster, 1);
  ASSERT_TRUE(rank1.has_value());
  EXPECT_TRUE(rank1->left()) << rank1->ShortDebugString();
  EXPECT_EQ(rank1->left_error(), "loss is nan in caf\xef\xbf\xbd.py");
}

// Whether the scheduler lists a worker (registered, waiting for the cluster
// or not) by `deadline`, asked until it does (`want`) or does not.
bool ListsAWorkerBy(SchedulerClient& client, bool want, absl::Time deadline) {
  for (;;) {
    bool listed = false;
    if (auto status = client.Status(absl::Seconds(5)); status.ok()) {
      for (const NodeStatus& n : status->nodes()) listed |= n.role() == WORKER;
    }
    if (listed == want || absl::Now() >= deadline) return listed;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// A cluster of one server and two workers where `shardps train --rank 0`
// has registered and waits for rank 1.
struct TrainWaiting {
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<SchedulerClient> client;
  ChildProcess train;
};
absl::StatusOr<TrainWaiting> StartTrainWaitingForTheCluster() {
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(2);
  TrainWaiting w;
  auto cluster = TestCluster::Start(config);
  if (!cluster.ok()) return cluster.status();
  w.cluster = *std::move(cluster);
  auto client = SchedulerClient::Create(w.cluster->scheduler_address());
  if (!client.ok()) return client.status();
  w.client = *std::move(client);
  auto train = Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", w.cluster->scheduler_address(), "--rank", "0",
                               "--train-limit", "320", "--test-limit", "100", "--log-every", "0"},
                     true);
  if (!train.ok()) return train.status();
  w.train = *train;
  if (!ListsAWorkerBy(*w.client, true, absl::Now() + absl::Seconds(30))) {
    return absl::DeadlineExceededError("shardps train did not register within 30 s");
  }
  return w;
}

TEST(RegisterTest, AWorkerKilledWhileWaitingForTheClusterFreesItsRankForAProcessStartedAgain) {
  // A pod restarted before the cluster formed: its new process was refused
  // at once ("already registered ... waiting for the cluster") for as long
  // as the dead process's Register call had left to wait (a minute), and a
  // cluster completed meanwhile formed with a rank whose process was gone.
  auto w = StartTrainWaitingForTheCluster();
  ASSERT_TRUE(w.ok()) << w.status();
  kill(w->train.pid, SIGKILL);
  waitpid(w->train.pid, nullptr, 0);
  EXPECT_FALSE(ListsAWorkerBy(*w->client, false, absl::Now() + absl::Seconds(5)))
      << "the killed process's rank is still registered";
  const std::string scheduler = w->cluster->scheduler_address();
  absl::StatusOr<std::unique_ptr<Worker>> again;
  std::thread rank0([&] { again = Worker::Create({.scheduler_address = scheduler, .rank = 0}); });
  auto rank1 = Worker::Create({.scheduler_address = scheduler, .rank = 1});
  rank0.join();
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(rank1.ok()) << rank1.status();
}

// Waits for each `shardps train` process, rank r at index r: each exits 0.
void ExpectEveryRankExitsZero(std::vector<ChildProcess>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(ranks[r].pid, &status, 0), ranks[r].pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ": " << status;
  }
}

TEST(RegisterTest, EveryWorkerStoppedAndStartedAgainAtOnceRejoinsAndTheJobFinishes) {
  // Each new process rejoined at a round a pace past the servers', which no
  // other worker would complete: both waited for it until their request
  // timeout and failed (a one-worker job restarted the same way too).
  ClusterConfig config = FastHeartbeats(2, 2);
  config.set_request_timeout_ms(20000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string progress = std::filesystem::temp_directory_path() / absl::StrCat("restart-all-", getpid());
  auto train = [&](int rank) {
    return Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", (*cluster)->scheduler_address(), "--rank",
                           absl::StrCat(rank), "--epochs", "2", "--train-limit", "6400", "--test-limit", "100",
                           "--log-every", "0", "--progress-file", absl::StrCat(progress, ".", rank)},
                 true);
  };
  std::vector<ChildProcess> first;
  for (int r = 0; r < 2; ++r) first.push_back(*train(r));
  int64_t steps = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60); steps < 30 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
    std::ifstream(absl::StrCat(progress, ".1")) >> steps;
  }
  ASSERT_GE(steps, 30);
  for (ChildProcess& p : first) kill(p.pid, SIGTERM);
  for (ChildProcess& p : first) waitpid(p.pid, nullptr, 0);
  std::vector<ChildProcess> again;
  for (int r = 0; r < 2; ++r) again.push_back(*train(r));
  ExpectEveryRankExitsZero(again);
  for (int r = 0; r < 2; ++r) std::filesystem::remove(absl::StrCat(progress, ".", r));
}

// How far the first processes of a job's ranks got before they all left.
enum class GoneAt { kRegistered, kDefined, kInitBarrierPassed };

// Both ranks of a two-server job register and, as `gone_at` says, define the
// MLP `shardps train --hidden 16` trains and pass the "init" barrier with
// rank 0's initial weights (seed 1); then both leave before any round, and
// two `shardps train` processes started for them at once both exit 0. The
// job runs 600 rounds: before 2026-11-25 the rank placed second went a pace
// past the first, and with 200 the first could finish the job before it.
void ExpectEveryWorkerGoneBeforeTheFirstRoundRejoins(GoneAt gone_at) {
  ClusterConfig config = FastHeartbeats(2, 2);
  config.set_request_timeout_ms(8000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string scheduler = (*cluster)->scheduler_address();
  auto model = train::Mlp::Create({train::kImagePixels, 16, train::kNumClasses});
  ASSERT_TRUE(model.ok()) << model.status();
  model->InitParams(1);
  std::vector<TensorSpec> specs;
  for (const train::TensorShape& t : model->tensors()) {
    specs.push_back(Float32Tensor(t.name, std::vector<int64_t>(t.dims.begin(), t.dims.end())));
  }
  auto first = [&](int rank) {
    auto w = Worker::Create({.scheduler_address = scheduler, .rank = static_cast<uint32_t>(rank)});
    ASSERT_TRUE(w.ok()) << w.status();
    if (gone_at == GoneAt::kRegistered) return;
    ASSERT_TRUE((*w)->DefineTensors(specs).ok());
    if (gone_at == GoneAt::kDefined) return;
    for (size_t t = 0; rank == 0 && t < specs.size(); ++t) {
      ASSERT_TRUE((*w)->InitTensor(specs[t].name(), model->params()[t], absl::Seconds(10)).ok());
    }
    ASSERT_TRUE((*w)->Barrier("init").ok());
  };  // the worker leaves the job as it is destroyed
  std::thread rank1(first, 1);
  first(0);
  rank1.join();
  auto train = [&](int rank) {
    return Spawn("train", {SHARDPS_BINARY, "train", "--scheduler", scheduler, "--rank", absl::StrCat(rank),
                           "--hidden", "16", "--seed", "1", "--epochs", "3", "--train-limit", "12800",
                           "--test-limit", "100", "--log-every", "0"},
                 true);
  };
  std::vector<ChildProcess> again;
  for (int r = 0; r < 2; ++r) again.push_back(*train(r));
  ExpectEveryRankExitsZero(again);
}

TEST(RegisterTest, EveryWorkerGoneBeforeTheTensorsWereDefinedIsTakenBackAndTheJobFinishes) {
  // Every worker killed between the rendezvous and DefineTensors: the new
  // processes were refused at once while the old ones were heard, and for
  // good once they were removed ("a rank can rejoin only a job that is
  // training"): the job could never go on.
  ExpectEveryWorkerGoneBeforeTheFirstRoundRejoins(GoneAt::kRegistered);
}

TEST(RegisterTest, EveryWorkerGoneBeforeTheInitBarrierRejoinsAndTheJobFinishes) {
  // All workers killed during define/init, started again at once: the first
  // rank back was placed at round 0 and took the "init" barrier, the other
  // at round 1 skipped it, and its first pull waited for round 0 until the
  // request timeout (the rank failed, the job went on without it).
  ExpectEveryWorkerGoneBeforeTheFirstRoundRejoins(GoneAt::kDefined);
}

TEST(RegisterTest, EveryWorkerGoneAfterTheInitBarrierBeforeAnyRoundRejoinsAndTheJobFinishes) {
  // The same once the "init" barrier had passed: the rank placed at round 0
  // took itself for a new job and entered the barrier again, which the
  // other, a rejoined rank, never did.
  ExpectEveryWorkerGoneBeforeTheFirstRoundRejoins(GoneAt::kInitBarrierPassed);
}

TEST(RegisterTest, AModelLargerThanTheLimitIsRefusedAndTheServerStaysUp) {
  ClusterConfig config;
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::Status s = (*worker)->DefineTensors({Float32Tensor("huge", int64_t{25} * 1000 * 1000 * 1000)});  // 100 GB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("limits.max_model_bytes"));
  EXPECT_TRUE((*worker)->DefineTensors({Float32Tensor("w", 16)}).ok()) << "a model that fits is still accepted";
  EXPECT_EQ((*cluster)->StopServer(0), 0) << "the server was not asked to allocate the model";
}

TEST(BlockedCallsTest, AThousandWaitingCallsDoNotCostTheSchedulerAThreadEach) {
  ClusterConfig config;
  config.set_num_servers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Server 1 never comes: stop it, so every DefineTensors waits for it.
  auto addresses = (*cluster)->ServerAddresses();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  ASSERT_EQ((*cluster)->StopServer(1), 0);
  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok());
  const size_t threads_before = ThreadCount((*cluster)->scheduler_pid());
  constexpr int kCalls = 1000;
  std::atomic<int> refused{0};
  std::vector<std::thread> callers;
  DefineTensorsRequest request;
  *request.add_tensors() = Float32Tensor("w", 16);
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&] {
      auto r = (*client)->DefineTensors(request, absl::Seconds(20));
      if (absl::IsResourceExhausted(r.status())) ++refused;
    });
  }
  // Measured while the admitted calls still wait (their deadline is 20 s).
  while (refused.load() < kCalls - 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const size_t threads_during = ThreadCount((*cluster)->scheduler_pid());
  for (std::thread& t : callers) t.join();
  std::cerr << "scheduler threads: " << threads_before << " before, " << threads_during << " with " << kCalls
            << " calls (" << refused.load() << " refused at once)\n";
  EXPECT_GE(refused.load(), kCalls - 200);
  EXPECT_LT(threads_during, threads_before + 250) << "scheduler threads: " << threads_before << " before, "
                                                  << threads_during << " with " << kCalls << " waiting calls";
}

TEST(BlockedCallsTest, EveryServerOfAClusterGrownPastItsConfigGetsShardMaps) {
  // The scheduler refuses calls that would wait beyond 4 x (servers + workers)
  // + 64. Before 2026-11-25 it counted the config's nodes only: in a cluster
  // grown by joins past that, the map watches of the servers that joined last
  // were refused ("72 calls already wait ...; refusing WatchShardMap"), those
  // servers never got a map, and the scheduler, which moves copies once every
  // server serves the latest map, moved none to any server again.
  ClusterConfig config;  // 1 server, 1 worker: 72 waiting calls
  config.set_num_servers(1);
  config.set_num_workers(1);
  config.set_heartbeat_timeout_ms(120000);  // the servers below send no heartbeat
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Float32Tensor("w", 16)}).ok());
  constexpr int kJoined = 80;
  zmq::context_t context;
  std::vector<zmq::socket_t> ports;  // the data ports the scheduler checks
  std::vector<std::shared_ptr<SchedulerClient>> clients;
  std::vector<std::unique_ptr<SchedulerClient::Watch>> watches;
  std::atomic<int> served{0}, refused{0};
  for (int i = 0; i < kJoined; ++i) {
    ports.emplace_back(context, zmq::socket_type::router);
    ports.back().bind("tcp://127.0.0.1:*");
    auto client = SchedulerClient::Create((*cluster)->scheduler_address());
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(*std::move(client));
    RegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_role(SERVER);
    request.set_data_address(ports.back().get(zmq::sockopt::last_endpoint));
    request.set_host("127.0.0.1");
    request.set_memory_bytes(uint64_t{1} << 34);
    auto registered = clients.back()->Register(request, absl::Seconds(10));
    ASSERT_TRUE(registered.ok()) << "server " << i << ": " << registered.status();
    auto first = std::make_shared<std::atomic<bool>>(false);
    watches.push_back(clients.back()->WatchShardMap(
        registered->node_id(), [&served, first](const ShardMap&) { served += first->exchange(true) ? 0 : 1; },
        [&refused](const absl::Status& s) { refused += absl::IsResourceExhausted(s) ? 1 : 0; }));
  }
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); served.load() < kJoined && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(served.load(), kJoined) << refused.load() << " watches refused as too many waiting calls";
  watches.clear();
}

// Runs `shardps ARGS` for each case: it must exit with `exit_code` (-1: any
// failure) and print the case's text.
void ExpectEachFails(const std::vector<std::pair<std::string, std::string>>& cases, int exit_code) {
  for (const auto& [args, expect] : cases) {
    auto [status, out] = RunCommand(std::string(SHARDPS_BINARY) + " " + args);
    EXPECT_NE(status, 0) << args << ": " << out;
    if (exit_code >= 0) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == exit_code) << args << ": " << out;
    }
    EXPECT_THAT(out, HasSubstr(expect)) << args;
  }
}

TEST(VersionTest, ShardpsVersionPrintsTheLibraryVersionAndTheWireProtocol) {
  auto [code, out] = RunCommand(std::string(SHARDPS_BINARY) + " --version");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, absl::StrCat("shardps ", shardps_version(), " (wire protocol ", kProtocolVersion, ")\n"));
}

TEST(ListenTest, ABadPortOrHostInAnyListenOrAddressFlagIsAnError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"scheduler --listen 127.0.0.1:99999", "'127.0.0.1:99999' has no valid port"},
      {"scheduler --listen 127.0.0.1:-5", "'127.0.0.1:-5' has no valid port"},
      {"scheduler --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:70000", "'127.0.0.1:70000' has no valid port"},
      {"server --scheduler 127.0.0.1:7000 --listen tcp://127.0.0.1:99999", "'127.0.0.1:99999' has no valid port"},
      {"server --scheduler 127.0.0.1:99999 --listen tcp://127.0.0.1:0", "'127.0.0.1:99999' has no valid port"},
      {"status --scheduler 127.0.0.1:99999", "'127.0.0.1:99999' has no valid port"},
      {"server --scheduler 127.0.0.1:7000 --advertise-host ''", "server advertise host: '' is not a host name"},
      {"server --scheduler 127.0.0.1:7000 --advertise-host a:b", "server advertise host: 'a:b' is not a host name"},
  };
  ExpectEachFails(cases, /*exit_code=*/-1);
}

TEST(ListenTest, ASecondSchedulerOnAPortInUseIsRefusedNotServedBesideTheFirst) {
  auto first = SchedulerDaemon::Create({.listen_address = "127.0.0.1:0", .config = ClusterConfig()});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SchedulerDaemon::Create({.listen_address = (*first)->address(), .config = ClusterConfig()});
  ASSERT_FALSE(second.ok()) << "a second scheduler serves " << (*first)->address() << " beside the first";
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on " + (*first)->address()));
  EXPECT_THAT(second.status().message(), HasSubstr("port in use"));
  ExpectEachFails({{"scheduler --listen 127.0.0.1:0 --metrics-listen " + (*first)->address(),
                    "cannot serve metrics on " + (*first)->address() + " (is the port in use"}},
                  /*exit_code=*/1);
}

TEST(CommandLineTest, AMissingSchedulerOrAMistypedFlagIsAUsageErrorNamingTheFlag) {
  ExpectEachFails({{"server --listen tcp://127.0.0.1:0", "shardps server: --scheduler is missing"},
                   {"train --rank 0", "shardps train: --scheduler is missing"},
                   {"scheduler --lisen 127.0.0.1:0", "shardps scheduler: unknown flag --lisen\n"},
                   {"status --scheduler", "shardps status: flag --scheduler needs a value"},
                   {"local --epochs -1", "shardps local: --epochs -1 is below 1"},
                   {"local --train-limit -5", "shardps local: --train-limit: -5 is below 0"},
                   {"train --scheduler 127.0.0.1:7000 --max-steps -1", "shardps train: --max-steps: -1 is below 0"},
                   {"local --hidden 256,,128", "hidden layer widths '256,,128' have an empty entry"},
                   {"launch --workers 1 python3", "the workers' command goes after --"},
                   {"status --watch --interval 0", "--interval 0 must be at least 0.1"},
                   {"server --scheduler 127.0.0.1:7000 --register-timeout -1", "--register-timeout -1 must be above 0"},
                   {"server --scheduler 127.0.0.1:7000 --metrics-max-partitions -3",
                    "--metrics-max-partitions: -3 is below 0"},
                   {"train --scheduler 127.0.0.1:7000 --rank -1", "--rank -1 is negative"}},
                  /*exit_code=*/2);
}

TEST(CommandLineTest, AWrongTrainingFlagIsAUsageErrorNamingTheFlagBeforeJoiningTheJob) {
  // Port 1: no scheduler listens; a check left until after joining would fail on the rendezvous instead.
  const std::string train = "train --scheduler 127.0.0.1:1 --rendezvous-timeout 2 ";
  ExpectEachFails({{"local --servers 0", "shardps local: --servers 0 is below 1"},
                   {"local --workers 0", "shardps local: --workers 0 is below 1"},
                   {"local --consistency fast", "shardps local: --consistency: "},
                   {"local --compression 3bit", "shardps local: --compression: codec spec \"3bit\""},
                   {"launch --compression 3bit -- true", "shardps launch: --compression: codec spec \"3bit\""},
                   {"local --restart-after -1", "shardps local: --restart-after -1 is below 0"},
                   // Said "config field 'checkpoint.every_rounds' needs checkpoint.dir", and a negative
                   // one was ignored.
                   {"local --checkpoint-every 100", "shardps local: --checkpoint-every needs --checkpoint-dir"},
                   {"local --checkpoint-every -5 --checkpoint-dir /tmp/c", "shardps local: --checkpoint-every: -5 is below 0"},
                   {"local --batch-size 30 --devices-per-worker 4",
                    "--batch-size 30 is not divisible by --devices-per-worker 4"},
                   {train + "--batch-size 0", "shardps train: --batch-size 0 is below 1"},
                   {train + "--eval-every -1", "shardps train: --eval-every -1 is below 0"},
                   {train + "--slow-factor 0.5", "shardps train: --slow-factor 0.5 is not in [1, 1000]"},
                   {train + "--hidden 256,x", "shardps train: --hidden: hidden layer width 'x'"},
                   // A device spec was read only with --devices-per-worker above 1, and then only
                   // after joining: one device named (deploy/k8s gpu: --devices cuda:0) was ignored.
                   {train + "--devices gpu:0", "shardps train: --devices: "},
                   {train + "--devices cpu:2", "shardps train: --devices 'cpu:2' names 2 devices; --devices-per-worker is 1"},
                   {train + "--metrics-listen 127.0.0.1:70000",
                    "shardps train: --metrics-listen: '127.0.0.1:70000' has no valid port"}},
                  /*exit_code=*/2);
}

TEST(CommandLineTest, ABenchmarksWrongIterationsOrModelNamesTheFlag) {
  ExpectEachFails({{"bench-codec --iters 0", "shardps bench-codec: --iters must be >= 1"},
                   {"bench-local --iters 0", "shardps bench-local: --iters must be >= 1"},
                   {"bench-checkpoint --hidden 256,x", "shardps bench-checkpoint: --hidden: hidden layer width 'x'"}},
                  /*exit_code=*/2);
}

TEST(CommandLineTest, ABenchDataCipherWithoutSecureOrUnknownIsRefused) {
  ExpectEachFails({{"bench --data-cipher curve", "shardps bench: --data-cipher needs --secure"},
                   {"bench --secure --data-cipher rc4", "shardps bench: --data-cipher 'rc4': say aes-256-gcm or curve"},
                   {"bench --data-cipher rc4", "shardps bench: --data-cipher needs --secure"}},
                  /*exit_code=*/2);
}

// Exit 2 for a command line that cannot run, as every command gives, before
// anything starts (bench and flood said 1, as for a failed run).
TEST(CommandLineTest, AFlagThatCannotRunIsAUsageErrorInBenchFloodStatusAndDrain) {
  ExpectEachFails({{"bench --bytes 6", "shardps bench: --bytes must be a positive multiple of 4"},
                   {"bench --op push", "shardps bench: --op 'push': allowed: pushpull, push-then-pull"},
                   {"bench --tensor-bytes 8", "shardps bench: --tensor-bytes and --rank need --scheduler"},
                   {"bench --scheduler 127.0.0.1:1 --tensor-bytes 8,x",
                    "shardps bench: --tensor-bytes: 'x' is not a positive multiple of 4"},
                   {"flood --in-flight 0", "shardps flood: --workers, --seconds and --in-flight must be >= 1"},
                   {"status --scheduler 127.0.0.1:99999", "'127.0.0.1:99999' has no valid port"},
                   {"drain --scheduler 127.0.0.1:1 --server 0 --cancel --wait 5",
                    "shardps drain: --wait does not go with --cancel"},
                   {"drain --scheduler 127.0.0.1:1 --server 0 --cancel --wait=0",
                    "shardps drain: --wait does not go with --cancel"},
                   {"drain --scheduler 127.0.0.1:1 --server 0 --wait -3", "shardps drain: --wait: -3 is not a number of seconds"},
                   {"checkpoint --scheduler 127.0.0.1:1 --dir /tmp/c --wait nan",
                    "shardps checkpoint: --wait: nan is not a number of seconds"},
                   {"bench --scheduler 127.0.0.1:99999", "shardps bench: scheduler address: '127.0.0.1:99999' has no valid port"}},
                  /*exit_code=*/2);
}

// README: a command line that cannot run exits 2, naming the flag; a --set
// that cannot apply said only the field, and the scheduler, bench and flood
// exited 1, as for a failed run.
TEST(CommandLineTest, ASetThatCannotApplyIsAUsageErrorNamingIt) {
  ExpectEachFails({{"scheduler --listen 127.0.0.1:0 --set bogus=1",
                    "shardps scheduler: --set bogus=1: unknown config field 'bogus'"},
                   {"scheduler --listen 127.0.0.1:0 --set consistency=weird",
                    "shardps scheduler: --set consistency=weird: config field 'consistency'"},
                   {"scheduler --listen 127.0.0.1:0 --set nope", "shardps scheduler: --set nope: "},
                   {"bench --set bogus=1", "shardps bench: --set bogus=1: unknown config field 'bogus'"},
                   {"flood --set bogus=1", "shardps flood: --set bogus=1: unknown config field 'bogus'"},
                   {"local --set bogus=1", "shardps local: --set bogus=1: unknown config field 'bogus'"},
                   {"launch --set bogus=1 -- true", "shardps launch: --set bogus=1: unknown config field 'bogus'"}},
                  /*exit_code=*/2);
}

// README: exit 2 for a command line that cannot run. The scheduler's flags
// that exclude or need each other exited 1, as for a failed run.
TEST(CommandLineTest, SchedulerFlagsThatCannotGoTogetherAreAUsageError) {
  ExpectEachFails({{"scheduler --listen 127.0.0.1:0 --etcd http://127.0.0.1:1 --state-dir /tmp/s",
                    "shardps scheduler: --etcd and --state-dir exclude each other"},
                   {"scheduler --listen 127.0.0.1:0 --etcd-prefix /p", "shardps scheduler: --etcd-prefix needs --etcd"},
                   {"scheduler --listen 127.0.0.1:0 --etcd-ca /tmp/ca.pem",
                    "shardps scheduler: --etcd-ca, --etcd-cert and --etcd-key need --etcd https://"},
                   {"scheduler --listen 127.0.0.1:0 --etcd https://127.0.0.1:1,http://127.0.0.1:2",
                    "mixes http:// and https:// endpoints"},
                   {"scheduler --listen 127.0.0.1:0 --etcd https://127.0.0.1:1",
                    "https:// endpoints need --etcd-ca"}},
                  /*exit_code=*/2);
}

// README: exit 2 naming the flag. A server's or training worker's address
// that cannot parse, and a daemon's --metrics-listen, exited 1, and a
// server's --listen was named "server listen address".
TEST(CommandLineTest, AnAddressFlagThatCannotParseIsAUsageErrorInEveryDaemon) {
  ExpectEachFails({{"server --scheduler bogus", "shardps server: scheduler address: 'bogus' is not host:port"},
                   {"server --scheduler 127.0.0.1:1 --listen bogus", "shardps server: --listen: 'bogus' is not tcp://"},
                   {"server --scheduler 127.0.0.1:1 --metrics-listen bogus",
                    "shardps server: --metrics-listen: 'bogus' is not host:port"},
                   {"train --scheduler bogus", "shardps train: scheduler address: 'bogus' is not host:port"},
                   {"scheduler --listen 127.0.0.1:0 --metrics-listen bogus",
                    "shardps scheduler: --metrics-listen: 'bogus' is not host:port"}},
                  /*exit_code=*/2);
}

// README: where no recipe keeps a lossy codec's accuracy, "one warning line says so";
// shardps local said it, then its scheduler said it again.
TEST(CommandLineTest, ALocalJobWarnsOnceThatNoRecipeKeepsAnAsyncCodecsAccuracy) {
  auto [status, out] = RunCommand(std::string(SHARDPS_BINARY) +
                                  " local --servers 1 --workers 1 --consistency async --compression 2bit"
                                  " --max-steps 2 --train-limit 64 --test-limit 10 --epochs 1");
  EXPECT_EQ(status, 0) << out;
  const std::string warning = "no measured recipe";
  size_t warnings = 0;
  for (size_t at = out.find(warning); at != std::string::npos; at = out.find(warning, at + 1)) ++warnings;
  EXPECT_EQ(warnings, 1u) << out;
}

// review17: below three heartbeat intervals a healthy node's last heartbeat
// may fall outside the window CheckLiveness counts as heard, and a late
// one is taken for a death; the scheduler says so when it starts.
TEST(CommandLineTest, ASchedulerWarnsOfAHeartbeatTimeoutShorterThanThreeIntervals) {
  const std::string job = std::string(SHARDPS_BINARY) +
                          " local --servers 1 --workers 1 --max-steps 2 --train-limit 64 --test-limit 10 --epochs 1";
  const std::string warning = "less than three heartbeat intervals";
  auto [status, out] = RunCommand(job + " --set heartbeat_interval_ms=1000 --set heartbeat_timeout_ms=2500");
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr(warning));
  EXPECT_THAT(out, HasSubstr("heartbeat_timeout_ms 2500"));
  auto [fine_status, fine] = RunCommand(job + " --set heartbeat_interval_ms=1000 --set heartbeat_timeout_ms=3000");
  EXPECT_EQ(fine_status, 0) << fine;
  EXPECT_THAT(fine, Not(HasSubstr(warning)));
}

TEST(CommandLineTest, AMissingConfigKeyOrDataFileStopsTheCommandNamingTheFileAndWhy) {
  const std::string conf = ::testing::TempDir() + "/missing-key.conf";
  std::ofstream(conf) << "security { enabled: true token_file: \"/nonexistent/token\" "
                         "tls_cert_file: \"/nonexistent/s.pem\" tls_key_file: \"/nonexistent/s.key\" "
                         "tls_ca_file: \"/nonexistent/ca.pem\" }\n";
  ExpectEachFails({{"scheduler --listen 127.0.0.1:0 --security-config " + conf, conf + ": security."},
                   {"scheduler --listen 127.0.0.1:0 --security-config " + conf, "/nonexistent/"},
                   {"scheduler --listen 127.0.0.1:0 --config /nonexistent/cluster.pbtxt",
                    "cannot open config file /nonexistent/cluster.pbtxt: No such file or directory"},
                   // Before registering: no scheduler listens at port 1, which would take the whole rendezvous.
                   {"train --scheduler 127.0.0.1:1 --data-dir /nonexistent",
                    "/nonexistent/train-images-idx3-ubyte.gz: cannot open"}},
                  /*exit_code=*/1);
  std::filesystem::remove(conf);
}

// Exit code and output of `shardps ARGS` run under `prlimit LIMIT` (at most
// 60 s: a process that neither works nor fails shows as timeout's 124).
std::pair<int, std::string> RunLimited(const std::string& limit, const std::string& args) {
  auto [status, out] = RunCommand(absl::StrCat("timeout 60 prlimit ", limit, " ", SHARDPS_BINARY, " ", args));
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(FileDescriptorTest, AWorkerShortOfDescriptorsFailsSayingSoInsteadOfAborting) {
  // At 12 libzmq asserted starting its context's threads ("Too many open
  // files (src/epoll.cpp:65)"), at 16 cppzmq's exception from a socket's
  // constructor ended the process: both aborted (134) naming nothing (chaos17).
  auto cluster = TestCluster::Start(FastHeartbeats(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int limit : {12, 16}) {
    auto [code, out] = RunLimited(absl::StrCat("--nofile=", limit, ":", limit),
                                  absl::StrCat("train --scheduler ", (*cluster)->scheduler_address(),
                                               " --rank 0 --max-steps 1 --train-limit 320 --test-limit 10 "
                                               "--log-every 0 --rendezvous-timeout 30"));
    EXPECT_EQ(code, 1) << "nofile " << limit << ": " << out;
    EXPECT_THAT(out, HasSubstr("too few file descriptors")) << "nofile " << limit << ": " << out;
  }
}

TEST(FileDescriptorTest, AServerShortOfDescriptorsForItsPeersIsRefusedAtStartNamingTheLimit) {
  // Before, it registered and took no connection from some workers (its
  // accepts failed unlogged): they waited for it until their requests timed
  // out, and its first replica socket aborted it (chaos17).
  auto cluster = TestCluster::Start(FastHeartbeats(1, 64));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto [code, out] = RunLimited("--nofile=40:40", absl::StrCat("server --scheduler ", (*cluster)->scheduler_address(),
                                                                " --listen tcp://127.0.0.1:0 --register-timeout 10"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("too few file descriptors")) << out;
  EXPECT_THAT(out, HasSubstr("RLIMIT_NOFILE soft 40")) << out;
}

// This process's mapped size (VmSize), in bytes.
uint64_t MappedBytes() {
  uint64_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

// A one-server job whose server is replaced by the one `argv(scheduler
// address)` starts under a memory limit: the job's 2 GB model is refused,
// naming what that server reported it can hold.
void ExpectAServerUnderALimitRefusedTheModel(
    const std::function<std::vector<std::string>(const std::string& scheduler)>& argv) {
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(1);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  (*cluster)->StopServer(0);  // its place taken by one under a limit
  SpawnOptions options;
  options.search_path = true;
  options.stdout_to_stderr = true;
  auto limited = Spawn("limited server", argv((*cluster)->scheduler_address()), options);
  ASSERT_TRUE(limited.ok()) << limited.status();
  auto worker = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::Status s = (*worker)->DefineTensors({Float32Tensor("w", int64_t{500} * 1000 * 1000)});  // 2 GB of weights
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("reported it can hold"));
  Kill(*limited);
}

TEST(MemoryTest, AServerUnderAnAddressSpaceLimitIsGivenNoModelItCannotHold) {
  // It reported the machine's physical memory, took the model and died of
  // std::bad_alloc installing the map, saying only libstdc++'s "terminate
  // called after throwing an instance of 'std::bad_alloc'" (chaos17).
  if (kTestSlowdown != 1) GTEST_SKIP() << "a sanitizer reserves address space far past any limit";
  // A server maps about what this process does (the same libraries) and its
  // threads' stacks and heaps: 1 GiB more lets it start (too little and
  // libzmq asserts creating a thread) and holds far less than the model.
  const uint64_t limit = MappedBytes() + (uint64_t{1} << 30);
  ExpectAServerUnderALimitRefusedTheModel([limit](const std::string& scheduler) {
    return std::vector<std::string>{"prlimit", absl::StrCat("--as=", limit), SHARDPS_BINARY, "server", "--scheduler",
                                    scheduler, "--listen", "tcp://127.0.0.1:0"};
  });
}

// A memory cgroup of its own, limited to `limit` bytes (v2 memory.max, or
// the v1 memory hierarchy's memory.limit_in_bytes), removed at the end;
// empty path where this machine lets none be made (not root, a read-only or
// delegated-away cgroup tree).
class LimitedCgroup {
 public:
  explicit LimitedCgroup(uint64_t limit) {
    namespace fs = std::filesystem;
    const std::string name = absl::StrCat("shardps-test-", getpid());
    const bool v2 = fs::exists("/sys/fs/cgroup/cgroup.subtree_control");
    std::string subtree;
    if (v2) std::getline(std::ifstream("/sys/fs/cgroup/cgroup.subtree_control"), subtree);
    const fs::path dir = v2 ? fs::path("/sys/fs/cgroup") / name : fs::path("/sys/fs/cgroup/memory") / name;
    if (v2 && subtree.find("memory") == std::string::npos) return;
    std::error_code error;
    if (!fs::create_directory(dir, error)) return;
    std::ofstream(dir / (v2 ? "memory.max" : "memory.limit_in_bytes")) << limit << std::endl;
    std::string written;
    std::getline(std::ifstream(dir / (v2 ? "memory.max" : "memory.limit_in_bytes")), written);
    if (written != absl::StrCat(limit)) {
      fs::remove(dir, error);
      return;
    }
    path_ = dir.string();
  }
  ~LimitedCgroup() {
    std::error_code error;
    if (!path_.empty()) std::filesystem::remove(path_, error);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(MemoryTest, AServerInAMemoryCgroupIsGivenNoModelItCannotHold) {
  // It reported the machine's physical memory, so a container's limit (a
  // Kubernetes pod's, a systemd unit's MemoryMax, a Slurm job's --mem) let
  // it take a model the kernel then killed it for.
  LimitedCgroup cgroup(uint64_t{1} << 30);
  if (cgroup.path().empty()) GTEST_SKIP() << "this machine lets no memory cgroup be made here (root needed)";
  ExpectAServerUnderALimitRefusedTheModel([&cgroup](const std::string& scheduler) {
    return std::vector<std::string>{"sh", "-c",
                                    absl::StrCat("echo $$ > ", cgroup.path(), "/cgroup.procs && exec ", SHARDPS_BINARY,
                                                 " server --scheduler ", scheduler, " --listen tcp://127.0.0.1:0")};
  });
}

TEST(MemoryTest, AProcessOutOfMemorySaysWhichOneAndWhyAsItStops) {
  // libstdc++'s "terminate called after throwing an instance of
  // 'std::bad_alloc'" named no process: among a cluster's logs, no node.
  if (kTestSlowdown != 1) GTEST_SKIP() << "a sanitizer reserves address space far past any limit";
  const std::string dir = ::testing::TempDir() + "/oom-bench";
  auto [code, out] = RunLimited("--as=2000000000", "bench-checkpoint --hidden 65536,65536 --iters 1 --dir " + dir);
  EXPECT_NE(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("shardps bench-checkpoint --hidden 65536,65536")) << out;
  EXPECT_THAT(out, HasSubstr("stops on an uncaught exception: std::bad_alloc (out of memory")) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardps
