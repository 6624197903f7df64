#include "common/scheduler_refusal.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr absl::string_view kStandby = "standby scheduler at ";
constexpr absl::string_view kScheduler = "scheduler at ";
constexpr absl::string_view kStopped = " stopped serving: ";

}  // namespace

std::string StandbyRefusal(absl::string_view address, absl::string_view active) {
  if (active.empty()) return absl::StrCat(kStandby, address, "; no active scheduler known yet");
  return absl::StrCat(kStandby, address, "; active is ", active);
}

std::string StoppedRefusal(absl::string_view address, absl::string_view why) {
  return absl::StrCat(kScheduler, address, kStopped, why);
}

bool IsSchedulerRefusal(absl::string_view message) {
  return absl::StartsWith(message, kStandby) ||
         (absl::StartsWith(message, kScheduler) && absl::StrContains(message, kStopped));
}

}  // namespace shardps
