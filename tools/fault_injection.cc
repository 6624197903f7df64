#include "tools/fault_injection.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/scheduler_client.h"

namespace shardps {

std::string RoleName(FaultSpec::Role role) {
  switch (role) {
    case FaultSpec::Role::kScheduler:
      return "scheduler";
    case FaultSpec::Role::kServer:
      return "server";
    case FaultSpec::Role::kWorker:
      return "worker";
  }
  return "?";
}

std::string FaultSpecName(const FaultSpec& spec) {
  std::string name = RoleName(spec.role);
  if (spec.role != FaultSpec::Role::kScheduler) absl::StrAppend(&name, ":", spec.index);
  switch (spec.when) {
    case FaultSpec::When::kAtStep:
      return absl::StrCat(name, "@", spec.step);
    case FaultSpec::When::kWhileMoving:
      return absl::StrCat(name, "@moving");
    case FaultSpec::When::kWhileHandingOff:
      return absl::StrCat(name, "@handoff");
  }
  return name;
}

absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view spec, int servers, int workers) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--kill '", spec, "': ", why,
                                                   " (expected ROLE[:INDEX]@STEP, @moving or @handoff, ROLE "
                                                   "scheduler, server or worker)"));
  };
  const size_t at = spec.rfind('@');
  if (at == absl::string_view::npos) return bad("no @STEP");
  FaultSpec f;
  const absl::string_view when = spec.substr(at + 1);
  if (when == "moving") {
    f.when = FaultSpec::When::kWhileMoving;
  } else if (when == "handoff") {
    f.when = FaultSpec::When::kWhileHandingOff;
  } else if (!absl::SimpleAtoi(when, &f.step) || f.step < 1) {
    return bad("STEP is not a positive integer");
  }
  absl::string_view who = spec.substr(0, at);
  absl::string_view role = who.substr(0, who.find(':'));
  const bool has_index = who.find(':') != absl::string_view::npos;
  if (has_index && !absl::SimpleAtoi(who.substr(who.find(':') + 1), &f.index)) return bad("INDEX is not an integer");
  if (role == "scheduler") {
    if (has_index && f.index != 0) return bad("there is one scheduler");
    f.role = FaultSpec::Role::kScheduler;
  } else if (role == "server") {
    f.role = FaultSpec::Role::kServer;
    if (f.index < 0 || f.index >= servers) return bad(absl::StrCat("no server ", f.index, " among ", servers));
  } else if (role == "worker") {
    f.role = FaultSpec::Role::kWorker;
    if (f.index < 0 || f.index >= workers) return bad(absl::StrCat("no worker ", f.index, " among ", workers));
    if (f.index == 0) return bad("worker 0's steps time the faults; kill another rank");
  } else {
    return bad(absl::StrCat("unknown role '", role, "'"));
  }
  return f;
}

FaultInjector::FaultInjector(std::vector<FaultSpec> plan, std::shared_ptr<SchedulerClient> scheduler,
                             absl::Duration restart_after,
                             std::function<absl::StatusOr<ChildProcess>()> restart_scheduler)
    : plan_(std::move(plan)),
      scheduler_(std::move(scheduler)),
      restart_after_(restart_after),
      restart_scheduler_(std::move(restart_scheduler)) {
  std::stable_sort(plan_.begin(), plan_.end(), [](const FaultSpec& a, const FaultSpec& b) { return a.step < b.step; });
}

FaultInjector::~FaultInjector() = default;

bool FaultInjector::WorkerKilled(int rank) const {
  for (const FaultRecord& r : records_) {
    if (r.spec.role == FaultSpec::Role::kWorker && r.spec.index == rank) return true;
  }
  return false;
}

bool FaultInjector::ServerKilled(int index) const {
  for (const FaultRecord& r : records_) {
    if (r.spec.role == FaultSpec::Role::kServer && r.spec.index == index) return true;
  }
  return false;
}

