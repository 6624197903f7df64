// A SchedulerClient over several schedulers, of which one is active (the
// others are standbys that answer UNAVAILABLE, or dead): SchedulerClient::
// Create returns one for "HOST:PORT,HOST:PORT,...". Internal to common/.
//
// A call goes to the scheduler that last answered; on UNAVAILABLE it moves
// on to the next, round and round with a short pause after each round,
// within the call's one deadline. The shard-map watch follows the active
// scheduler the same way and delivers only maps newer than the last one.
// Owns its per-address clients, which must fail fast (not wait for a
// connection) so a dead address costs no deadline. Thread-safe.
#ifndef SHARDPS_COMMON_FAILOVER_SCHEDULER_CLIENT_H_
#define SHARDPS_COMMON_FAILOVER_SCHEDULER_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/scheduler_client.h"

namespace shardps {

class FailoverSchedulerClient : public SchedulerClient {
 public:
  // REQUIRES: `clients` not empty. `address` names them all (errors use it).
  FailoverSchedulerClient(std::string address, std::vector<std::unique_ptr<SchedulerClient>> clients);

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request, absl::Duration timeout) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Duration timeout) override;
  absl::StatusOr<ShardMap> DefineTensors(const DefineTensorsRequest& request, absl::Duration timeout) override;
  absl::Status Barrier(const BarrierRequest& request, absl::Duration timeout,
                       BarrierResponse* response = nullptr) override;
  absl::StatusOr<StatusResponse> Status(absl::Duration timeout) override;
  absl::StatusOr<CheckpointResponse> RequestCheckpoint(const CheckpointRequest& request,
                                                       absl::Duration timeout) override;
  absl::StatusOr<DrainResponse> Drain(const DrainRequest& request, absl::Duration timeout) override;
  std::unique_ptr<Watch> WatchShardMap(uint64_t node_id, std::function<void(const ShardMap&)> on_map,
                                       std::function<void(const absl::Status&)> on_error) override;

 private:
  class FollowingWatch;
  // Runs `call` (given a client and the time left) until one scheduler
  // answers with anything but UNAVAILABLE or the deadline passes; the
  // error then names what each address said last.
  absl::Status Run(absl::Duration timeout, absl::FunctionRef<absl::Status(SchedulerClient&, absl::Duration)> call);
  // Run for a call that returns a value.
  template <typename T, typename Call>
  absl::StatusOr<T> RunFor(absl::Duration timeout, Call call);

  std::vector<std::unique_ptr<SchedulerClient>> clients_;
  std::atomic<size_t> current_{0};  // the one that last answered
};

}  // namespace shardps

#endif  // SHARDPS_COMMON_FAILOVER_SCHEDULER_CLIENT_H_
