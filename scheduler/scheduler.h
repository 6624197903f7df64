// The scheduler daemon: serves the Scheduler gRPC service (proto/cluster.proto)
// over the cluster state. Owns its gRPC server and the state. The gRPC server
// also answers the standard health check (grpc.health.v1.Health, service ""):
// SERVING until Shutdown().
//
//   auto scheduler = SchedulerDaemon::Create({.listen_address = "0.0.0.0:7000", .config = c});
//   (*scheduler)->Wait();   // until Shutdown() from another thread
#ifndef SHARDPS_SCHEDULER_SCHEDULER_H_
#define SHARDPS_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security.h"
#include "proto/cluster.pb.h"
#include "proto/config.pb.h"

namespace shardps {

struct SchedulerOptions {
  // host:port; port 0 picks a free port (see SchedulerDaemon::address()).
  std::string listen_address = "0.0.0.0:7000";
  // Validated by Create(). Its `security` block is not read here (see
  // `security`) and is dropped: nodes never receive it.
  ClusterConfig config;
  // Default: off. On: gRPC over TLS with this certificate, and every call
  // must carry the token (and with require_client_cert, a certificate of the
  // CA); refusals are logged naming the peer.
  SecurityCredentials security{};
  // Where the cluster state (membership, shard map and epoch, config) is
  // persisted after every change; empty: nowhere. A scheduler started on a
  // directory that holds a state resumes that cluster (its config wins over
  // `config`), so nodes reconnect by themselves. A corrupt state is refused.
  std::string state_dir{};
};

class SchedulerDaemon {
 public:
  // Validates the config, binds and starts serving.
  static absl::StatusOr<std::unique_ptr<SchedulerDaemon>> Create(const SchedulerOptions& options);
  virtual ~SchedulerDaemon() = default;

  // host:port actually bound.
  virtual std::string address() const = 0;
  // Blocks until Shutdown().
  virtual void Wait() = 0;
  // Ends open calls and streams and stops serving. Thread-safe, idempotent.
  virtual void Shutdown() = 0;
  // What `shardps status` shows: config, nodes, shard map. Thread-safe
  // (metrics read it on their HTTP thread).
  virtual StatusResponse Status() = 0;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SCHEDULER_H_
