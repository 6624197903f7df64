// A primary handing its role to a backup (ShardMap.handoffs): two engines,
// server 0 the primary and server 1 the backup of partition 5
// (ReplicaPairTest).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "server/engine_test_util.h"

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class HandoffTest : public ReplicaPairTest {};

TEST_F(HandoffTest, ASyncRoundStartedBeforeTheHandoffCompletesAndTheNextIsHeldUntilTheBackupConfirmed) {
  Make(SYNC);
  const uint64_t first = Send(0, PUSH, 0, 0, {2, 2});
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty()) << "round 0 is started: it must complete first";
  const uint64_t second = Send(0, PUSH, 1, 0, {4, 4});  // completes round 0
  Send(0, PUSH, 0, 1, {8, 8}, 4);  // would start round 1
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty()) << "round 0 is not confirmed by the backup yet";
  EXPECT_THAT(answers_, IsEmpty());
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(first, second)) << "round 0's pushes, not round 1's";
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
  EXPECT_EQ(engines_[0]->HandoffsDone()[0].epoch(), 4u);
  EXPECT_EQ(engines_[0]->HandoffsDone()[0].completed(), 1u);
  Send(0, PUSH, 1, 1, {8, 8}, 4);
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(first, second)) << "round 1 must wait for the switch";
  EXPECT_THAT(Weights(0), ElementsAre(-2, -2));
  EXPECT_THAT(Weights(1), ElementsAre(-2, -2));
}

TEST_F(HandoffTest, TheSwitchLeavesHeldPushesUnansweredForTheWorkersToResendToTheNewPrimary) {
  Make(SYNC);
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  const uint64_t held0 = Send(0, PUSH, 0, 0, {2, 2}, 4);
  const uint64_t held1 = Send(0, PUSH, 1, 0, {4, 4}, 4);
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1)) << "no round was started: drained at once";
  Install(MapAt(5, 1, 0));  // server 1 the primary, server 0 its backup
  Send(0, PUSH, 0, 0, {2, 2}, 4);  // routed before the worker learned of the switch
  EXPECT_THAT(answers_, IsEmpty()) << "an answer from the old primary would settle the re-sent request";
  // The workers re-send to the new primary with the same request ids.
  Send(1, PUSH, 0, 0, {2, 2}, 5, held0);
  Send(1, PUSH, 1, 0, {4, 4}, 5, held1);
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(held0, held1));
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_THAT(Weights(1), ElementsAre(-2, -2));
  EXPECT_THAT(Weights(0), ElementsAre(-2, -2)) << "the old primary follows as a backup";
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty());
}

TEST_F(HandoffTest, AnOldPrimaryThatSkippedTheSwitchDropsItsCopyWhenAMapNoLongerListsIt) {
  // Found in review (replication 1: the old copy is dropped once the new
  // primary reports the switch): the watch keeps only the latest map, so
  // server 0 went from the hand-off (epoch 4) to the drop (epoch 6) without
  // the switch (5). Not listed, its copy kept the primary role: it refused
  // the new primary's snapshot ("server 0 is the primary"), reported stale
  // counts, and, never completing rounds, held back every later checkpoint
  // manifest of server 0 (267 of 300 rounds incomplete in a local job).
  Make(SYNC);
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1)) << "no round was started: drained at once";
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(5, 1, 0), 1).ok());
  const ShardMap dropped = MapAt(6, 1, std::nullopt);
  ASSERT_TRUE(engines_[0]->InstallShardMap(dropped, 0).ok());
  ASSERT_TRUE(engines_[1]->InstallShardMap(dropped, 1).ok());
  EXPECT_EQ(engines_[0]->weights(5), nullptr) << "the old primary kept its copy";
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty());
  // A primary the map drops along with its server (declared dead) keeps it,
  // as before: it is out of the job.
  Make(SYNC);
  Install(MapAt(4, 0, std::nullopt));
  ShardMap dead = MapAt(5, 1, std::nullopt);
  dead.mutable_servers(0)->set_dead(true);
  ASSERT_TRUE(engines_[0]->InstallShardMap(dead, 0).ok());
  EXPECT_NE(engines_[0]->weights(5), nullptr);
}

