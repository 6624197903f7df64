#include "scheduler/state_record.h"

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/durable_file.h"

namespace shardps {
namespace {

constexpr absl::string_view kStateKind = "scheduler-state";

}  // namespace

absl::StatusOr<SchedulerState> ParseStateRecord(const std::string& data, const std::string& where) {
  auto payload = UnsealRecord(kStateKind, data, where);
  if (!payload.ok()) return payload.status();
  SchedulerState state;
  if (!state.ParseFromString(*payload)) return absl::DataLossError(absl::StrCat(where, " does not parse"));
  if (absl::Status s = ValidateConfig(state.config()); !s.ok()) {
    return absl::DataLossError(absl::StrCat(where, " holds an invalid config: ", s.message()));
  }
  return state;
}

absl::StatusOr<std::unique_ptr<ClusterState>> ResumeOrCreateState(const std::optional<SchedulerState>& saved,
                                                                  const ClusterConfig& config,
                                                                  const StateOrigin& origin,
                                                                  ClusterState::Persist persist) {
  if (!saved.has_value()) {
    // The normal first start (every `shardps local`): news only with --verbose. A scheduler that
    // lost its state hears from nodes it does not know, and they say so.
    if (!origin.where.empty()) LOG(INFO) << origin.who << ": a new cluster (none saved in " << origin.where << " yet)";
    return std::make_unique<ClusterState>(config, absl::Now, std::move(persist));
  }
  // The saved config carries the job id this scheduler gave it
  // (ClusterConfig.job_id), which a config file does not.
  ClusterConfig saved_config = saved->config(), given = config;
  saved_config.clear_job_id();
  given.clear_job_id();
  if (!google::protobuf::util::MessageDifferencer::Equals(saved_config, given)) {
    return absl::FailedPreconditionError(absl::StrCat(origin.where,
                                                      " holds a cluster with another configuration; start with the "
                                                      "same config to resume it, or use ",
                                                      origin.elsewhere));
  }
  LOG(WARNING) << origin.who << ": resuming the cluster saved in " << origin.where << " (shard map epoch "
               << saved->shard_map().epoch() << ", " << saved->nodes_size() << " nodes, " << saved->tensors_size()
               << " tensors)";
  return ClusterState::Restore(*saved, absl::Now, std::move(persist));
}

ClusterState::Persist SealedStateWriter(std::function<absl::Status(const std::string&)> write) {
  return [write = std::move(write), last_error = std::string()](const SchedulerState& state) mutable {
    absl::Status s = write(SealRecord(kStateKind, state.SerializeAsString()));
    if (!s.ok() && s.ToString() != last_error) LOG(ERROR) << "scheduler: cannot persist its state: " << s;
    if (s.ok() && !last_error.empty()) LOG(WARNING) << "scheduler: its state is written again";
    last_error = s.ok() ? "" : s.ToString();
    return s;
  };
}

}  // namespace shardps
