// Replication of sync rounds whose pushes are compressed: the primary
// forwards each push to the backup as it counts it and the round's update
// names them, instead of sending the round's fp32 sum (ReplicaPairTest:
// server 0 the primary, server 1 the backup of partition 5).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "server/engine_test_util.h"

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class ReplicationTest : public ReplicaPairTest {
 protected:
  // The replica updates delivered since the last call: how many summed
  // forwarded pushes, and the largest payload any carried.
  struct Traffic {
    int summed_rounds = 0;
    int forwarded_pushes = 0;
    size_t largest = 0;
  };
  Traffic TakeTraffic() {
    Traffic t;
    for (const Message& m : replicated_) {
      if (m.header.replica_of() == PUSH && m.header.summed_workers_size() > 0) ++t.summed_rounds;
      if (m.header.replica_of() == PUSH_PULL) ++t.forwarded_pushes;
      t.largest = std::max(t.largest, m.payload.size());
    }
    replicated_.clear();
    return t;
  }

  static bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
};

TEST_F(ReplicationTest, CompressedRoundsReachTheBackupAsTheirPushesAndTheCopiesStayBitwiseEqual) {
  const int n = 4096;
  struct Case {
    std::string codec;
    bool deterministic;
  };
  // Decoded then summed (2bit, topk), summed in the compressed domain
  // (randomk), and summed in rank order (deterministic).
  for (const Case& c : std::vector<Case>{{"2bit", false},
                                         {"2bit", true},
                                         {"topk:ratio=0.05", false},
                                         {"randomk:ratio=0.25", false}}) {
    SCOPED_TRACE(c.codec + (c.deterministic ? " deterministic" : ""));
    Make(
        SYNC,
        [&](ClusterConfig& config) {
          config.mutable_compression()->set_codec(c.codec);
          config.set_deterministic(c.deterministic);
          config.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
          config.mutable_optimizer()->set_learning_rate(0.01f);
        },
        n);
    const std::string spec = compression::ParseCodecSpec(c.codec)->ToString();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int rounds = 4;
    for (int round = 0; round < rounds; ++round) {
      for (uint32_t i = 0; i < 2; ++i) {
        const uint32_t rank = (round + i) % 2;  // arrival order changes every round
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        SendBytes(0, PUSH, rank, round, spec, EncodeForTest(spec, g, 5, round));
      }
      Deliver();
    }
    for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
    EXPECT_EQ(answers_.size(), 2u * rounds);
    const Traffic t = TakeTraffic();
    EXPECT_EQ(t.summed_rounds, rounds);
    EXPECT_EQ(t.forwarded_pushes, 2 * rounds);
    EXPECT_LT(t.largest, n * sizeof(float) / 2) << "no replica update may carry the fp32 sum";
    EXPECT_FALSE(SameBits(Weights(0), std::vector<float>(n, 1.0f))) << "the rounds were applied";
    EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the backup's copy differs from the primary's";
    answers_.clear();
  }
}

TEST_F(ReplicationTest, RoundsWhosePushesTogetherAreNotSmallerThanTheSumGoAsTheSum) {
  const int n = 4096;
  for (const std::string codec : {"none", "fp16"}) {  // two fp16 pushes weigh what the fp32 sum does
    SCOPED_TRACE(codec);
    Make(SYNC, [&](ClusterConfig& config) { config.mutable_compression()->set_codec(codec); }, n);
    const std::string spec = codec == "none" ? "" : codec;
    for (uint32_t rank : {0u, 1u}) {
      SendBytes(0, PUSH, rank, 0, spec,
                spec.empty() ? std::string(n * sizeof(float), '\0') : EncodeForTest(spec, std::vector<float>(n, 1), 5, 0));
    }
    Deliver();
    const Traffic t = TakeTraffic();
    EXPECT_EQ(t.summed_rounds, 0);
    EXPECT_EQ(t.forwarded_pushes, 0);
    EXPECT_EQ(t.largest, n * sizeof(float));
    EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
    answers_.clear();
  }
}

TEST_F(ReplicationTest, ABackupPromotedMidRoundCountsTheForwardedPushOnceAndItsRetryAsADuplicate) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit:threshold=0.25"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  const std::string g = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);  // decodes to +0.25
  const uint64_t first = SendBytes(0, PUSH, 0, 0, spec, g);
  Deliver();  // the push reaches the backup; its round is still open
  EXPECT_THAT(answers_, IsEmpty());
  // Server 0 dies: server 1 is the primary, with no backup.
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(4, 1, std::nullopt), 1).ok());
  const uint64_t second = SendBytes(1, PUSH, 1, 0, spec, g, 4);
  EXPECT_THAT(Answered(), ElementsAre(second)) << "the forwarded push counts: the round completes";
  EXPECT_EQ(Weights(1), std::vector<float>(n, 0.75f));
  SendBytes(1, PUSH, 0, 0, spec, g, 4, first);  // worker 0 re-sends to the new primary
  EXPECT_THAT(Answered(), ElementsAre(second, first));
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_EQ(Weights(1), std::vector<float>(n, 0.75f)) << "the retry was applied twice";
}

