// Pushes that carry no gradient (DataHeader.no_gradient): a frozen
// parameter's part in a round, so its partitions keep pace with the rest.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/optimizer.h"
#include "server/engine_test_util.h"

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NoGradientTest : public ReplicaPairTest {
 protected:
  // Worker `rank`'s push of `round` with no gradient (no payload frame) to
  // server `server`; Worker::SkipRound sends a plain PUSH.
  void SendNone(uint32_t rank, uint64_t round, uint64_t epoch = 3, uint32_t server = 0, Op op = PUSH_PULL) {
    DataHeader h = RequestHeader(op, rank, round, epoch, ++next_id_, n_);
    h.set_no_gradient(true);
    zmq::message_t peer("w" + std::to_string(rank));
    engines_[server]->Handle(peer, h, nullptr);
  }

  // Adds the bf16 weight delta of answer `answer` to `held`, as a worker does.
  void LandDelta(size_t answer, std::vector<float>& held) {
    auto codec = compression::CreateCodec("bf16");
    ASSERT_TRUE(codec.ok());
    const std::string& bytes = answer_payloads_[answer];
    ASSERT_EQ(answers_[answer].codec(), "bf16");
    ASSERT_TRUE((*codec)
                    ->DecodeAdd(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                compression::CodecSeed(5, answers_[answer].completed_rounds()), absl::MakeSpan(held))
                    .ok());
  }

  // Round 0 of both workers with normal gradients (fixed seed), raw.
  void PushRandomRound0() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> g(n_);
    for (uint32_t rank : {0u, 1u}) {
      for (float& x : g) x = normal(rng);
      Send(0, PUSH_PULL, rank, 0, g);
    }
    Deliver();
  }

  static bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  // Adam at 0.01 on both copies.
  static void Adam(ClusterConfig& c) {
    c.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
    c.mutable_optimizer()->set_learning_rate(0.01f);
  }

  // What one Adam process gives weights of 1 after the mean gradients `means`
  // (one optimizer step each, no rounds skipped).
  std::vector<float> AdamReference(const std::vector<std::vector<float>>& means) {
    auto optimizer = Optimizer::Create(config_.optimizer());
    EXPECT_TRUE(optimizer.ok());
    std::vector<float> w(n_, 1.0f), state(2 * n_, 0.0f);
    for (size_t step = 0; step < means.size(); ++step) {
      (*optimizer)->Apply(step, 1.0f, means[step].data(), w.data(), state.data(), n_);
    }
    return w;
  }

  void ExpectAllAnsweredOk() {
    for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  }
};

TEST_F(NoGradientTest, ARoundNoPushCarriesAGradientToCompletesWithoutAStepOnEveryCopy) {
  Make(SYNC, Adam);
  Send(0, PUSH_PULL, 0, 0, {1, 2});
  Send(0, PUSH_PULL, 1, 0, {3, 2});
  Deliver();
  const std::vector<float> after_first = Weights(0);
  SendNone(0, 1);
  SendNone(1, 1);
  Deliver();
  EXPECT_TRUE(SameBits(Weights(0), after_first)) << "a round with no gradient moved the weights";
  EXPECT_TRUE(SameBits(Weights(1), after_first)) << "the backup applied the round with no gradient";
  Send(0, PUSH_PULL, 0, 2, {2, 2});
  Send(0, PUSH_PULL, 1, 2, {4, 0});
  Deliver();
  ExpectAllAnsweredOk();
  ASSERT_EQ(answers_.size(), 6u);
  EXPECT_TRUE(answers_[2].no_gradient() && answers_[3].no_gradient()) << "the answers of round 1 say it";
  EXPECT_FALSE(answers_[5].no_gradient());
  // Adam's second step, as torch steps a parameter frozen for a step: its
  // bias correction counts the two rounds that stepped.
  EXPECT_TRUE(SameBits(Weights(0), AdamReference({{2, 2}, {3, 1}})));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0))) << "the copies differ";
  const std::vector<PartitionUpdates> counts = engines_[0]->UpdateCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].completed, 3u);
  EXPECT_THAT(counts[0].applied_by_worker, ElementsAre(3, 3)) << "every push the workers were answered counts";
}

