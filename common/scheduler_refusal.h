// What a scheduler that does not serve answers (with UNAVAILABLE) to every
// call: a standby, or one that stopped serving after losing its etcd lease or
// leadership. The scheduler builds the text here and nodes recognise it here,
// so a node reports the scheduler's own reason rather than "cannot reach the
// scheduler", and moves on to the next address. Thread-safe (pure functions).
#ifndef SHARDPS_COMMON_SCHEDULER_REFUSAL_H_
#define SHARDPS_COMMON_SCHEDULER_REFUSAL_H_

#include <string>

#include "absl/strings/string_view.h"

namespace shardps {

// "standby scheduler at ADDRESS; active is ACTIVE", or with `active` empty
// (before its first campaign) "standby scheduler at ADDRESS; no active
// scheduler known yet".
std::string StandbyRefusal(absl::string_view address, absl::string_view active);

// "scheduler at ADDRESS stopped serving: WHY": its lease was lost or a state
// write was fenced off (scheduler/etcd_scheduler_role.h).
std::string StoppedRefusal(absl::string_view address, absl::string_view why);

// True when `message` was built by one of the functions above.
bool IsSchedulerRefusal(absl::string_view message);

}  // namespace shardps

#endif  // SHARDPS_COMMON_SCHEDULER_REFUSAL_H_