TEST_F(HandoffTest, AsyncHoldsEveryNewPushAndReportsDoneOnceTheBackupConfirmedTheLastApplied) {
  Make(ASYNC);
  const uint64_t applied = Send(0, PUSH, 0, 0, {2, 2});
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty()) << "the last push is not confirmed yet";
  Send(0, PUSH, 1, 0, {4, 4}, 4);
  Send(0, PUSH, 0, 0, {4, 4}, 4);
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(applied));
  EXPECT_EQ(engines_[0]->Queues().handoff_held, 2u) << "the held pushes show in the queue metrics";
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
  EXPECT_EQ(engines_[0]->HandoffsDone()[0].completed(), 1u);
  EXPECT_THAT(Weights(0), ElementsAre(0, 0)) << "one push of lr 1/2";
}

TEST_F(HandoffTest, AHandoffThatEndsWithoutASwitchReplaysWhatWasHeldInOrder) {
  Make(SYNC);
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  const uint64_t a = Send(0, PUSH, 0, 0, {2, 2}, 4);
  const uint64_t b = Send(0, PUSH, 1, 0, {4, 4}, 4);
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
  Install(MapAt(5, 0, 1));  // the hand-off ended (a timeout): server 0 stays the primary
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty());
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(a, b));
  EXPECT_THAT(Weights(0), ElementsAre(-2, -2));
  EXPECT_THAT(Weights(1), ElementsAre(-2, -2));
}

TEST_F(HandoffTest, AHandoffListedAgainAtALaterEpochIsReportedWithThatEpoch) {
  // The map that ended the first listing was skipped (a server installs only
  // the latest map): the report must name the listing the scheduler waits for.
  Make(SYNC);
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  Install(MapAt(6, 0, 1, /*handoff=*/true));
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
  EXPECT_EQ(engines_[0]->HandoffsDone()[0].epoch(), 6u);
}

TEST_F(HandoffTest, AnOldPrimaryThatSkippedTheSwitchDropsItsCopyWhenTheMapNoLongerListsIt) {
  // A primary move (replication 1): the switch (epoch 5) and the drop of the
  // old copy (epoch 6) came together, and server 0 installs only the latest.
  // Kept as a primary, it reported stale update counts, held a checkpoint's
  // manifest back, and refused the new primary's replicas.
  Make(SYNC);
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  const uint64_t held = Send(0, PUSH, 0, 0, {2, 2}, 4);
  ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(5, 1, 0), 1).ok());
  Install(MapAt(6, 1, std::nullopt));
  EXPECT_THAT(engines_[0]->UpdateCounts(), IsEmpty()) << "server 0 holds no copy of partition 5 now";
  EXPECT_EQ(engines_[0]->weights(5), nullptr);
  EXPECT_THAT(engines_[0]->HandoffsDone(), IsEmpty());
  Send(0, PUSH, 1, 0, {4, 4}, 4);  // routed before the switch, arriving after the drop
  EXPECT_THAT(answers_, IsEmpty()) << "an answer (even 'wrong epoch') would settle the request re-sent";
  Send(1, PUSH, 0, 0, {2, 2}, 6, held);  // re-sent to the new primary
  const uint64_t other = Send(1, PUSH, 1, 0, {4, 4}, 6);
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(held, other)) << "answered once each, by the new primary";
  EXPECT_THAT(Weights(1), ElementsAre(-2, -2));
}

