#include "common/failover_scheduler_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/scheduler_refusal.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

// One address: either the active scheduler (answers status with its name,
// streams maps) or not (UNAVAILABLE, as a standby or a dead one).
class FakeScheduler : public SchedulerClient {
 public:
  explicit FakeScheduler(std::string address) : SchedulerClient(std::move(address)) {}
  void SetActive(bool active) {
    absl::MutexLock lock(&mu_);
    active_ = active;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  absl::StatusOr<StatusResponse> Status(absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (!active_) return absl::UnavailableError(StandbyRefusal(address(), ""));
    StatusResponse r;
    r.mutable_config()->set_num_servers(static_cast<uint32_t>(address().back() - '0'));
    return r;
  }
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest&, absl::Duration) override {
    return absl::NotFoundError("unknown node");
  }
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest&, absl::Duration) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<ShardMap> DefineTensors(const DefineTensorsRequest&, absl::Duration) override {
    return absl::UnimplementedError("");
  }
  absl::Status Barrier(const BarrierRequest&, absl::Duration, BarrierResponse*) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<CheckpointResponse> RequestCheckpoint(const CheckpointRequest&, absl::Duration) override {
    return absl::UnimplementedError("");
  }
  // Active: delivers a map of epoch 3 once; otherwise fails at once.
  std::unique_ptr<Watch> WatchShardMap(uint64_t, std::function<void(const ShardMap&)> on_map,
                                       std::function<void(const absl::Status&)> on_error) override {
    bool active;
    {
      absl::MutexLock lock(&mu_);
      active = active_;
    }
    if (active) {
      ShardMap map;
      map.set_epoch(3);
      on_map(map);
    } else {
      on_error(absl::UnavailableError("standby"));
    }
    return std::make_unique<Watch>();
  }

 private:
  absl::Mutex mu_;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Pair {
  FakeScheduler* a;
  FakeScheduler* b;
  std::unique_ptr<FailoverSchedulerClient> client;
};

Pair MakePair() {
  std::vector<std::unique_ptr<SchedulerClient>> clients;
  clients.push_back(std::make_unique<FakeScheduler>("a:1"));
  clients.push_back(std::make_unique<FakeScheduler>("b:2"));
  Pair p{static_cast<FakeScheduler*>(clients[0].get()), static_cast<FakeScheduler*>(clients[1].get()), nullptr};
  p.client = std::make_unique<FailoverSchedulerClient>("a:1,b:2", std::move(clients));
  return p;
}

TEST(FailoverSchedulerClientTest, ACallMovesPastAStandbyToTheActiveOneAndStaysThere) {
  Pair p = MakePair();
  p.b->SetActive(true);
  auto status = p.client->Status(absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->config().num_servers(), 2u);
  ASSERT_TRUE(p.client->Status(absl::Seconds(5)).ok());
  EXPECT_EQ(p.a->calls(), 1) << "the second call should go to the one that answered";
}

TEST(FailoverSchedulerClientTest, ACallWaitsWithinItsDeadlineForAStandbyToTakeOver) {
  Pair p = MakePair();
  std::thread takeover([&] {
    absl::SleepFor(absl::Milliseconds(300));
    p.a->SetActive(true);
  });
  auto status = p.client->Status(absl::Seconds(10));
  takeover.join();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->config().num_servers(), 1u);
}

TEST(FailoverSchedulerClientTest, WithNoActiveSchedulerTheErrorNamesWhatEachSaid) {
  Pair p = MakePair();
  auto status = p.client->Status(absl::Milliseconds(200));
  ASSERT_TRUE(absl::IsUnavailable(status.status())) << status.status();
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("standby scheduler at a:1"));
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("standby scheduler at b:2"));
}

TEST(FailoverSchedulerClientTest, OtherErrorsAreTheActiveSchedulersAnswerAndNotRetried) {
  Pair p = MakePair();
  auto beat = p.client->Heartbeat(HeartbeatRequest(), absl::Seconds(5));
  EXPECT_TRUE(absl::IsNotFound(beat.status())) << beat.status();
}

TEST(FailoverSchedulerClientTest, TheMapWatchFindsTheActiveSchedulerAndDeliversANewMapOnce) {
  Pair p = MakePair();
  p.b->SetActive(true);
  absl::Mutex mu;
  std::vector<uint64_t> epochs;
  auto watch = p.client->WatchShardMap(
      7,
      [&](const ShardMap& m) {
        absl::MutexLock lock(&mu);
        epochs.push_back(m.epoch());
      },
      [](const absl::Status&) {});
  absl::MutexLock lock(&mu);
  auto delivered = [&] { return !epochs.empty(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&delivered), absl::Seconds(10)));
  EXPECT_EQ(epochs, std::vector<uint64_t>{3});
}

}  // namespace
}  // namespace shardps
