// What the scheduler knows about the cluster: registered nodes, liveness,
// the versioned shard map and barriers. Transport-free, so tests drive it
// directly; the gRPC service is a thin layer on top.
//
// Thread-safe: every method may be called from any gRPC handler thread.
// Blocking methods take a deadline and say, on timeout, what was missing.
#ifndef SHARDPS_SCHEDULER_CLUSTER_STATE_H_
#define SHARDPS_SCHEDULER_CLUSTER_STATE_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace shardps {

class ClusterState {
 public:
  using Clock = std::function<absl::Time()>;
  // REQUIRES: `config` is valid.
  explicit ClusterState(ClusterConfig config, Clock clock = absl::Now);

  const ClusterConfig& config() const { return config_; }

  // Servers get the next free index (or their old one when an address
  // registers again). Refuses more servers than configured.
  absl::StatusOr<RegisterResponse> RegisterServer(const RegisterRequest& request);
  // Refuses ranks outside [0, num_workers). A rank registering again replaces
  // its old entry (a restarted worker).
  absl::StatusOr<RegisterResponse> RegisterWorker(const RegisterRequest& request);
  // Blocks until every server and worker has registered.
  absl::Status WaitForCluster(absl::Time deadline);

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);

  // First call: builds the shard map (next epoch). Later calls: must declare
  // the same tensors. Returns once every server reports serving that epoch.
  absl::StatusOr<ShardMap> DefineTensors(const std::vector<TensorSpec>& tensors, absl::Time deadline);

  // Returns the map once its epoch is above `known_epoch`; nullopt at the
  // deadline (callers loop, checking for cancellation in between).
  std::optional<ShardMap> WaitForMap(uint64_t known_epoch, absl::Time deadline);

  absl::Status Barrier(uint64_t node_id, const std::string& name, absl::Time deadline);

  StatusResponse Status();

 private:
  struct Node {
    uint64_t id = 0;
    Role role = ROLE_UNSPECIFIED;
    uint32_t rank = 0;  // worker rank or server index
    std::string address, host;
    absl::Time last_seen;
    uint64_t applied_epoch = 0;
  };
  struct BarrierState {
    uint64_t generation = 0;
    std::set<uint32_t> arrived;  // worker ranks
  };

  bool ClusterComplete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingNodes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ServersServe(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ServersBehind(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Node* FindNode(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterConfig config_;
  const Clock clock_;
  absl::Mutex mu_;
  uint64_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint32_t, Node> servers_ ABSL_GUARDED_BY(mu_);  // by index
  std::map<uint32_t, Node> workers_ ABSL_GUARDED_BY(mu_);  // by rank
  ShardMap map_ ABSL_GUARDED_BY(mu_);                       // epoch 0: no tensors yet
  std::vector<TensorSpec> tensors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_CLUSTER_STATE_H_