TEST_F(HandoffTest, APrimaryMoveWithReplicationOneAnswersAfterTheSwitchAsAHandoffWithBackupsDoes) {
  // Replication 1 (a primary move: the new server an extra copy, then the
  // role handed to it) with onebit weight-delta pulls: the pull encoder's
  // state (the mirror of what the workers hold) must be on the new primary
  // as on a backup of replication 2, or its first answers are deltas from
  // another base than the workers' weights.
  const int n = 4096;
  std::vector<std::string> after_switch[2];
  for (const uint32_t replication : {2u, 1u}) {
    SCOPED_TRACE(replication);
    Make(
        SYNC,
        [&](ClusterConfig& config) {
          config.set_replication(replication);
          config.mutable_compression()->set_pull_codec("onebit");
        },
        n);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto round = [&](uint32_t server, uint64_t r, uint64_t epoch) {
      for (uint32_t rank : {0u, 1u}) {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        Send(server, PUSH_PULL, rank, r, g, epoch);
        Deliver();
      }
    };
    Install(MapAt(4, 0, std::nullopt));  // one copy, as with replication 1
    round(0, 0, 4);
    round(0, 1, 4);
    Install(MapAt(5, 0, 1));  // server 1 joined: an extra copy, from a snapshot
    Deliver();
    round(0, 2, 5);
    Install(MapAt(6, 0, 1, /*handoff=*/true));
    Deliver();
    ASSERT_THAT(engines_[0]->HandoffsDone(), SizeIs(1));
    Install(MapAt(7, 1, 0));  // the switch: server 1 the primary
    Deliver();
    answer_payloads_.clear();
    round(1, 3, 7);
    ASSERT_THAT(answer_payloads_, SizeIs(2));
    after_switch[replication - 1] = answer_payloads_;
  }
  EXPECT_TRUE(after_switch[0] == after_switch[1]) << "the new primary's answers differ with replication 1";
}

TEST_F(HandoffTest, APrimaryMoveWithReplicationOneAcknowledgesAPushOnlyOnceItsExtraCopyHoldsIt) {
  // Replication 1, phase 1 of a primary move: server 1 holds a synced extra
  // copy. The old primary dying now fails the partition over to it, so a
  // sync push it acknowledges must be on that copy, as with replication 2;
  // acknowledged when counted, the worker never sent it again and the
  // round waited on the new primary for a push that would not come.
  Make(SYNC, [](ClusterConfig& config) { config.set_replication(1); });
  const uint64_t pushed = Send(0, PUSH, 0, 0, {2, 2});
  const bool acknowledged = !answers_.empty();
  Install(MapAt(4, 1, std::nullopt));  // server 0 dies; its synced copy takes over
  if (!acknowledged) Send(1, PUSH, 0, 0, {2, 2}, 4, pushed);  // the worker re-sends what is unanswered
  Send(1, PUSH, 1, 0, {4, 4}, 4);
  Deliver();
  EXPECT_FALSE(acknowledged) << "acknowledged before the extra copy held it";
  EXPECT_THAT(Weights(1), ElementsAre(-2, -2)) << "round 0 on the new primary lacks worker 0's push";
}

TEST_F(HandoffTest, APrimaryMoveWithReplicationOneInSspRoundsGivesTheExtraCopyThePushesAnsweredAhead) {
  // Replication 1, ssp in rounds: worker 0's pushes of rounds 0 and 1 are
  // answered ahead of round 0 when server 1 joins and gets its extra copy.
  // Server 0 dies before round 0 completes: server 1, promoted, must count
  // both (the worker will not send them again), as a re-created copy of
  // replication 2 does.
  Make(SSP, [](ClusterConfig& config) {
    config.set_replication(1);
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  });
  Install(MapAt(4, 0, std::nullopt));  // one copy, as with replication 1
  const uint64_t early = Send(0, PUSH, 0, 0, {2.0f, 4.0f}, 4);
  const uint64_t parked = Send(0, PUSH, 0, 1, {10.0f, 20.0f}, 4);
  EXPECT_THAT(Answered(), ElementsAre(early, parked)) << "answered ahead of round 0, within the bound";
  answers_.clear();
  Install(MapAt(5, 0, 1));  // server 1 joined: an extra copy, from a snapshot
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(6, 1, std::nullopt), 1).ok());  // server 0 dies
  const uint64_t late = Send(1, PUSH, 1, 0, {6.0f, 8.0f}, 6);
  const uint64_t next = Send(1, PUSH, 1, 1, {0.0f, 0.0f}, 6);
  const uint64_t after = Send(1, PUSH, 0, 2, {0.0f, 0.0f}, 6);
  EXPECT_THAT(Answered(), ElementsAre(late, next, after));
  // Round 0: 1 - (2 + 6) / 2, 1 - (4 + 8) / 2; round 1: minus (10 + 0) / 2, (20 + 0) / 2.
  EXPECT_EQ(Weights(1), (std::vector<float>{-8.0f, -15.0f}));
}

}  // namespace
}  // namespace shardps
