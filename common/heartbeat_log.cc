#include "common/heartbeat_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

// Milliseconds are plenty for a heartbeat; nanoseconds only clutter the line.
std::string Ms(absl::Duration d) { return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1))); }

}  // namespace

HeartbeatLog::HeartbeatLog(std::string node, absl::Duration interval, absl::Duration timeout)
    : node_(std::move(node)), interval_(interval), timeout_(timeout) {}

std::optional<std::string> HeartbeatLog::Sending(absl::Time now) {
  const absl::Time previous = last_sent_;
  last_sent_ = now;
  if (previous == absl::InfinitePast()) return std::nullopt;
  const absl::Duration gap = now - previous;
  if (gap <= std::max(timeout_ / 2, 3 * interval_)) return std::nullopt;
  // The previous call ended at last_answered_ (when it was answered at all).
  const absl::Duration call = last_answered_ >= previous ? last_answered_ - previous : gap;
  return absl::StrCat(node_, ": heartbeat sent ", Ms(gap), " after the previous one (", Ms(call), " in that call, ",
                      Ms(gap - call), " waiting to send again; interval ", Ms(interval_), ", timeout ", Ms(timeout_),
                      ")");
}

std::optional<std::string> HeartbeatLog::Answered(const absl::Status& status, absl::Time now) {
  last_answered_ = now;
  if (status.ok()) {
    if (failures_ == 0) return std::nullopt;
    std::string line = absl::StrCat(node_, ": heartbeat answered again after ", failures_, " failed over ",
                                    Ms(now - first_failure_sent_));
    failures_ = 0;
    return line;
  }
  if (failures_++ == 0) first_failure_sent_ = last_sent_;
  if (failures_ % 10 != 1) return std::nullopt;
  return absl::StrCat(node_, ": heartbeat failed (", failures_, failures_ == 1 ? " failure" : " in a row",
                      "): ", status.ToString());
}

}  // namespace shardps
