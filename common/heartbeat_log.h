// What a node's heartbeat loop says in its log, so that a node declared dead
// by the scheduler leaves the evidence of why on its own side: which of its
// heartbeats failed, and whether the loop itself ran late (the thread was
// held: a starved host, a lock) or its calls hung.
//
// Counted per node, not per log call site: several workers in one process
// (the in-process tests, the C API) each report their own failures, where a
// site-wide LOG_EVERY_N showed one worker's and hid the others'.
//
// Not thread-safe: one per heartbeat loop, used by that loop's thread only.
#ifndef SHARDPS_COMMON_HEARTBEAT_LOG_H_
#define SHARDPS_COMMON_HEARTBEAT_LOG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardps {

class HeartbeatLog {
 public:
  // `node` names the node in every line ("worker 1", "server 0");
  // `interval` and `timeout` are the cluster's heartbeat_interval_ms and
  // heartbeat_timeout_ms.
  HeartbeatLog(std::string node, absl::Duration interval, absl::Duration timeout);

  // Called just before a heartbeat is sent at `now`. Returns a line when
  // the previous one was sent so long ago (more than half the timeout, and
  // more than 3 intervals) that the scheduler may soon declare this node
  // dead; it says how much of the gap the previous call took and how much
  // the loop waited before sending again.
  std::optional<std::string> Sending(absl::Time now);

  // Called with the outcome of the heartbeat, at `now`. Returns a line for
  // the first failure of a run of failures and every tenth after it (with
  // the count), and for the first answer after failures (how many, for how
  // long). Declared dead (FAILED_PRECONDITION) is the caller's to report.
  std::optional<std::string> Answered(const absl::Status& status, absl::Time now);

 private:
  const std::string node_;
  const absl::Duration interval_;
  const absl::Duration timeout_;
  absl::Time last_sent_ = absl::InfinitePast();
  absl::Time last_answered_ = absl::InfinitePast();
  uint64_t failures_ = 0;  // in a row
  absl::Time first_failure_sent_ = absl::InfinitePast();
};

}  // namespace shardps

#endif  // SHARDPS_COMMON_HEARTBEAT_LOG_H_
