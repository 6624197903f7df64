#include "common/failover_scheduler_client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardps {

FailoverSchedulerClient::FailoverSchedulerClient(std::string address,
                                                 std::vector<std::unique_ptr<SchedulerClient>> clients)
    : SchedulerClient(std::move(address)), clients_(std::move(clients)) {}

absl::Status FailoverSchedulerClient::Run(absl::Duration timeout,
                                          absl::FunctionRef<absl::Status(SchedulerClient&, absl::Duration)> call) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> said;  // filled on the first refusal: the error names each one's answer
  absl::Duration pause = absl::Milliseconds(50);
  const size_t first = current_.load();
  size_t i = first;
  for (absl::Duration left = timeout; left > absl::ZeroDuration(); left = deadline - absl::Now()) {
    absl::Status s = call(*clients_[i], left);
    if (!absl::IsUnavailable(s)) {
      current_.store(i);
      return s;
    }
    if (said.empty()) said.assign(clients_.size(), "not tried");
    said[i] = std::string(s.message());
    i = (i + 1) % clients_.size();
    if (i == first) {  // every one refused or is down: a standby may be taking over
      absl::SleepFor(std::min(pause, deadline - absl::Now()));
      pause = std::min(pause * 2, absl::Milliseconds(500));
    }
  }
  if (said.empty()) said.assign(clients_.size(), "not tried");
  std::string detail;
  for (const std::string& s : said) absl::StrAppend(&detail, detail.empty() ? "" : "; ", s);
  return absl::UnavailableError(absl::StrCat("no scheduler of ", address(), " answered as the active one within ",
                                             absl::FormatDuration(timeout), " (", detail, ")"));
}

template <typename T, typename Call>
absl::StatusOr<T> FailoverSchedulerClient::RunFor(absl::Duration timeout, Call call) {
  absl::StatusOr<T> r;
  absl::Status s = Run(timeout, [&](SchedulerClient& c, absl::Duration left) {
    r = call(c, left);
    return r.status();
  });
  if (!s.ok()) return s;
  return r;
}

absl::StatusOr<RegisterResponse> FailoverSchedulerClient::Register(const RegisterRequest& request,
                                                                   absl::Duration timeout) {
  return RunFor<RegisterResponse>(timeout, [&](SchedulerClient& c, absl::Duration left) {
    return c.Register(request, left);
  });
}

absl::StatusOr<HeartbeatResponse> FailoverSchedulerClient::Heartbeat(const HeartbeatRequest& request,
                                                                     absl::Duration timeout) {
  return RunFor<HeartbeatResponse>(timeout, [&](SchedulerClient& c, absl::Duration left) {
    return c.Heartbeat(request, left);
  });
}

absl::StatusOr<ShardMap> FailoverSchedulerClient::DefineTensors(const DefineTensorsRequest& request,
                                                                absl::Duration timeout) {
  return RunFor<ShardMap>(timeout, [&](SchedulerClient& c, absl::Duration left) {
    return c.DefineTensors(request, left);
  });
}

absl::Status FailoverSchedulerClient::Barrier(const BarrierRequest& request, absl::Duration timeout,
                                              BarrierResponse* response) {
  return Run(timeout,
             [&](SchedulerClient& c, absl::Duration left) { return c.Barrier(request, left, response); });
}

absl::StatusOr<StatusResponse> FailoverSchedulerClient::Status(absl::Duration timeout) {
  return RunFor<StatusResponse>(timeout, [&](SchedulerClient& c, absl::Duration left) { return c.Status(left); });
}

absl::StatusOr<CheckpointResponse> FailoverSchedulerClient::RequestCheckpoint(const CheckpointRequest& request,
                                                                              absl::Duration timeout) {
  return RunFor<CheckpointResponse>(timeout, [&](SchedulerClient& c, absl::Duration left) {
    return c.RequestCheckpoint(request, left);
  });
}

absl::StatusOr<DrainResponse> FailoverSchedulerClient::Drain(const DrainRequest& request, absl::Duration timeout) {
  return RunFor<DrainResponse>(timeout, [&](SchedulerClient& c, absl::Duration left) { return c.Drain(request, left); });
}

// Watches through one address at a time: when that stream breaks, it moves
// to the scheduler calls last found active (or the next address), pausing
// after every round of failures (at most 1 s).
class FailoverSchedulerClient::FollowingWatch : public Watch {
 public:
  FollowingWatch(FailoverSchedulerClient* parent, uint64_t node_id, std::function<void(const ShardMap&)> on_map,
                 std::function<void(const absl::Status&)> on_error)
      : parent_(parent), node_id_(node_id), on_map_(std::move(on_map)), on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FollowingWatch() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    const size_t n = parent_->clients_.size();
    size_t i = parent_->current_.load();
    absl::Duration pause = absl::Milliseconds(100);
    for (size_t failures = 1;; ++failures) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return;
        broken_ = false;
      }
      auto watch = parent_->clients_[i]->WatchShardMap(
          node_id_, [this](const ShardMap& map) { Deliver(map); },
          [this](const absl::Status& s) {
            absl::MutexLock lock(&mu_);
            broken_ = true;
            error_ = s;
          });
      absl::Status error;
      {
        absl::MutexLock lock(&mu_);
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return broken_ || cancelled_; };
        mu_.Await(absl::Condition(&woken));
        error = error_;
      }
      watch.reset();  // joins its thread; it no longer calls Deliver
      if (Delivered()) pause = absl::Milliseconds(100), failures = 1;
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return;
      }
      on_error_(error);
      const size_t active = parent_->current_.load();
      i = active != i ? active : (i + 1) % n;
      if (failures % n == 0) {
        absl::MutexLock lock(&mu_);
        auto cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; };
        mu_.AwaitWithTimeout(absl::Condition(&cancelled), pause);
        pause = std::min(pause * 2, absl::Seconds(1));
      }
    }
  }

  // Delivers maps newer than any delivered before (a scheduler that took
  // over starts the stream again from its current map).
  void Deliver(const ShardMap& map) {
    absl::MutexLock lock(&deliver_mu_);
    delivered_ = true;
    if (map.epoch() <= last_epoch_) return;
    last_epoch_ = map.epoch();
    on_map_(map);
  }
  // Whether a stream delivered anything since the last call.
  bool Delivered() {
    absl::MutexLock lock(&deliver_mu_);
    return std::exchange(delivered_, false);
  }

  FailoverSchedulerClient* const parent_;
  const uint64_t node_id_;
  const std::function<void(const ShardMap&)> on_map_;
  const std::function<void(const absl::Status&)> on_error_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Mutex deliver_mu_;
  uint64_t last_epoch_ ABSL_GUARDED_BY(deliver_mu_) = 0;
  bool delivered_ ABSL_GUARDED_BY(deliver_mu_) = false;
  std::thread thread_;
};

std::unique_ptr<SchedulerClient::Watch> FailoverSchedulerClient::WatchShardMap(
    uint64_t node_id, std::function<void(const ShardMap&)> on_map,
    std::function<void(const absl::Status&)> on_error) {
  return std::make_unique<FollowingWatch>(this, node_id, std::move(on_map), std::move(on_error));
}

}  // namespace shardps