TEST_F(ReplicationTest, ACopyReCreatedFromASnapshotEncodesTheAggregatesAsItsPrimaryDoes) {
  // Sum-only with onebit pulls: the servers carry what each encoding of the
  // aggregate dropped over to the next (error feedback). A copy re-created
  // from a snapshot must get that residual too, or its answers differ once
  // it is promoted.
  const int n = 4096;
  Make(
      SYNC,
      [](ClusterConfig& config) {
        config.set_update_mode(SUM_ONLY);
        config.mutable_compression()->set_pull_codec("onebit");
      },
      n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // A round's pushes; returns worker 0's request id.
  auto round = [&](uint64_t r, uint64_t epoch, Op op) {
    uint64_t first = 0;
    for (uint32_t rank : {0u, 1u}) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      const uint64_t id = Send(0, op, rank, r, g, epoch);
      if (rank == 0) first = id;
    }
    Deliver();
    return first;
  };
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  for (uint64_t r = 0; r < 3; ++r) round(r, 4, PUSH);
  Install(MapAt(5, 0, 1));  // and comes back: a snapshot re-creates it
  Deliver();
  round(3, 5, PUSH);
  answers_.clear();
  answer_payloads_.clear();
  const uint64_t id = round(4, 5, PUSH_PULL);  // answered by server 0 with round 4's aggregate
  Install(MapAt(6, 1, 0));  // server 1 takes over
  Send(1, PUSH_PULL, 0, 4, std::vector<float>(n, 0.0f), 6, id);  // worker 0 re-sends its push there
  Deliver();  // server 1 re-creates server 0's copy: answers wait for its confirmation
  ASSERT_EQ(answers_.size(), 3u);
  for (const DataHeader& h : answers_) ASSERT_EQ(h.status_code(), 0) << h.error();
  EXPECT_EQ(answers_[0].codec(), "onebit");
  EXPECT_EQ(answers_[2].request_id(), id);
  EXPECT_EQ(answer_payloads_[2].size(), answer_payloads_[0].size());
  EXPECT_TRUE(answer_payloads_[2] == answer_payloads_[0]) << "the re-created copy lost the error-feedback residual";
}

TEST_F(ReplicationTest, ACopyPromotedRightAfterItsSnapshotAnswersTheLastRoundAsItsPrimaryDid) {
  // The snapshot's encoder state is past the last round's answer (error
  // feedback, or the weight-delta mirror): encoding that round again would
  // answer a retry with something else. The snapshot carries the answer.
  const int n = 4096;
  for (const bool sum_only : {true, false}) {
    SCOPED_TRACE(sum_only ? "sum-only, onebit aggregates" : "onebit weight deltas");
    Make(
        SYNC,
        [&](ClusterConfig& config) {
          if (sum_only) config.set_update_mode(SUM_ONLY);
          config.mutable_compression()->set_pull_codec("onebit");
        },
        n);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
    uint64_t retried = 0;
    for (uint64_t r = 0; r < 3; ++r) {
      for (uint32_t rank : {0u, 1u}) {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        const uint64_t id = Send(0, PUSH_PULL, rank, r, g, 4);
        if (rank == 0) retried = id;
      }
    }
    ASSERT_EQ(answers_.size(), 6u);
    const std::string last = answer_payloads_[4];  // worker 0's answer of round 2
    Install(MapAt(5, 0, 1));  // the copy comes back: a snapshot at round 3
    Deliver();
    Install(MapAt(6, 1, std::nullopt));  // server 0 dies at once; server 1 takes over
    Send(1, PUSH_PULL, 0, 2, std::vector<float>(n, 0.0f), 6, retried);  // worker 0 re-sends round 2
    ASSERT_EQ(answers_.size(), 7u);
    ASSERT_EQ(answers_[6].status_code(), 0) << answers_[6].error();
    EXPECT_EQ(answers_[6].request_id(), retried);
    EXPECT_TRUE(answer_payloads_[6] == last) << "the promoted copy encoded the last round again";
  }
}

TEST_F(ReplicationTest, ARoundNamingAPushTheBackupNeverReceivedIsRefusedAndChangesNothing) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit"); }, n);
  DataHeader h;
  h.set_op(REPLICATE);
  h.set_replica_of(PUSH);
  h.set_partition_id(5);
  h.set_epoch(3);
  h.set_request_id(2);  // INIT was update 1
  h.set_round(0);
  h.set_contributors(2);
  h.add_summed_workers(0);
  h.add_summed_workers(1);
  h.set_num_elements(n);
  zmq::message_t peer("server0");
  zmq::message_t empty;
  engines_[1]->Handle(peer, h, &empty);
  ASSERT_FALSE(acks_.empty());
  EXPECT_EQ(acks_.back().header.status_code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(acks_.back().header.error(), HasSubstr("not forwarded to this copy"));
  EXPECT_EQ(Weights(1), std::vector<float>(n, 1.0f));
}

}  // namespace
}  // namespace shardps
