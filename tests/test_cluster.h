// A real cluster for tests: the `shardps` binary started as a scheduler and S
// server processes on loopback. Workers are the library, in the test.
// Everything is stopped (SIGTERM, then SIGKILL) when the object goes away.
#ifndef SHARDPS_TESTS_TEST_CLUSTER_H_
#define SHARDPS_TESTS_TEST_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "tools/process.h"
#include "worker/worker.h"

namespace shardps {

class Worker;

// The `n` weights of `tensor` as `worker` pulls them (the test fails, and the
// result is zeros, when the pull does).
std::vector<float> PullWeights(Worker& worker, const std::string& tensor, size_t n);

// A port on 127.0.0.1 that was free a moment ago.
absl::StatusOr<int> FreeLoopbackPort();

class TestCluster {
 public:
  // A scheduler and config.num_servers() servers as processes, which end with
  // the thread that starts them (SpawnOptions::stop_with_us): start from the
  // test's own thread.
  // `server_flags` go to every `shardps server` it starts.
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(const ClusterConfig& config,
                                                            std::vector<std::string> server_flags = {});
  ~TestCluster();

  const std::string& scheduler_address() const { return scheduler_address_; }
  // Data addresses of the servers, by index (from the scheduler's status).
  absl::StatusOr<std::vector<std::string>> ServerAddresses();
  // Process ids, to read their threads and memory from /proc.
  pid_t scheduler_pid() const { return scheduler_.pid; }
  pid_t server_pid(size_t i) const { return servers_[i].pid; }
  // SIGTERM to server `i` (SIGKILL after `grace`); returns its exit code.
  int StopServer(size_t i, absl::Duration grace = absl::Seconds(10));
  // Waits up to `timeout` for server `i` to exit by itself: its exit code,
  // or nullopt while it still runs.
  std::optional<int> WaitForServerExit(size_t i, absl::Duration timeout);
  // Starts one more server process (index num_servers(), num_servers() + 1,
  // ... as the calls come): once the tensors are defined it joins the
  // running job as one more server (docs/architecture.md). `flags` go after
  // the cluster's server flags (a later --listen wins). From the test's own
  // thread, as Start.
  absl::Status AddServer(const std::vector<std::string>& flags = {});
  // SIGKILL to the scheduler; RestartScheduler starts a new one at the same
  // address, which resumes from the state the first saved (--state-dir), or
  // without `keep_state` starts a new job on an empty state directory.
  // From the test's own thread, as Start.
  void KillScheduler();
  absl::Status RestartScheduler(bool keep_state = true);

 private:
  absl::Status StartScheduler(const std::string& listen);

  std::string dir_;
  std::string scheduler_address_;
  std::vector<std::string> server_flags_;
  std::vector<ChildProcess> servers_;
  ChildProcess scheduler_;
};

// A cluster of `config` with tensor "w" of `n` floats initialised to
// `init` by worker 0, and a raw ZeroMQ DEALER on `context` connected to
// server 0: an independent client for the bad-input and attack tests.
struct RawClientCluster {
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<Worker> worker;
  zmq::socket_t socket;
};
absl::StatusOr<RawClientCluster> StartWithRawClient(const ClusterConfig& config, int n, float init,
                                                    zmq::context_t& context);

}  // namespace shardps

#endif  // SHARDPS_TESTS_TEST_CLUSTER_H_