TEST_F(NoGradientTest, AWorkerWithNoGradientCountsAsAZeroInARoundTheOtherPushedTo) {
  Make(SYNC);  // SGD at 1: the weights move by the mean gradient
  Send(0, PUSH_PULL, 0, 0, {4, 2});
  SendNone(1, 0);
  Deliver();
  ExpectAllAnsweredOk();
  EXPECT_THAT(Weights(0), ElementsAre(-1.0f, 0.0f));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

TEST_F(NoGradientTest, CompressedRoundsForwardedToTheBackupSkipThePushesWithNoGradient) {
  const int n = 4096;
  Make(
      SYNC,
      [](ClusterConfig& c) {
        c.mutable_compression()->set_codec("2bit");
        Adam(c);
      },
      n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  SendNone(1, 0);  // first: the round is forwarded from its first push on
  SendBytes(0, PUSH_PULL, 0, 0, spec, EncodeForTest(spec, g, 5, 0));
  Deliver();
  SendNone(0, 1);
  SendNone(1, 1);
  Deliver();
  ExpectAllAnsweredOk();
  EXPECT_EQ(answers_.size(), 4u);
  EXPECT_FALSE(SameBits(Weights(0), std::vector<float>(n, 1.0f))) << "round 0 was applied";
  EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the backup's copy differs from the primary's";
}

TEST_F(NoGradientTest, ABackupRefusesARoundSummedFromPushesThatCarryNoGradient) {
  // A buggy or hostile primary: the round's update names forwarded pushes
  // none of which carries a gradient, and does not say it carries none. Summed,
  // it would apply whatever the backup's sum buffer still held.
  const int n = 4096;
  Make(
      SYNC, [](ClusterConfig& c) { c.mutable_compression()->set_codec("2bit"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  std::vector<float> g(n, 0.5f);
  SendBytes(0, PUSH_PULL, 0, 0, spec, EncodeForTest(spec, g, 5, 0));
  SendBytes(0, PUSH_PULL, 1, 0, spec, EncodeForTest(spec, g, 5, 0));
  Deliver();
  ASSERT_TRUE(SameBits(Weights(0), Weights(1)));
  SendNone(1, 1);  // first: the round is forwarded from its first push on
  SendNone(0, 1);
  // The forwarded pushes, confirmed: then the round completes.
  while (outbox_.empty() || outbox_.back().header.replica_of() != PUSH) {
    ASSERT_FALSE(outbox_.empty() && acks_.empty()) << "the round did not complete";
    outbox_.empty() ? DeliverOneAck() : DeliverOneUpdate();
  }
  Message& update = outbox_.back();
  ASSERT_TRUE(update.header.replica_of() == PUSH && update.header.no_gradient());
  update.header.set_no_gradient(false);
  update.header.add_summed_workers(1);
  update.header.add_summed_workers(0);
  const std::vector<float> before = Weights(1);
  while (!outbox_.empty()) DeliverOneUpdate();
  ASSERT_FALSE(acks_.empty());
  EXPECT_NE(acks_.back().header.status_code(), 0) << "the backup confirmed the update";
  EXPECT_TRUE(SameBits(Weights(1), before)) << "the backup applied a round no push carried a gradient to";
}

TEST_F(NoGradientTest, ACopyReCreatedAndPromotedStepsAdamAsItsPrimaryWould) {
  Make(SYNC, Adam);
  SendNone(0, 0);
  SendNone(1, 0);
  Deliver();
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  Install(MapAt(5, 0, 1));             // and comes back: a snapshot re-creates it
  Deliver();
  Install(MapAt(6, 1, std::nullopt));  // server 0 dies: its copy is promoted
  answers_.clear();
  DataHeader h = RequestHeader(PUSH_PULL, 0, 1, 6, ++next_id_, n_);
  std::vector<float> g0 = {1, 1}, g1 = {3, 1};
  for (uint32_t rank : {0u, 1u}) {
    h.set_worker_rank(rank);
    h.set_request_id(++next_id_);
    const std::vector<float>& g = rank == 0 ? g0 : g1;
    zmq::message_t peer("w" + std::to_string(rank));
    zmq::message_t payload(g.data(), g.size() * sizeof(float));
    engines_[1]->Handle(peer, h, &payload);
  }
  ExpectAllAnsweredOk();
  EXPECT_EQ(answers_.size(), 2u);
  EXPECT_TRUE(SameBits(Weights(1), AdamReference({{2, 1}}))) << "Adam's first step, whatever the round";
}

TEST_F(NoGradientTest, SumOnlyAnswersOfARoundWithNoGradientCarryNoAggregate) {
  Make(SYNC, [](ClusterConfig& c) { c.set_update_mode(SUM_ONLY); });
  SendNone(0, 0);
  SendNone(1, 0);
  Deliver();
  ExpectAllAnsweredOk();
  ASSERT_EQ(answers_.size(), 2u);
  for (size_t i = 0; i < answers_.size(); ++i) {
    EXPECT_TRUE(answers_[i].no_gradient());
    EXPECT_TRUE(answer_payloads_[i].empty()) << "a stale aggregate would be applied as this round's";
  }
}

TEST_F(NoGradientTest, WeightDeltasLoseNothingAcrossARoundTheWorkersSkipped) {
  // A frozen parameter's workers skip with plain PUSHes (Worker::SkipRound),
  // which are acknowledged with no weights: a delta encoded for the skipped
  // round (what quantisation dropped from the round before) would reach no
  // worker while the mirror took it as sent.
  const int n = 4096;  // compressed: smaller partitions go raw
  Make(
      SYNC, [](ClusterConfig& c) { c.mutable_compression()->set_pull_codec("bf16"); }, n);
  std::vector<float> held(n, 1.0f);  // what a worker holds: INIT, then the deltas it is answered
  PushRandomRound0();
  ASSERT_EQ(answers_.size(), 2u);
  LandDelta(1, held);
  SendNone(0, 1, 3, 0, PUSH);
  SendNone(1, 1, 3, 0, PUSH);
  Deliver();
  for (uint64_t round = 2; round < 5; ++round) {
    Send(0, PUSH_PULL, 0, round, std::vector<float>(n, 0.0f));
    Send(0, PUSH_PULL, 1, round, std::vector<float>(n, 0.0f));
    Deliver();
    LandDelta(answers_.size() - 1, held);
  }
  ExpectAllAnsweredOk();
  const std::vector<float> weights = Weights(0);
  for (int i = 0; i < n; ++i) ASSERT_NEAR(held[i], weights[i], 1e-6) << "element " << i;
  EXPECT_TRUE(SameBits(Weights(1), weights));
}

TEST_F(NoGradientTest, WeightDeltasOfACopyReCreatedAfterASkippedRoundAndPromotedTrackTheWorkers) {
  const int n = 4096;
  Make(
      SYNC, [](ClusterConfig& c) { c.mutable_compression()->set_pull_codec("bf16"); }, n);
  std::vector<float> held(n, 1.0f);
  PushRandomRound0();
  LandDelta(answers_.size() - 1, held);
  SendNone(0, 1, 3, 0, PUSH);
  SendNone(1, 1, 3, 0, PUSH);
  Deliver();
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  Install(MapAt(5, 0, 1));             // and comes back from a snapshot of the skipped round
  Deliver();
  Install(MapAt(6, 1, std::nullopt));  // server 0 dies: its copy is promoted
  for (uint64_t round = 2; round < 5; ++round) {
    Send(1, PUSH_PULL, 0, round, std::vector<float>(n, 0.0f), 6);
    Send(1, PUSH_PULL, 1, round, std::vector<float>(n, 0.0f), 6);
    Deliver();
    LandDelta(answers_.size() - 1, held);
  }
  ExpectAllAnsweredOk();
  const std::vector<float> weights = Weights(1);
  for (int i = 0; i < n; ++i) ASSERT_NEAR(held[i], weights[i], 1e-6) << "element " << i;
}

TEST_F(NoGradientTest, SspInRoundsParksAndForwardsPushesWithNoGradientAcrossAFailover) {
  // Staleness 1: a push with no gradient a round ahead is parked, answered
  // early and forwarded to the backup, which counts it once promoted.
  Make(SSP, [](ClusterConfig& c) {
    c.set_staleness(1);
    c.set_ssp_in_rounds(true);
  });
  Send(0, PUSH, 0, 0, {2, 4});
  SendNone(0, 1, 3, 0, PUSH);
  SendNone(1, 0, 3, 0, PUSH);
  Deliver();
  EXPECT_THAT(Weights(0), ElementsAre(0.0f, -1.0f)) << "the mean over both workers";
  SendNone(0, 2, 3, 0, PUSH);  // w0 ahead again
  Send(0, PUSH, 1, 1, {4, 4});
  Deliver();
  EXPECT_THAT(Weights(0), ElementsAre(-2.0f, -3.0f));
  EXPECT_THAT(Weights(1), ElementsAre(-2.0f, -3.0f));
  Install(MapAt(6, 1, std::nullopt));  // server 0 dies: worker 0's round 2 was forwarded
  Send(1, PUSH, 1, 2, {2, 2}, 6);
  Deliver();
  EXPECT_THAT(Weights(1), ElementsAre(-3.0f, -4.0f));
  SendNone(0, 3, 6, 1, PUSH);
  SendNone(1, 3, 6, 1, PUSH);
  Deliver();
  EXPECT_THAT(Weights(1), ElementsAre(-3.0f, -4.0f)) << "a round with no gradient moved the weights";
  ExpectAllAnsweredOk();
  const std::vector<PartitionUpdates> counts = engines_[1]->UpdateCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].completed, 4u);
}

TEST_F(NoGradientTest, DeterministicRoundsSumOnlyTheRanksWithAGradient) {
  // Rank 1 holds no payload (raw) and decodes none (fp16): the rank-order
  // sum leaves it out, and it counts as a zero in the mean.
  for (bool fp16 : {false, true}) {
    const int n = 4096;
    Make(
        SYNC,
        [&](ClusterConfig& c) {
          c.set_deterministic(true);
          if (fp16) c.mutable_compression()->set_codec("fp16");
        },
        n);
    const std::vector<float> g(n, 0.5f);
    SendNone(1, 0);
    SendBytes(0, PUSH_PULL, 0, 0, fp16 ? "fp16" : "",
              fp16 ? EncodeForTest("fp16", g, 5, 0)
                   : std::string(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float)));
    Deliver();
    ExpectAllAnsweredOk();
    EXPECT_EQ(Weights(0)[0], 0.75f) << (fp16 ? "fp16" : "raw");
    EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
  }
}

TEST_F(NoGradientTest, AsyncRefusesAPushWithNoGradientSayingNoRoundWaitsForIt) {
  Make(ASYNC);
  SendNone(0, 0);
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0].status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answers_[0].error(), HasSubstr("applies pushes on arrival"));
  EXPECT_THAT(Weights(0), ElementsAre(1.0f, 1.0f));
}

TEST_F(NoGradientTest, APushWithNoGradientAndAPayloadIsRefused) {
  Make(SYNC);
  DataHeader h = RequestHeader(PUSH_PULL, 0, 0, 3, ++next_id_, n_);
  h.set_no_gradient(true);
  const std::vector<float> g = {5, 5};
  zmq::message_t peer(std::string("w0"));
  zmq::message_t payload(g.data(), g.size() * sizeof(float));
  engines_[0]->Handle(peer, h, &payload);
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_THAT(answers_[0].error(), HasSubstr("carries a payload"));
  Send(0, PUSH_PULL, 0, 0, {2, 2});  // not counted: round 0 is still owed
  Send(0, PUSH_PULL, 1, 0, {2, 2});
  Deliver();
  EXPECT_THAT(Weights(0), ElementsAre(-1.0f, -1.0f));
}

}  // namespace
}  // namespace shardps
