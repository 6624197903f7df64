// What a scheduler that does not serve answers (with UNAVAILABLE) to every
// call: a standby, or one that stopped serving after losing its etcd lease or
// leadership. The scheduler builds the text here and nodes recognise it here,
// so a node reports the scheduler's own reason rather than "cannot reach the
// scheduler", and moves on to the next address. Thread-safe (pure functions).
#ifndef SHARDPS_COMMON_SCHEDULER_REFUSAL_H_
#define SHARDPS_COMMON_SCHEDULER_REFUSAL_H_

#include <cstdint>
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

// The end of the refusal of a worker registering for a rank whose previous
// process is still a member of the running job (not declared dead yet, not
// left): the new process may wait for that (Worker::Create does, within its
// rendezvous timeout), a second live process may not.
std::string RankStillHeldRefusal(uint32_t rank, uint32_t heartbeat_timeout_ms);
bool IsRankStillHeldRefusal(absl::string_view message);

// The answer to a removed rank's registration that waited, for the servers'
// reports before it rejoins, half the time the scheduler counts a waiting
// call as heard: the process asks again at once (Worker::Create does, within
// its rendezvous timeout), which shows it still reaches the scheduler, and
// the wait goes on.
std::string RejoinAskAgainRefusal(uint32_t rank);
bool IsRejoinAskAgainRefusal(absl::string_view message);

// The refusal of a heartbeat from a node the scheduler declared dead (silent
// past heartbeat_timeout_ms: killed, paused, cut off): `node` ("server 1",
// "worker rank 0") "was declared dead after missing its heartbeats and is no
// longer a member of the job". Such a node never becomes a member again; a
// new process (registering anew) may.
std::string DeclaredDeadRefusal(absl::string_view node);
bool IsDeclaredDeadRefusal(absl::string_view message);

}  // namespace shardps

#endif  // SHARDPS_COMMON_SCHEDULER_REFUSAL_H_
