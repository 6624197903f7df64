#include "server/partition_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

using ::testing::HasSubstr;

struct Sent {
  std::string peer;
  DataHeader header;
  std::vector<float> payload;
};

class EngineTest : public ::testing::Test {
 protected:
  void Make(Consistency consistency, bool deterministic, int workers) {
    ClusterConfig c;
    c.set_consistency(consistency);
    c.set_deterministic(deterministic);
    c.set_num_workers(workers);
    c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    c.mutable_optimizer()->set_learning_rate(1.0f);
    auto engine = PartitionEngine::Create(c, [this](const zmq::message_t& peer, DataHeader& h, zmq::message_t* p) {
      Sent s{peer.to_string(), h, {}};
      if (p) s.payload.assign(p->data<float>(), p->data<float>() + p->size() / 4);
      sent_.push_back(s);
    });
    ASSERT_TRUE(engine.ok());
    engine_ = *std::move(engine);
    ShardMap map;
    map.set_epoch(3);
    PartitionInfo* p = map.add_partitions();
    p->set_id(5);
    p->set_num_elements(2);
    p->set_server(0);
    engine_->InstallShardMap(map, 0);
  }

  void Send(Op op, uint32_t rank, uint64_t round, std::vector<float> values, uint64_t id = 0) {
    DataHeader h;
    h.set_op(op);
    h.set_worker_rank(rank);
    h.set_round(round);
    h.set_epoch(3);
    h.set_partition_id(5);
    h.set_request_id(id ? id : ++next_id_);
    h.set_dtype(FLOAT32);
    h.set_num_elements(values.size());
    zmq::message_t peer(std::string("w") + std::to_string(rank));
    zmq::message_t payload(values.data(), values.size() * 4);
    engine_->Handle(peer, h, op == PULL ? nullptr : &payload);
  }

  std::vector<float> Weights() { return {engine_->weights(5)[0], engine_->weights(5)[1]}; }

  std::unique_ptr<PartitionEngine> engine_;
  std::vector<Sent> sent_;
  uint64_t next_id_ = 0;
};

TEST_F(EngineTest, SyncAppliesOnceAllWorkersPushedAndAnswersWaitingPulls) {
  Make(SYNC, false, 2);
  Send(PUSH_PULL, 0, 0, {2, 4});
  EXPECT_TRUE(sent_.empty()) << "push-pull waits for the round";
  Send(PUSH_PULL, 1, 0, {4, 0});
  ASSERT_EQ(sent_.size(), 2u);
  // mean gradient {3, 2}, lr 1 -> weights {-3, -2}
  EXPECT_EQ(sent_[0].payload, (std::vector<float>{-3, -2}));
  EXPECT_EQ(sent_[0].peer, "w0");
  EXPECT_EQ(sent_[1].header.completed_rounds(), 1u);
}

TEST_F(EngineTest, DeterministicSumsInRankOrderWhateverTheArrivalOrder) {
  Make(SYNC, true, 3);
  const std::vector<float> a = {1e8f, 1.0f}, b = {-1e8f, 1e-8f}, c = {1.0f, 3.0f};
  Send(PUSH, 2, 0, c);
  Send(PUSH, 0, 0, a);
  Send(PUSH, 1, 0, b);
  std::vector<float> expected = {0, 0};
  for (int i = 0; i < 2; ++i) {
    float sum = a[i];
    sum += b[i];
    sum += c[i];
    expected[i] = 0.0f - 1.0f * (sum * (1.0f / 3.0f));
  }
  EXPECT_EQ(Weights(), expected);
}

TEST_F(EngineTest, RetriedPushIsNotAppliedTwice) {
  Make(SYNC, false, 1);
  Send(PUSH, 0, 0, {1, 1}, 10);
  Send(PUSH, 0, 0, {1, 1}, 10);
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1}));
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].header.status_code(), 0);
}

TEST_F(EngineTest, PushAheadOfTheRoundIsParkedThenApplied) {
  Make(SYNC, false, 2);
  Send(PUSH, 0, 0, {1, 0});
  Send(PUSH, 0, 1, {1, 0});  // worker 0 runs ahead
  Send(PUSH, 1, 0, {1, 0});  // round 0 completes, round 1 has worker 0's push
  Send(PUSH, 1, 1, {1, 0});  // round 1 completes
  EXPECT_EQ(Weights(), (std::vector<float>{-2, 0}));
}

TEST_F(EngineTest, AsyncAppliesEachPushOnArrivalWithItsShareOfTheLearningRate) {
  Make(ASYNC, false, 2);
  Send(PUSH, 0, 0, {1, 2});  // lr 1 over 2 workers: each push moves by 0.5 * g
  EXPECT_EQ(Weights(), (std::vector<float>{-0.5f, -1}));
  Send(PUSH_PULL, 1, 0, {1, 0});
  EXPECT_EQ(sent_.back().payload, (std::vector<float>{-1, -1}));
}

TEST_F(EngineTest, FirstInitWins) {
  Make(SYNC, false, 1);
  Send(INIT, 0, 0, {7, 8});
  Send(INIT, 0, 0, {9, 9});
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
}

TEST_F(EngineTest, BadRequestsGetErrorsAndChangeNothing) {
  Make(SYNC, false, 1);
  Send(INIT, 0, 0, {7, 8});
  sent_.clear();
  Send(PUSH, 0, 0, {1, 2, 3});  // wrong length
  Send(PUSH, 5, 0, {1, 2});     // rank out of range
  Send(PUSH, 0, 3, {1, 2});     // skips rounds
  DataHeader h;
  h.set_op(PUSH);
  h.set_epoch(2);  // stale epoch
  h.set_partition_id(5);
  zmq::message_t peer(std::string("x"));
  zmq::message_t payload(8);
  engine_->Handle(peer, h, &payload);
  h.set_epoch(3);
  h.set_partition_id(99);  // unknown partition
  engine_->Handle(peer, h, &payload);
  h.set_partition_id(5);
  h.set_num_elements(2);
  h.set_dtype(FLOAT32);
  engine_->Handle(peer, h, nullptr);  // missing payload
  ASSERT_EQ(sent_.size(), 6u);
  EXPECT_THAT(sent_[0].header.error(), HasSubstr("has 2 elements"));
  EXPECT_THAT(sent_[1].header.error(), HasSubstr("rank 5"));
  EXPECT_THAT(sent_[2].header.error(), HasSubstr("owes round 0"));
  EXPECT_THAT(sent_[3].header.error(), HasSubstr("wrong epoch"));
  EXPECT_EQ(sent_[3].header.server_epoch(), 3u);
  EXPECT_EQ(sent_[4].header.status_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(sent_[5].header.error(), HasSubstr("no payload"));
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
  EXPECT_EQ(engine_->stats().errors, 6u);
}

TEST_F(EngineTest, ShutdownAnswersWaitingPulls) {
  Make(SYNC, false, 2);
  Send(PUSH_PULL, 0, 0, {1, 1});
  engine_->FailWaiting(absl::UnavailableError("stopping"));
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace shardps
