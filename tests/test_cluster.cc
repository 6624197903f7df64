#include "tests/test_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/scheduler_client.h"
#include "common/tensor_spec.h"
#include "worker/worker.h"

namespace shardps {

absl::StatusOr<int> FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port < 0) return absl::InternalError(absl::StrCat("no free port on 127.0.0.1: ", strerror(errno)));
  return port;
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(const ClusterConfig& config,
                                                                std::vector<std::string> server_flags) {
  static std::atomic<int> counter{0};
  auto cluster = std::unique_ptr<TestCluster>(new TestCluster());
  cluster->server_flags_ = std::move(server_flags);
  cluster->dir_ = std::filesystem::temp_directory_path() / absl::StrCat("shardps-test-", getpid(), "-", counter++);
  // A folder left by a killed process whose pid this one now has would hand
  // out its stale scheduler address.
  std::filesystem::remove_all(cluster->dir_);
  std::filesystem::create_directories(cluster->dir_);
  std::ofstream(cluster->dir_ + "/cluster.pbtxt") << config.DebugString();
  if (absl::Status s = cluster->StartScheduler("127.0.0.1:0"); !s.ok()) return s;
  for (uint32_t i = 0; i < config.num_servers(); ++i) {
    if (absl::Status s = cluster->AddServer(); !s.ok()) return s;
  }
  return cluster;
}

absl::Status TestCluster::StartScheduler(const std::string& listen) {
  static std::atomic<int> started{0};
  const std::string port_file = absl::StrCat(dir_, "/scheduler.addr.", started++);
  // A test killed at its time limit leaves no daemon behind to hold ports and
  // CPU for the tests after it (servers outlive their scheduler by design).
  SpawnOptions options;
  options.stdout_to_stderr = true;
  options.stop_with_us = true;
  auto scheduler = Spawn("scheduler", {SHARDPS_BINARY, "scheduler", "--listen", listen, "--config",
                                       dir_ + "/cluster.pbtxt", "--port-file", port_file, "--state-dir",
                                       dir_ + "/state"}, options);
  if (!scheduler.ok()) return scheduler.status();
  scheduler_ = *scheduler;
  std::vector<ChildProcess> watch = {scheduler_};
  auto address = WaitForAddressFile(port_file, watch, absl::Now() + absl::Seconds(30));
  if (!address.ok()) return address.status();
  scheduler_address_ = *address;
  return absl::OkStatus();
}

void TestCluster::KillScheduler() { Kill(scheduler_); }

absl::Status TestCluster::RestartScheduler(bool keep_state) {
  if (!keep_state) std::filesystem::remove_all(dir_ + "/state");
  return StartScheduler(scheduler_address_);
}

absl::Status TestCluster::AddServer(const std::vector<std::string>& flags) {
  SpawnOptions options;
  options.stdout_to_stderr = true;
  options.stop_with_us = true;
  std::vector<std::string> argv = {SHARDPS_BINARY, "server", "--scheduler", scheduler_address_, "--listen",
                                   "tcp://127.0.0.1:0"};
  argv.insert(argv.end(), server_flags_.begin(), server_flags_.end());
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto server = Spawn(absl::StrCat("server ", servers_.size()), argv, options);
  if (!server.ok()) return server.status();
  servers_.push_back(*server);
  return absl::OkStatus();
}

TestCluster::~TestCluster() {
  for (auto& s : servers_) Stop(s, absl::Seconds(5));
  Stop(scheduler_, absl::Seconds(5));
  std::filesystem::remove_all(dir_);
}

absl::StatusOr<std::vector<std::string>> TestCluster::ServerAddresses() {
  auto client = SchedulerClient::Create(scheduler_address_);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    auto status = (*client)->Status(absl::Seconds(5));
    if (!status.ok()) return status.status();
    std::vector<std::string> addresses(servers_.size());
    size_t found = 0;
    for (const NodeStatus& n : status->nodes()) {
      if (n.role() == SERVER && n.rank() < addresses.size()) {
        addresses[n.rank()] = n.address();
        ++found;
      }
    }
    if (found == servers_.size()) return addresses;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError("servers did not register");
}

std::vector<float> PullWeights(Worker& worker, const std::string& tensor, size_t n) {
  std::vector<float> out(n);
  auto h = worker.Pull(tensor, absl::MakeSpan(out));
  EXPECT_TRUE(h.ok()) << h.status();
  if (h.ok()) {
    EXPECT_TRUE(worker.Wait(*h, absl::Seconds(10)).ok());
  }
  return out;
}

int TestCluster::StopServer(size_t i, absl::Duration grace) { return Stop(servers_[i], grace); }

std::optional<int> TestCluster::WaitForServerExit(size_t i, absl::Duration timeout) {
  std::vector<ChildProcess> one = {servers_[i]};
  int code = 0;
  auto exited = WaitAny(one, absl::Now() + timeout, &code);
  servers_[i] = one[0];
  if (!exited.ok()) return std::nullopt;
  return code;
}

absl::StatusOr<RawClientCluster> StartWithRawClient(const ClusterConfig& config, int n, float init,
                                                    zmq::context_t& context) {
  RawClientCluster out;
  auto cluster = TestCluster::Start(config);
  if (!cluster.ok()) return cluster.status();
  out.cluster = *std::move(cluster);
  auto worker = Worker::Create({.scheduler_address = out.cluster->scheduler_address(), .rank = 0});
  if (!worker.ok()) return worker.status();
  out.worker = *std::move(worker);
  if (absl::Status s = out.worker->DefineTensors({Float32Tensor("w", n)}); !s.ok()) return s;
  if (absl::Status s = out.worker->InitTensor("w", std::vector<float>(n, init), absl::Seconds(10)); !s.ok()) return s;
  auto addresses = out.cluster->ServerAddresses();
  if (!addresses.ok()) return addresses.status();
  out.socket = zmq::socket_t(context, zmq::socket_type::dealer);
  out.socket.set(zmq::sockopt::rcvtimeo, 5000);
  out.socket.set(zmq::sockopt::linger, 0);
  out.socket.connect((*addresses)[0]);
  return out;
}

}  // namespace shardps
