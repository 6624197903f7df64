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
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*state)->config(), Config(2)));
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
