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
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/cluster.pb.h"
#include "proto/config.pb.h"
#include "scheduler/etcd_tls.h"

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
  // Default: off. etcd's client URLs, "http://HOST:PORT[,...]" or
  // "https://HOST:PORT[,...]" with `etcd_tls` (exclusive
  // with `state_dir`): the state lives in etcd under `etcd_prefix`, and of
  // the schedulers sharing that prefix one is active, elected with a lease
  // of heartbeat_timeout_ms; the others are standbys that answer every call
  // UNAVAILABLE ("standby scheduler at X; active is Y") and take over when
  // the active one's lease expires (scheduler/etcd_election.h). An active
  // scheduler that loses its lease stops serving; Failure() says why.
  std::string etcd_endpoints{};
  // TLS to etcd: its CA and this scheduler's client certificate and key
  // (scheduler/etcd_tls.h). Default: none (plain http://).
  EtcdTlsFiles etcd_tls{};
  // Default (empty): "/shardps/" + a digest of the config.
  std::string etcd_prefix{};
  // The address other nodes reach this scheduler at, published in etcd;
  // empty (default): the bound address (a wildcard host as 127.0.0.1).
  std::string advertise_address{};
  // How long a connection may take over its handshake (TCP to the first
  // HTTP/2 frames, TLS included) before it is closed. gRPC's own is 120 s,
  // in which anyone who reaches the port held about 27 KB of the
  // scheduler's memory per connection that sent nothing. Default: 10 s.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

class SchedulerDaemon {
 public:
  // Validates the config, binds and starts serving.
  static absl::StatusOr<std::unique_ptr<SchedulerDaemon>> Create(const SchedulerOptions& options);
  virtual ~SchedulerDaemon() = default;

  // host:port actually bound.
  virtual std::string address() const = 0;
  // Blocks until Shutdown(), or until the daemon stops serving by itself
  // (with --etcd: it lost its lease; see Failure()).
  virtual void Wait() = 0;
  // Ends open calls and streams and stops serving. Thread-safe, idempotent.
  virtual void Shutdown() = 0;
  // What `shardps status` shows: config, nodes, shard map. Thread-safe
  // (metrics read it on their HTTP thread).
  virtual StatusResponse Status() = 0;
  // Nodes declared dead since this daemon started serving, one for each
  // declaration (ClusterState::NodesDeclaredDead); Status() shows only who is
  // dead now, which a rejoin or a replacement clears. Thread-safe.
  virtual uint64_t NodesDeclaredDead() = 0;
  // Why the daemon stopped serving by itself (an etcd lease or leadership
  // lost); OK otherwise.
  virtual absl::Status Failure() = 0;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SCHEDULER_H_
