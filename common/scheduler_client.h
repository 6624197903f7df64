// Client of the scheduler's gRPC service, used by servers, workers and tools.
//
// Every call has a deadline; errors name the scheduler address and what the
// caller was waiting for. gRPC headers stay behind this interface.
// Thread-safe: calls may be made from several threads at once.
#ifndef SHARDPS_COMMON_SCHEDULER_CLIENT_H_
#define SHARDPS_COMMON_SCHEDULER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/cluster.pb.h"

namespace shardps {

class SchedulerClient {
 public:
  // `address` is host:port. Creating does not connect; the first call does.
  // Several schedulers, one active and the others standbys (`shardps
  // scheduler --etcd`): "host:port,host:port,..."; calls go to the one that
  // last answered and move on to the next on UNAVAILABLE within their
  // deadline, and the shard-map watch follows the active one.
  // With `security` enabled, calls go over TLS (the scheduler's certificate
  // checked against the cluster CA; this node's certificate shown when it
  // has one) and carry the cluster token.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Create(const std::string& address,
                                                                 const SecurityCredentials& security = {});
  virtual ~SchedulerClient() = default;

  const std::string& address() const { return address_; }

  // Workers block here until the whole cluster has registered (rendezvous).
  virtual absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request,
                                                    absl::Duration timeout) = 0;
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request,
                                                      absl::Duration timeout) = 0;
  virtual absl::StatusOr<ShardMap> DefineTensors(const DefineTensorsRequest& request,
                                                 absl::Duration timeout) = 0;
  // `response` (optional) receives the ranks in the job when it passed.
  virtual absl::Status Barrier(const BarrierRequest& request, absl::Duration timeout,
                               BarrierResponse* response = nullptr) = 0;
  virtual absl::StatusOr<StatusResponse> Status(absl::Duration timeout) = 0;
  // A checkpoint into request.dir at a round the scheduler picks (returned).
  virtual absl::StatusOr<CheckpointResponse> RequestCheckpoint(const CheckpointRequest& request,
                                                               absl::Duration timeout) = 0;

  // Marks a server draining (`shardps drain`). Clients that speak only to
  // a cluster's nodes need not implement it.
  virtual absl::StatusOr<DrainResponse> Drain(const DrainRequest& request, absl::Duration timeout);

  // Streams shard maps to `on_map` from a background thread until the
  // returned handle is destroyed. When the stream breaks (the scheduler died
  // or restarts), `on_error` is told and the watch reconnects by itself,
  // waiting for the scheduler with a growing pause (at most 2 s); after a
  // reconnect only maps newer than the last one seen are delivered.
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  virtual std::unique_ptr<Watch> WatchShardMap(
      uint64_t node_id, std::function<void(const ShardMap&)> on_map,
      std::function<void(const absl::Status&)> on_error) = 0;

 protected:
  explicit SchedulerClient(std::string address) : address_(std::move(address)) {}

 private:
  std::string address_;
};

// A node's last heartbeat (HeartbeatRequest.leaving): the scheduler takes it
// out of the job at once instead of after heartbeat_timeout_ms. Waits one
// heartbeat interval of `config`, clamped to [100 ms, 2 s]: a scheduler that
// does not answer by then finds the node silent, as before. `error`: why a
// worker stops on an error (HeartbeatRequest.leaving_error), or empty.
absl::Status SayLeaving(SchedulerClient& scheduler, uint64_t node_id, const ClusterConfig& config,
                        const std::string& error = "");

// Whether `address` is what SchedulerClient::Create takes ("host:port", or
// several comma-separated); the error names the entry that is not.
absl::Status CheckSchedulerAddress(const std::string& address);

}  // namespace shardps

#endif  // SHARDPS_COMMON_SCHEDULER_CLIENT_H_
