#include "tools/fault_injection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "common/scheduler_client.h"
#include "tools/process.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(FaultSpecTest, ParsesEachRole) {
  auto server = ParseFaultSpec("server:1@600", 3, 3);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->role, FaultSpec::Role::kServer);
  EXPECT_EQ(server->index, 1);
  EXPECT_EQ(server->step, 600);
  auto worker = ParseFaultSpec("worker:2@5", 3, 3);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->role, FaultSpec::Role::kWorker);
  auto scheduler = ParseFaultSpec("scheduler@7", 3, 3);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  EXPECT_EQ(scheduler->role, FaultSpec::Role::kScheduler);
  EXPECT_EQ(scheduler->step, 7);
  auto moving = ParseFaultSpec("server:0@moving", 3, 3);
  ASSERT_TRUE(moving.ok()) << moving.status();
  EXPECT_EQ(moving->when, FaultSpec::When::kWhileMoving);
  EXPECT_EQ(server->when, FaultSpec::When::kAtStep);
  auto handoff = ParseFaultSpec("server:0@handoff", 3, 3);
  ASSERT_TRUE(handoff.ok()) << handoff.status();
  EXPECT_EQ(handoff->when, FaultSpec::When::kWhileHandingOff);
}

TEST(FaultSpecTest, NamesASpecAsKillTakesIt) {
  for (const char* spec : {"server:1@600", "worker:2@7", "scheduler@600", "server:0@moving", "server:2@handoff"}) {
    auto f = ParseFaultSpec(spec, 3, 3);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(FaultSpecName(*f), spec);
  }
}

TEST(FaultSpecTest, RefusesWhatCannotBeInjectedSayingWhy) {
  EXPECT_THAT(ParseFaultSpec("server:3@600", 3, 3).status().message(), HasSubstr("no server 3 among 3"));
  EXPECT_THAT(ParseFaultSpec("worker:0@600", 3, 3).status().message(), HasSubstr("kill another rank"));
  EXPECT_THAT(ParseFaultSpec("server:1", 3, 3).status().message(), HasSubstr("no @STEP"));
  EXPECT_THAT(ParseFaultSpec("server:1@0", 3, 3).status().message(), HasSubstr("positive"));
  EXPECT_THAT(ParseFaultSpec("server:1@move", 3, 3).status().message(), HasSubstr("positive"));
  EXPECT_THAT(ParseFaultSpec("router@5", 3, 3).status().message(), HasSubstr("unknown role 'router'"));
  EXPECT_THAT(ParseFaultSpec("server:x@5", 3, 3).status().message(), HasSubstr("INDEX"));
}

TEST(FaultSpecTest, JsonReportsUnseenMeasurementsAsNull) {
  FaultRecord r;
  r.spec = *ParseFaultSpec("worker:2@600", 3, 3);
  r.detected_seconds = 2.5;
  EXPECT_EQ(FaultsJson({r}),
            "[{\"role\": \"worker\", \"index\": 2, \"step\": 600, \"detected_seconds\": 2.500, "
            "\"recovered_seconds\": null}]");
}

TEST(FaultInjectorTest, AKillOfAServerNotRegisteredYetWaitsForItsIndex) {
  // --add-server 20 --kill server:2@21: at step 21 the added process may not
  // have registered yet. The kill waits for index 2 rather than failing the
  // job ("no server process reported index 2"), then lands on it.
  auto plan = ParseFaultSpec("server:2@21", 3, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto client = SchedulerClient::Create("127.0.0.1:1");  // nothing answers: measurements stay unseen
  ASSERT_TRUE(client.ok()) << client.status();
  FaultInjector injector({*plan}, std::move(*client), absl::Seconds(2), [] { return ChildProcess{}; });
  auto added = Spawn("server 2", {"/bin/sleep", "30"}, SpawnOptions{});
  ASSERT_TRUE(added.ok()) << added.status();
  std::vector<ChildProcess> daemons = {ChildProcess{"scheduler"}, ChildProcess{"server 0"}, ChildProcess{"server 1"},
                                       *added};
  std::vector<ChildProcess> workers;
  bool registered = false;
  auto slot = [&registered](int index) -> absl::StatusOr<size_t> {
    if (index == 2 && registered) return 3;
    return absl::NotFoundError(absl::StrCat("no server process reported index ", index));
  };
  ASSERT_TRUE(injector.Tick(21, {daemons, workers, slot}).ok());
  EXPECT_THAT(injector.records(), ::testing::IsEmpty());
  EXPECT_THAT(injector.pending(), ::testing::SizeIs(1));
  registered = true;
  ASSERT_TRUE(injector.Tick(22, {daemons, workers, slot}).ok());
  ASSERT_THAT(injector.records(), ::testing::SizeIs(1));
  EXPECT_EQ(injector.records()[0].spec.index, 2);
  EXPECT_THAT(injector.pending(), ::testing::IsEmpty());
  EXPECT_FALSE(daemons[3].running()) << "killed and reaped";
  EXPECT_NE(kill(added->pid, 0), 0) << "the process is gone";
}

}  // namespace
}  // namespace shardps
