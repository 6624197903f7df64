// A primary handing its role to a backup (ShardMap.handoffs): two engines,
// server 0 the primary and server 1 the backup of partition 5, with their
// replication delivered by the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <string>

#include "server/partition_engine.h"

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

struct Message {
  uint32_t from = 0, to = 0;
  DataHeader header;
  std::string payload;
};

class HandoffTest : public ::testing::Test {
 protected:
  // SGD with learning rate 1 (sync: a weight moves by the mean gradient).
  void Make(Consistency consistency) {
    ClusterConfig c;
    c.set_consistency(consistency);
    c.set_num_workers(2);
    c.set_num_servers(2);
    c.set_replication(2);
    c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    c.mutable_optimizer()->set_learning_rate(1.0f);
    for (uint32_t s : {0u, 1u}) {
      auto engine = PartitionEngine::Create(
          c,
          [this, s](const zmq::message_t& peer, DataHeader& h, zmq::message_t*) {
            const std::string to = peer.to_string();
            if (to.rfind("server", 0) == 0) {  // a confirmation, back to the primary
              acks_.push_back(Message{s, static_cast<uint32_t>(std::stoul(to.substr(6))), h, ""});
            } else {
              answers_.push_back(h);
            }
          },
          [this, s](uint32_t server, DataHeader& h, zmq::message_t& payload) {
            outbox_.push_back(Message{s, server, h, payload.to_string()});
          });
      ASSERT_TRUE(engine.ok()) << engine.status();
      engines_[s] = *std::move(engine);
    }
    Install(MapAt(3, 0, 1));
    Send(0, INIT, 0, 0, {1, 1});
    Deliver();
    answers_.clear();
  }

  // Epoch `epoch`: partition 5 (2 elements) with primary `primary` and
  // backup `backup`, handing off from the primary to the backup if `handoff`.
  static ShardMap MapAt(uint64_t epoch, uint32_t primary, uint32_t backup, bool handoff = false) {
    ShardMap map;
    map.set_epoch(epoch);
    map.add_tensors()->set_name("t");
    for (uint32_t s : {0u, 1u}) {
      ServerInfo* info = map.add_servers();
      info->set_index(s);
      info->set_data_address("tcp://s:" + std::to_string(s + 1));
    }
    PartitionInfo* p = map.add_partitions();
    p->set_id(5);
    p->set_num_elements(2);
    p->set_server(primary);
    p->add_backups(backup);
    if (handoff) {
      Handoff* h = map.add_handoffs();
      h->set_partition(5);
      h->set_from(primary);
      h->set_to(backup);
      h->set_epoch(epoch);
    }
    return map;
  }

  void Install(const ShardMap& map) {
    for (uint32_t s : {0u, 1u}) ASSERT_TRUE(engines_[s]->InstallShardMap(map, s).ok());
  }

  // A request of worker `rank` to server `server`; returns its id.
  uint64_t Send(uint32_t server, Op op, uint32_t rank, uint64_t round, std::vector<float> values,
                uint64_t epoch = 3, uint64_t id = 0) {
    DataHeader h;
    h.set_op(op);
    h.set_worker_rank(rank);
    h.set_round(round);
    h.set_epoch(epoch);
    h.set_partition_id(5);
    h.set_request_id(id != 0 ? id : ++next_id_);
    h.set_dtype(FLOAT32);
    h.set_num_elements(2);
    zmq::message_t peer("w" + std::to_string(rank));
    zmq::message_t payload(values.data(), values.size() * sizeof(float));
    engines_[server]->Handle(peer, h, op == PULL ? nullptr : &payload);
    return h.request_id();
  }

  // Delivers every replica update and confirmation until none is left.
  void Deliver() {
    while (!outbox_.empty() || !acks_.empty()) {
      if (!outbox_.empty()) {
        Message m = std::move(outbox_.front());
        outbox_.pop_front();
        zmq::message_t peer("server" + std::to_string(m.from));
        zmq::message_t payload(m.payload.data(), m.payload.size());
        engines_[m.to]->Handle(peer, m.header, &payload);
      } else {
        Message m = std::move(acks_.front());
        acks_.pop_front();
        engines_[m.to]->HandleReplicaAck(m.from, m.header);
      }
    }
  }

  std::vector<uint64_t> Answered() {
    std::vector<uint64_t> ids;
    for (const DataHeader& h : answers_) ids.push_back(h.request_id());
    return ids;
  }

  std::vector<float> Weights(uint32_t server) {
    const float* w = engines_[server]->weights(5);
    return {w[0], w[1]};
  }

  std::unique_ptr<PartitionEngine> engines_[2];
  std::deque<Message> outbox_, acks_;
  std::vector<DataHeader> answers_;
  uint64_t next_id_ = 0;
};

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

}  // namespace
}  // namespace shardps
