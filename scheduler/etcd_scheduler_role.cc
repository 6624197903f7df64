#include "scheduler/etcd_scheduler_role.h"

#include <algorithm>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/scheduler_refusal.h"
#include "scheduler/state_record.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<EtcdSchedulerRole>> EtcdSchedulerRole::Start(std::unique_ptr<EtcdElection> election,
                                                                            const ClusterConfig& config,
                                                                            std::string address, Hooks hooks) {
  auto role = std::unique_ptr<EtcdSchedulerRole>(
      new EtcdSchedulerRole(std::move(election), config, std::move(address), std::move(hooks)));
  if (absl::Status s = role->Step(); !s.ok() && !absl::IsUnavailable(s)) return s;
  role->thread_ = std::thread([r = role.get()] { r->Loop(); });
  return role;
}

EtcdSchedulerRole::EtcdSchedulerRole(std::unique_ptr<EtcdElection> election, const ClusterConfig& config,
                                     std::string address, Hooks hooks)
    : election_(std::move(election)), config_(config), address_(std::move(address)), hooks_(std::move(hooks)) {}

EtcdSchedulerRole::~EtcdSchedulerRole() { Stop(); }

void EtcdSchedulerRole::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  election_->CancelWaits();
  if (thread_.joinable()) thread_.join();
}

absl::Status EtcdSchedulerRole::failure() {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void EtcdSchedulerRole::Loop() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !failure_.ok(); };
  while (!done()) {
    mu_.Unlock();
    absl::Status s = Step();
    const bool watched = s.ok() && !active_ && AwaitLeaderGone();
    mu_.Lock();
    if (!s.ok() && absl::IsUnavailable(s)) {
      LOG_EVERY_N(WARNING, 20) << "scheduler: etcd: " << s << " [" << google::COUNTER << " so far]";
    } else if (!s.ok() && failure_.ok()) {
      failure_ = s;
    }
    if (!watched) mu_.AwaitWithTimeout(absl::Condition(&done), election_->poll_period());
  }
  if (stop_) return;
  LOG(ERROR) << "scheduler at " << address_ << ": " << failure_ << "; it stops serving";
  hooks_.refuse(StoppedRefusal(address_, failure_.message()));
  mu_.Unlock();
  hooks_.stop_serving();
  mu_.Lock();
}

// A standby waits on an etcd watch until the active scheduler's leader key
// goes, or its own lease renewal falls due, or Stop(). False when the watch
// failed: the loop then polls.
bool EtcdSchedulerRole::AwaitLeaderGone() {
  auto gone = election_->AwaitLeaderGone(std::max(election_->UntilRenewal(), election_->poll_period()));
  if (gone.ok()) return true;
  LOG_EVERY_N(WARNING, 20) << "scheduler: etcd: " << gone.status() << "; polling instead";
  return false;
}

// Unavailable: try again at the next round (a standby's every error is);
// other errors end serving: the lease lost after winning, or a state that
// cannot be resumed.
absl::Status EtcdSchedulerRole::Step() {
  absl::Status renewed = election_->KeepAlive();
  if (absl::IsFailedPrecondition(renewed)) return renewed;
  if (active_) return renewed;
  if (!renewed.ok()) return absl::UnavailableError(renewed.message());
  std::string holder;
  auto won = election_->Campaign(&holder);
  if (!won.ok()) return absl::UnavailableError(won.status().message());
  if (!*won) {
    if (holder != last_holder_) LOG(WARNING) << "scheduler at " << address_ << ": standby; active is " << holder;
    last_holder_ = holder;
    hooks_.refuse(StandbyRefusal(address_, holder));
    return absl::OkStatus();
  }
  if (absl::Status s = TakeOver(); !s.ok()) return s;
  active_ = true;
  return absl::OkStatus();
}

// Loads the state (refusing a corrupt one or one with another config, naming
// the key) and has the daemon serve it.
absl::Status EtcdSchedulerRole::TakeOver() {
  auto saved = election_->LoadState();
  if (!saved.ok()) return saved.status();
  const std::string where = absl::StrCat("etcd key ", election_->state_key());
  ClusterState::Persist persist = SealedStateWriter([this](const std::string& sealed) {
    absl::Status s = election_->StoreState(sealed);
    if (absl::IsFailedPrecondition(s)) Depose(s);
    return s;
  });
  std::optional<SchedulerState> state;
  if (saved->has_value()) {
    auto parsed = ParseStateRecord(**saved, where);
    if (!parsed.ok()) return parsed.status();
    state = *std::move(parsed);
  }
  auto resumed = ResumeOrCreateState(state, config_,
                                     {.where = where,
                                      .elsewhere = "another --etcd-prefix",
                                      .who = absl::StrCat("scheduler at ", address_, ": active")},
                                     std::move(persist));
  if (!resumed.ok()) return resumed.status();
  hooks_.activate(*std::move(resumed));
  return absl::OkStatus();
}

void EtcdSchedulerRole::Depose(const absl::Status& why) {
  hooks_.refuse(StoppedRefusal(address_, absl::StrCat("deposed: ", why.message())));
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = absl::FailedPreconditionError(absl::StrCat("deposed: ", why.message()));
}

}  // namespace shardps
