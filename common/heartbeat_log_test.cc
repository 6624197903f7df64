#include "common/heartbeat_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1000);
const absl::Duration kInterval = absl::Seconds(1);

absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

TEST(HeartbeatLogTest, HeartbeatsOnTimeAndAnsweredSayNothing) {
  HeartbeatLog log("worker 1", kInterval, absl::Seconds(10));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(log.Sending(At(i)), std::nullopt);
    EXPECT_EQ(log.Answered(absl::OkStatus(), At(i + 0.01)), std::nullopt);
  }
}

TEST(HeartbeatLogTest, TheFirstFailureAndEveryTenthAreToldWithTheirCountThenTheRecovery) {
  HeartbeatLog log("worker 1", kInterval, absl::Seconds(10));
  std::vector<std::string> lines;
  for (int i = 0; i < 25; ++i) {
    EXPECT_EQ(log.Sending(At(2 * i)), std::nullopt);
    auto line = log.Answered(absl::DeadlineExceededError("no answer"), At(2 * i + 1));
    if (line) lines.push_back(*line);
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("worker 1: heartbeat failed (1 failure): "
                                  "DEADLINE_EXCEEDED: no answer"));
  EXPECT_THAT(lines[1], HasSubstr("(11 in a row)"));
  EXPECT_THAT(lines[2], HasSubstr("(21 in a row)"));
  EXPECT_EQ(log.Sending(At(50)), std::nullopt);
  auto recovered = log.Answered(absl::OkStatus(), At(50.5));
  ASSERT_TRUE(recovered.has_value());
  EXPECT_THAT(*recovered, HasSubstr("worker 1: heartbeat answered again after 25 failed over 50.5s"));
  EXPECT_EQ(log.Sending(At(51.5)), std::nullopt);
  EXPECT_EQ(log.Answered(absl::OkStatus(), At(51.6)), std::nullopt) << "told once";
}

TEST(HeartbeatLogTest, EachNodeCountsItsOwnFailures) {
  HeartbeatLog first("worker 0", kInterval, absl::Seconds(10));
  HeartbeatLog second("worker 1", kInterval, absl::Seconds(10));
  first.Sending(At(0));
  ASSERT_TRUE(first.Answered(absl::UnavailableError("down"), At(1)).has_value());
  second.Sending(At(0.5));
  auto line = second.Answered(absl::UnavailableError("down"), At(1.5));
  ASSERT_TRUE(line.has_value()) << "the other worker's failure hides none of this one's";
  EXPECT_THAT(*line, HasSubstr("worker 1: heartbeat failed (1 failure)"));
}

TEST(HeartbeatLogTest, ALoopThatSendsLateSaysWhereTheTimeWent) {
  HeartbeatLog log("worker 1", kInterval, absl::Seconds(10));
  EXPECT_EQ(log.Sending(At(0)), std::nullopt);
  EXPECT_EQ(log.Answered(absl::OkStatus(), At(0.25)), std::nullopt);
  // Nothing sent for 9 s after an answer in 0.25 s: the loop was held.
  auto held = log.Sending(At(9));
  ASSERT_TRUE(held.has_value());
  EXPECT_THAT(*held, HasSubstr("worker 1: heartbeat sent 9s after the previous one (250ms in that call, 8.75s "
                               "waiting to send again; interval 1s, timeout 10s)"));
  // A call that hangs past its deadline shows in the first figure instead.
  EXPECT_EQ(log.Answered(absl::OkStatus(), At(15)), std::nullopt);
  auto hung = log.Sending(At(16));
  ASSERT_TRUE(hung.has_value());
  EXPECT_THAT(*hung, HasSubstr("sent 7s after the previous one (6s in that call, 1s waiting"));
}

TEST(HeartbeatLogTest, AGapOfUpToHalfTheTimeoutAndThreeIntervalsIsNotLate) {
  HeartbeatLog log("server 0", kInterval, absl::Seconds(10));
  log.Sending(At(0));
  log.Answered(absl::DeadlineExceededError("slow"), At(1));
  EXPECT_EQ(log.Sending(At(5)), std::nullopt);
  // With a long interval the bound is 3 intervals, not half the timeout.
  HeartbeatLog slow("server 1", absl::Seconds(4), absl::Seconds(10));
  slow.Sending(At(0));
  EXPECT_EQ(slow.Sending(At(12)), std::nullopt);
  EXPECT_TRUE(slow.Sending(At(24.5)).has_value());
}

}  // namespace
}  // namespace shardps
