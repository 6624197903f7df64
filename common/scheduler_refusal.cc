#include "common/scheduler_refusal.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr absl::string_view kStandby = "standby scheduler at ";
constexpr absl::string_view kScheduler = "scheduler at ";
constexpr absl::string_view kStopped = " stopped serving: ";
constexpr absl::string_view kDeclaredDead =
    " was declared dead after missing its heartbeats and is no longer a member of the job";
constexpr absl::string_view kStillHeld = " is still a member of the running job until it leaves or is declared dead";
constexpr absl::string_view kAskAgain = " waits for the servers' reports before it rejoins: ask again";

}  // namespace

std::string StandbyRefusal(absl::string_view address, absl::string_view active) {
  if (active.empty()) return absl::StrCat(kStandby, address, "; no active scheduler known yet");
  return absl::StrCat(kStandby, address, "; active is ", active);
}

std::string StoppedRefusal(absl::string_view address, absl::string_view why) {
  return absl::StrCat(kScheduler, address, kStopped, why);
}

std::string RankStillHeldRefusal(uint32_t rank, uint32_t heartbeat_timeout_ms) {
  return absl::StrCat("rank ", rank, "'s previous process", kStillHeld, " (heartbeat_timeout_ms ", heartbeat_timeout_ms,
                      ")");
}

bool IsRankStillHeldRefusal(absl::string_view message) { return absl::StrContains(message, kStillHeld); }

std::string RejoinAskAgainRefusal(uint32_t rank) { return absl::StrCat("rank ", rank, kAskAgain); }

bool IsRejoinAskAgainRefusal(absl::string_view message) { return absl::StrContains(message, kAskAgain); }

std::string DeclaredDeadRefusal(absl::string_view node) { return absl::StrCat(node, kDeclaredDead); }

bool IsDeclaredDeadRefusal(absl::string_view message) { return absl::StrContains(message, kDeclaredDead); }

bool IsSchedulerRefusal(absl::string_view message) {
  return absl::StartsWith(message, kStandby) ||
         (absl::StartsWith(message, kScheduler) && absl::StrContains(message, kStopped));
}

}  // namespace shardps
