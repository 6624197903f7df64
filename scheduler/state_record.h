// The scheduler's persisted state as a sealed record (common/durable_file.h):
// the bytes of a --state-dir file and of the etcd key P/state alike.
// Internal to the scheduler.
#ifndef SHARDPS_SCHEDULER_STATE_RECORD_H_
#define SHARDPS_SCHEDULER_STATE_RECORD_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"
#include "scheduler/cluster_state.h"

namespace shardps {

// The state sealed in `data`, read from `where` (a file or an etcd key,
// named in errors). DataLoss for a torn or foreign record, one that does not
// parse, or one holding an invalid config.
absl::StatusOr<SchedulerState> ParseStateRecord(const std::string& data, const std::string& where);

// Where a scheduler's saved state lives, for its messages.
struct StateOrigin {
  std::string where;      // "etcd key P/state", a --state-dir file's path; empty: nowhere
  std::string elsewhere;  // what to use instead on a config mismatch: "another --etcd-prefix"
  std::string who;        // the log lines' subject: "scheduler", "scheduler at A: active"
};

// The state to serve: `saved` restored (logged as resumed), or with nothing
// saved a new one for `config`; either writes through `persist`.
// FailedPrecondition, naming origin.where, when `saved` holds another config.
absl::StatusOr<std::unique_ptr<ClusterState>> ResumeOrCreateState(const std::optional<SchedulerState>& saved,
                                                                  const ClusterConfig& config,
                                                                  const StateOrigin& origin,
                                                                  ClusterState::Persist persist);

// A ClusterState::Persist that seals the state and hands it to `write` after
// every change; a failed write is logged, once per distinct error (the
// scheduler keeps serving from memory).
ClusterState::Persist SealedStateWriter(std::function<absl::Status(const std::string&)> write);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_STATE_RECORD_H_
