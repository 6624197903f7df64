#include "scheduler/state_record.h"

#include <glog/logging.h>

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

ClusterState::Persist SealedStateWriter(std::function<absl::Status(const std::string&)> write) {
  return [write = std::move(write), last_error = std::string()](const SchedulerState& state) mutable {
    absl::Status s = write(SealRecord(kStateKind, state.SerializeAsString()));
    if (!s.ok() && s.ToString() != last_error) LOG(ERROR) << "scheduler: cannot persist its state: " << s;
    last_error = s.ok() ? "" : s.ToString();
  };
}

}  // namespace shardps
