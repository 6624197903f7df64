#include "scheduler/state_record.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

namespace shardps {
namespace {

using ::testing::HasSubstr;

ClusterConfig Config(int servers) {
  ClusterConfig c;
  c.set_num_servers(servers);
  c.set_num_workers(1);
  return c;
}

const StateOrigin kOrigin{.where = "etcd key /p/state", .elsewhere = "another --etcd-prefix", .who = "scheduler"};

TEST(StateRecordTest, WithNothingSavedANewClusterOfTheGivenConfigIsServed) {
  auto state = ResumeOrCreateState(std::nullopt, Config(2), kOrigin, nullptr);
  ASSERT_TRUE(state.ok()) << state.status();
  ClusterConfig served = (*state)->config();
  EXPECT_NE(served.job_id(), 0u) << "a new job gets its id";
  served.clear_job_id();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(served, Config(2)));
  auto another = ResumeOrCreateState(std::nullopt, Config(2), kOrigin, nullptr);
  ASSERT_TRUE(another.ok());
  EXPECT_NE((*another)->config().job_id(), (*state)->config().job_id());
}

TEST(StateRecordTest, AResumedClusterKeepsItsJobId) {
  SchedulerState saved;
  *saved.mutable_config() = Config(2);
  saved.mutable_config()->set_job_id(12345);
  auto state = ResumeOrCreateState(saved, Config(2), kOrigin, nullptr);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ((*state)->config().job_id(), 12345u);
}

TEST(StateRecordTest, AStateSavedWithAnotherConfigIsRefusedNamingWhereAndWhatToDo) {
  SchedulerState saved;
  *saved.mutable_config() = Config(3);
  auto state = ResumeOrCreateState(saved, Config(2), kOrigin, nullptr);
  ASSERT_TRUE(absl::IsFailedPrecondition(state.status())) << state.status();
  EXPECT_THAT(std::string(state.status().message()), HasSubstr("etcd key /p/state holds a cluster with another"));
  EXPECT_THAT(std::string(state.status().message()), HasSubstr("use another --etcd-prefix"));
}

}  // namespace
}  // namespace shardps