absl::Status FaultInjector::Tick(int64_t step, ClusterProcesses processes) {
  const absl::Time now = absl::Now();
  using When = FaultSpec::When;
  const bool waits =
      std::any_of(plan_.begin(), plan_.end(), [](const FaultSpec& f) { return f.when != When::kAtStep; });
  const Balancing balancing = waits ? BalancingUnderWay() : Balancing{};
  for (auto it = plan_.begin(); it != plan_.end();) {
    bool due = false;
    switch (it->when) {
      case When::kAtStep: due = it->step <= step; break;
      case When::kWhileMoving: due = balancing.moving; break;
      case When::kWhileHandingOff: due = balancing.handing_off; break;
    }
    if (!due) {
      ++it;
      continue;
    }
    size_t slot = 0;
    if (it->role == FaultSpec::Role::kServer) {
      auto found = processes.server_slot(it->index);
      // A server started by --add-server (or a replacement) that has not
      // registered yet: its kill waits until it has an index to kill. One
      // that never registers is reported as a kill that never happened.
      if (absl::IsNotFound(found.status())) {
        ++it;
        continue;
      }
      if (!found.ok()) return found.status();
      slot = *found;
    }
    FaultSpec f = *it;
    it = plan_.erase(it);
    if (f.when != When::kAtStep) f.step = step;
    Kill(f.role == FaultSpec::Role::kWorker ? processes.workers[f.index] : processes.daemons[slot]);
    records_.push_back(FaultRecord{f});
    injected_.push_back(Injected{records_.size() - 1, now});
    if (f.role == FaultSpec::Role::kScheduler) restart_due_ = now + restart_after_;
  }
  if (now >= restart_due_) {
    restart_due_ = absl::InfiniteFuture();
    auto restarted = restart_scheduler_();
    if (!restarted.ok()) return restarted.status();
    processes.daemons[0] = *restarted;
    restarted_at_ = absl::Now();
  }
  Measure(step);
  return absl::OkStatus();
}

FaultInjector::Balancing FaultInjector::BalancingUnderWay() {
  auto status = scheduler_->Status(absl::Milliseconds(200));
  if (!status.ok()) return {};
  // Under way now, or planned and finished between two polls (a move or a
  // hand-off can finish within a few milliseconds): the kill lands in or
  // just after it.
  return {status->shard_map().moves_size() > 0 || status->copy_moves_planned() > 0,
          status->shard_map().handoffs_size() > 0 || status->handoffs_planned() > 0};
}

void FaultInjector::Measure(int64_t step) {
  const absl::Time now = absl::Now();
  const bool open = std::any_of(injected_.begin(), injected_.end(),
                                [this](const Injected& i) { return records_[i.record].recovered_seconds < 0; });
  if (!open || now < next_poll_) return;
  next_poll_ = now + absl::Milliseconds(100);
  auto status = scheduler_->Status(absl::Milliseconds(500));
  if (!status.ok()) return;  // the scheduler is down: nothing to learn yet
  for (Injected& i : injected_) {
    FaultRecord& r = records_[i.record];
    const double since_kill = absl::ToDoubleSeconds(now - i.killed_at);
    if (r.spec.role == FaultSpec::Role::kScheduler) {
      if (restarted_at_ == absl::InfiniteFuture() || r.recovered_seconds >= 0) continue;
      if (r.detected_seconds < 0) r.detected_seconds = since_kill;  // the restarted scheduler answers
      bool all = true;
      for (const NodeStatus& n : status->nodes()) {
        if (!n.declared_dead() && !n.heard_since_start()) all = false;
      }
      if (all) r.recovered_seconds = since_kill;
      continue;
    }
    const Role role = r.spec.role == FaultSpec::Role::kServer ? SERVER : WORKER;
    if (r.detected_seconds < 0) {
      for (const NodeStatus& n : status->nodes()) {
        if (n.role() == role && static_cast<int>(n.rank()) == r.spec.index && n.declared_dead()) {
          r.detected_seconds = since_kill;
          i.step_at_detection = step;
        }
      }
    } else if (r.recovered_seconds < 0 && step > i.step_at_detection) {
      r.recovered_seconds = since_kill;
    }
  }
}

std::string FaultsJson(const std::vector<FaultRecord>& records) {
  auto seconds = [](double s) { return s < 0 ? std::string("null") : absl::StrFormat("%.3f", s); };
  std::vector<std::string> items;
  for (const FaultRecord& r : records) {
    items.push_back(absl::StrFormat(
        "{\"role\": \"%s\", \"index\": %d, \"step\": %d, \"detected_seconds\": %s, \"recovered_seconds\": %s}",
        RoleName(r.spec.role), r.spec.index, r.spec.step, seconds(r.detected_seconds),
        seconds(r.recovered_seconds)));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

}  // namespace shardps
