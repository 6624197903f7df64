// A parameter-server daemon: registers with the scheduler, follows its shard
// map, and serves the partitions it owns on a ZeroMQ ROUTER socket.
//
// Threads: the engine thread (Run) owns the socket and every partition; a
// heartbeat thread reports liveness and the epoch served; the shard-map watch
// runs on its own thread and hands maps to the engine thread.
//
// The data plane does not depend on the scheduler: a server whose scheduler
// dies keeps serving, and its heartbeats and watch reconnect by themselves.
#ifndef SHARDPS_SERVER_SERVER_H_
#define SHARDPS_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "server/partition_engine.h"

namespace shardps {

class MetricsRegistry;
class SchedulerClient;

struct ServerOptions {
  std::string scheduler_address{};            // host:port of the scheduler (or a comma-separated list)
  std::string bind_address = "tcp://*:0";     // ZeroMQ endpoint; port 0 = any free port
  std::string advertise_host = "127.0.0.1";   // host workers use to reach this server
  absl::Duration register_timeout = absl::Seconds(30);
  // The scheduler to talk to; null (default): a gRPC client of
  // `scheduler_address`. Tests pass one that dies, stalls or publishes maps.
  std::shared_ptr<SchedulerClient> scheduler_client = nullptr;
  // Where to publish this server's metrics (server/server_metrics.h); null
  // (default): none. Borrowed: must outlive the server.
  MetricsRegistry* metrics = nullptr;
  // Partitions (those of lowest id) that get per-partition series; the
  // rest are only counted (shardps_server_partitions_unreported). Bounds the
  // series a scrape carries: about 6 per partition, plus one per backup.
  size_t metrics_max_partitions = 256;
  // Bytes of partitions this server can hold, told to the scheduler, which
  // refuses a model that would give it more; 0 (default): the machine's
  // physical memory, or less under an address-space limit (RLIMIT_AS): what
  // the limit leaves above what the process maps when it registers.
  uint64_t memory_bytes = 0;
  // Default: off. On: the scheduler is reached over TLS with the token, and
  // the data socket is a CURVE server with a key pair made for this process,
  // whose public key is registered (workers get it in the shard map); a
  // client without it gets no answer. Replication to other servers uses
  // their keys from the map.
  SecurityCredentials security{};
  // Above zero: on RequestStop (SIGTERM) the server first asks the scheduler
  // to drain it (`shardps drain`: its copies move to the other servers while
  // training goes on) and stops once it holds none, once nothing would move
  // them any more (every worker left, or the scheduler ended the drain: too
  // few servers would be left), or after this long, whichever comes first; a drain the scheduler refuses (too few servers
  // would be left, the job is over) is logged and the server stops at once,
  // failing over as without it. A scheduler it cannot reach (restarting) is
  // asked again every second for up to heartbeat_timeout_ms (as long as
  // nodes wait for a scheduler), within this. Zero (default): stop at once.
  absl::Duration drain_on_stop = absl::ZeroDuration();
};

class ParameterServer {
 public:
  // Binds, registers and starts following the shard map.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(const ServerOptions& options);
  virtual ~ParameterServer() = default;

  // Serves until RequestStop(), then drains: handles what was already
  // received, answers waiting pulls with UNAVAILABLE, flushes and returns.
  // Returns an error if a shard map cannot be served (a config the engine
  // cannot build), and FailedPrecondition once the scheduler refuses its
  // heartbeat as a node declared dead (it was paused or cut off past
  // heartbeat_timeout_ms and its partitions failed over); losing the
  // scheduler is not one.
  virtual absl::Status Run() = 0;
  // Async-signal-safe: only sets a flag that Run() polls.
  virtual void RequestStop() = 0;

  // After Run(): what this server's primaries applied (lost/duplicate
  // update accounting).
  virtual std::vector<PartitionUpdates> UpdateCounts() const = 0;
  // After Run(): what its synced backup copies applied (for a partition no
  // server is primary of when the job stops: a hand-off whose switch the
  // new primary had not installed yet).
  virtual std::vector<PartitionUpdates> BackupUpdateCounts() const = 0;
  // After Run(): the engine's counts (staleness of the applied gradients
  // among them).
  virtual EngineStats Stats() const = 0;

  virtual std::string data_address() const = 0;
  virtual uint32_t index() const = 0;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_SERVER_H_
