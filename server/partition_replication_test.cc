// Replication of sync rounds whose pushes are compressed: the primary
// forwards each push to the backup as it counts it and the round's update
// names them, instead of sending the round's fp32 sum (ReplicaPairTest:
// server 0 the primary, server 1 the backup of partition 5).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <regex>

#include "common/protocol.h"
#include "common/warning_lines_test_util.h"
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

  // Sum-only mode with onebit pulls: the servers keep error feedback of the
  // aggregates they encode.
  static void SumOnlyOnebitAggregates(ClusterConfig& config) {
    config.set_update_mode(SUM_ONLY);
    config.mutable_compression()->set_pull_codec("onebit");
  }

  // Worker 0 rejoins as a new process (registration 7) in `map`; `epoch`:
  // the map that first listed the rejoin (0: not said).
  // Worker 0 rejoins as a new process (registration kNewProcess) in `map`.
  static constexpr uint64_t kNewProcess = 7;
  // Server 1 dies (epoch 11 on the primary) and a fresh engine joins in
  // its place at another address; the primary installs that map (epoch 12,
  // into `*joined`) and sends the new copy its snapshot, which server 1 has
  // not installed the map of yet.
  void ReplaceServerOne(ShardMap* joined) {
    ASSERT_TRUE(engines_[0]->InstallShardMap(MapAt(11, 0, std::nullopt), 0).ok());  // server 1 died
    Restart(1);
    engines_[1]->JoinRunningJob();
    *joined = MapAt(12, 0, 1);
    joined->mutable_servers(1)->set_data_address("tcp://s:9");
    ASSERT_TRUE(engines_[0]->InstallShardMap(*joined, 0).ok());
  }

  // ReplaceServerOne, then server 1 installs that map: its copy awaits the
  // snapshot the primary sent it.
  void ReplaceServerOneServingTheMap() {
    ShardMap joined;
    ASSERT_NO_FATAL_FAILURE(ReplaceServerOne(&joined));
    ASSERT_TRUE(engines_[1]->InstallShardMap(joined, 1).ok());
  }

  static void RejoinWorkerZero(ShardMap& map, uint64_t epoch) {
    WorkerRejoin* rejoin = map.add_rejoined_workers();
    rejoin->set_rank(0);
    rejoin->set_incarnation(kNewProcess);
    if (epoch != 0) rejoin->set_epoch(epoch);
  }

  // Async: the rejoined worker 0's first push (request id 1, routed at
  // `epoch`) is applied on the primary, and on the backup too.
  void ExpectTheNewProcessesPushOnBothCopies(uint64_t epoch) {
    const std::vector<float> before = Weights(0);
    incarnations_[0] = kNewProcess;
    Send(0, PUSH, 0, 0, {0.25f, 0.25f}, epoch, 1);
    Deliver();
    EXPECT_NE(Weights(0), before) << "the new process's push was applied";
    EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the backup skipped the rejoined worker's push";
  }

  // Server 1 comes back as a new process at a new address (epoch 4): a new
  // copy, which server 0 sends a snapshot (queued, not delivered). Returns
  // that map.
  ShardMap ServerOneComesBackAtANewAddress() {
    Restart(1);
    ShardMap map = MapAt(4, 0, 1);
    map.mutable_servers(1)->set_data_address("tcp://s:9");
    Install(map);
    return map;
  }

  static bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  // Hands server `to` replica update `h` of partition 5 as if server `from`
  // sent it at `epoch`, with `payload`; returns the answer.
  DataHeader Replica(uint32_t from, uint32_t to, uint64_t epoch, DataHeader h, const std::string& payload) {
    h.set_op(REPLICATE);
    h.set_partition_id(5);
    h.set_epoch(epoch);
    h.set_num_elements(n_);
    h.set_dtype(FLOAT32);
    h.set_request_id(++replica_id_);
    h.set_replica_from(from);
    zmq::message_t peer("server" + std::to_string(from));
    zmq::message_t m(payload.data(), payload.size());
    std::deque<Message> queued = std::move(acks_);  // confirmations still on their way stay so
    acks_.clear();
    engines_[to]->Handle(peer, h, &m);
    EXPECT_EQ(acks_.size(), 1u);
    DataHeader answer = acks_.empty() ? DataHeader() : acks_.back().header;
    acks_ = std::move(queued);
    return answer;
  }
  // As the primary (server 0) to the backup (server 1).
  DataHeader ToBackup(DataHeader h, const std::string& payload) { return Replica(0, 1, 3, h, payload); }
  // Both workers' pushes of sync round `round`, routed at `epoch`.
  void Round(uint64_t round, uint64_t epoch) {
    Send(0, PUSH, 0, round, {2.0f, 4.0f}, epoch);
    Send(0, PUSH, 1, round, {6.0f, 8.0f}, epoch);
  }
  // Round, delivered with every replica update and confirmation it makes.
  void DeliveredRound(uint64_t round, uint64_t epoch) {
    Round(round, epoch);
    Deliver();
  }
  // Round 0's update never reaches server 1 (confirmed as if it had), and
  // round 1's does: server 1 refuses it (an update is missing), its refusal
  // waiting in acks_. `epoch`: the epoch both servers serve.
  void MissRoundZeroAndRefuseRoundOne(uint64_t epoch) {
    Round(0, epoch);
    ASSERT_EQ(outbox_.size(), 1u);
    DataHeader ack;
    ack.set_op(RESPONSE);
    ack.set_partition_id(5);
    ack.set_request_id(outbox_.front().header.request_id());
    ack.set_server_epoch(epoch);
    outbox_.clear();
    acks_.push_back(Message{1, 0, ack, ""});
    Deliver();
    Round(1, epoch);
    ASSERT_EQ(outbox_.size(), 1u);
    DeliverOneUpdate();
    ASSERT_EQ(acks_.size(), 1u);
    EXPECT_EQ(acks_.front().header.status_code(), static_cast<int>(absl::StatusCode::kDataLoss));
    EXPECT_TRUE(engines_[1]->SyncedCopies().empty()) << "a copy that lacks an update is not synced";
  }
  // Worker `rank`'s push of `round`, forwarded (its payload as the worker sent it).
  static DataHeader Forwarded(uint32_t rank, uint64_t round, const std::string& codec) {
    DataHeader h;
    h.set_replica_of(PUSH_PULL);
    h.set_worker_rank(rank);
    h.set_round(round);
    h.set_replica_request_id(1000 + 10 * round + rank);
    h.set_codec(codec);
    return h;
  }
  // Round `round`'s update, summed from the forwarded pushes of `workers`.
  static DataHeader Summed(uint64_t round, const std::vector<uint32_t>& workers) {
    DataHeader h;
    h.set_replica_of(PUSH);
    h.set_round(round);
    h.set_contributors(workers.size());
    h.set_lr_scale(1.0f);
    for (uint32_t w : workers) h.add_summed_workers(w);
    return h;
  }

  // Partition 5 with primary `primary` and `backups`, among servers 0, 1 and
  // 2 (server 2 played by the test).
  ShardMap MapOfThree(uint64_t epoch, uint32_t primary, const std::vector<uint32_t>& backups) const {
    ShardMap map = MapAt(epoch, primary, std::nullopt);
    ServerInfo* third = map.add_servers();
    third->set_index(2);
    third->set_data_address("tcp://s:3");
    for (uint32_t b : backups) map.mutable_partitions(0)->add_backups(b);
    return map;
  }
  // Three copies (ThreeCopies): server 2 the primary of partition 5 at
  // epoch 4 and servers 0 and 1 its backups, initialised to ones by server
  // 2. Returns two workers' topk pushes of round 0 (random, from `seed`).
  std::vector<std::string> StartThreeCopies(int n, uint32_t seed) {
    Make(SYNC, ThreeCopies, n, /*init=*/false);
    Install(MapOfThree(4, 2, {0, 1}));
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::string> g(2);
    for (std::string& e : g) {
      std::vector<float> v(n);
      for (float& x : v) x = normal(rng);
      e = EncodeForTest(kThreeCopiesCodec, v, 5, 0);
    }
    const std::vector<float> ones(n, 1.0f);
    DataHeader init;
    init.set_replica_of(INIT);
    for (uint32_t to : {0u, 1u}) {
      const DataHeader answer =
          Replica(2, to, 4, init, std::string(reinterpret_cast<const char*>(ones.data()), n * sizeof(float)));
      EXPECT_EQ(answer.status_code(), 0) << answer.error();
    }
    return g;
  }
  static constexpr char kThreeCopiesCodec[] = "topk:ratio=0.05";
  // After StartThreeCopies: server 2 counts both workers' pushes `g` of round
  // 0, forwarding worker 0's to servers 0 and 1, worker 1's to server 1 only.
  void ServerTwoCountsRoundZero(const std::vector<std::string>& g) {
    const std::string spec = compression::ParseCodecSpec(kThreeCopiesCodec)->ToString();
    EXPECT_EQ(Replica(2, 0, 4, Forwarded(0, 0, spec), g[0]).status_code(), 0);
    for (uint32_t w : {0u, 1u}) EXPECT_EQ(Replica(2, 1, 4, Forwarded(w, 0, spec), g[w]).status_code(), 0);
  }
  // Server 2 and worker 1 die: the map of `epoch` makes server 0 the primary
  // and server 1 its backup, which takes server 0's snapshot (and nothing
  // else is delivered yet).
  void ServerZeroTakesOverAt(uint64_t epoch) {
    ShardMap map = MapOfThree(epoch, 0, {1});
    map.add_excluded_workers(1);
    Install(map);
    ASSERT_FALSE(outbox_.empty());
    ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
    Message snapshot = std::move(outbox_.front());
    outbox_.pop_front();
    zmq::message_t peer(std::string("server0"));
    zmq::message_t payload(snapshot.payload.data(), snapshot.payload.size());
    engines_[1]->Handle(peer, snapshot.header, &payload);
  }
  static void ThreeCopies(ClusterConfig& config) {
    config.set_num_servers(3);
    config.set_replication(3);
    config.mutable_compression()->set_codec(kThreeCopiesCodec);
    config.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
    config.mutable_optimizer()->set_learning_rate(0.01f);
  }

  uint64_t replica_id_ = 1000;
};

TEST_F(ReplicationTest, ABackupReportsWhatItsCopyAppliedAsItsPrimaryDoes) {
  // shardps local counts lost and duplicate updates from these: a partition
  // whose hand-off switched as the job stopped (the old primary installed
  // the switch, the new one was stopped first) has no primary to report it,
  // and its synced backups hold the same counts.
  Make(ASYNC);
  Send(0, PUSH, 0, 0, {1, 1});
  Send(0, PUSH, 1, 0, {1, 1});
  Send(0, PUSH, 1, 0, {1, 1});
  Deliver();
  const std::vector<PartitionUpdates> primary = engines_[0]->UpdateCounts();
  const std::vector<PartitionUpdates> backup = engines_[1]->BackupUpdateCounts();
  ASSERT_EQ(primary.size(), 1u);
  ASSERT_EQ(backup.size(), 1u);
  EXPECT_THAT(engines_[0]->BackupUpdateCounts(), IsEmpty()) << "the primary holds no backup copy";
  EXPECT_THAT(engines_[1]->UpdateCounts(), IsEmpty());
  EXPECT_EQ(backup[0].partition, 5u);
  EXPECT_EQ(backup[0].completed, primary[0].completed);
  EXPECT_THAT(primary[0].applied_by_worker, ElementsAre(1, 2));
  EXPECT_EQ(backup[0].applied_by_worker, primary[0].applied_by_worker);
  ASSERT_EQ(primary[0].applied_digest_by_worker.size(), 2u);
  EXPECT_NE(primary[0].applied_digest_by_worker[1], 0u);
  EXPECT_NE(primary[0].applied_digest_by_worker[0], primary[0].applied_digest_by_worker[1]);
  EXPECT_EQ(backup[0].applied_digest_by_worker, primary[0].applied_digest_by_worker);
}

TEST_F(ReplicationTest, EveryCopyCountsPerWorkerTheRoundsThatSummedItsGradient) {
  // Sync: a round that went on without a gradient its worker was told was
  // applied must show in the accounting, on the primary and on a backup
  // promoted in its place.
  Make(SYNC);
  Send(0, PUSH, 0, 0, {1, 1});
  Send(0, PUSH, 1, 0, {1, 1});
  Deliver();
  ShardMap without_one = MapAt(4, 0, 1);
  without_one.add_excluded_workers(1);
  Install(without_one);
  Send(0, PUSH, 0, 1, {1, 1}, 4);  // round 1: worker 0's alone
  Deliver();
  const std::vector<PartitionUpdates> primary = engines_[0]->UpdateCounts();
  const std::vector<PartitionUpdates> backup = engines_[1]->BackupUpdateCounts();
  ASSERT_EQ(primary.size(), 1u);
  ASSERT_EQ(backup.size(), 1u);
  EXPECT_EQ(primary[0].completed, 2u);
  EXPECT_THAT(primary[0].applied_by_worker, ElementsAre(2, 1));
  EXPECT_EQ(backup[0].applied_by_worker, primary[0].applied_by_worker);
  EXPECT_THAT(primary[0].applied_digest_by_worker, IsEmpty()) << "async only";
}

TEST_F(ReplicationTest, ARoundOfTheMostWorkersAConfigAllowsReachesTheBackupInOneHeader) {
  // The backup refuses a header over kMaxHeaderBytes (ParseDataHeaderInto):
  // the round's update must name whom it summed within that.
  constexpr uint32_t kWorkers = 65536;
  Make(SYNC, [](ClusterConfig& c) { c.set_num_workers(kWorkers); });
  for (uint32_t w = 0; w < kWorkers; ++w) Send(0, PUSH, w, 0, {1, 1});
  Deliver();
  ASSERT_EQ(replicated_.size(), 1u);
  EXPECT_LE(replicated_[0].header.ByteSizeLong(), kMaxHeaderBytes);
  EXPECT_EQ(engines_[1]->BackupUpdateCounts().at(0).applied_by_worker, std::vector<uint64_t>(kWorkers, 1));
}

TEST_F(ReplicationTest, AnAsyncBatchOfManyWorkersReachesTheBackupInHeadersItTakes) {
  // 1024 workers' pushes drained together, far into a job (request ids
  // near 2^20, three bytes each): each update names its pushes' workers and
  // request ids, and the backup refuses a header over kMaxHeaderBytes
  // (ParseDataHeaderInto).
  constexpr uint32_t kWorkers = 1024;
  Make(ASYNC, [](ClusterConfig& c) { c.set_num_workers(kWorkers); });
  engines_[0]->BeginBatch();
  for (uint32_t w = 0; w < kWorkers; ++w) Send(0, PUSH, w, 0, {1, 1}, 3, (uint64_t{1} << 20) - w);
  engines_[0]->EndBatch();
  Deliver();
  ASSERT_FALSE(replicated_.empty());
  for (const Message& m : replicated_) EXPECT_LE(m.header.ByteSizeLong(), kMaxHeaderBytes);
  EXPECT_EQ(engines_[1]->BackupUpdateCounts().at(0).applied_by_worker, std::vector<uint64_t>(kWorkers, 1));
}

TEST_F(ReplicationTest, ABackupCountsEveryWorkerButThoseARoundLeftOut) {
  // 100 workers, two of them (the last rank one) removed before round 1:
  // the update names the two rather than the 98.
  constexpr uint32_t kWorkers = 100;
  Make(SYNC, [](ClusterConfig& c) { c.set_num_workers(kWorkers); });
  for (uint32_t w = 0; w < kWorkers; ++w) Send(0, PUSH, w, 0, {1, 1});
  Deliver();
  ShardMap without_two = MapAt(4, 0, 1);
  without_two.add_excluded_workers(3);
  without_two.add_excluded_workers(kWorkers - 1);
  Install(without_two);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    if (w != 3 && w != kWorkers - 1) Send(0, PUSH, w, 1, {1, 1}, 4);
  }
  Deliver();
  std::vector<uint64_t> expected(kWorkers, 2);
  expected[3] = expected[kWorkers - 1] = 1;
  EXPECT_EQ(engines_[0]->UpdateCounts().at(0).applied_by_worker, expected);
  EXPECT_EQ(engines_[1]->BackupUpdateCounts().at(0).applied_by_worker, expected);
}

TEST_F(ReplicationTest, ACopyReCreatedFromASnapshotReportsThePushesItsPrimaryApplied) {
  // Which pushes, not only how many: a copy that took another push's
  // digest would hide a push lost and another applied twice.
  Make(ASYNC);
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  Send(0, PUSH, 0, 0, {1, 1}, 4);
  Send(0, PUSH, 1, 0, {1, 1}, 4);
  Send(0, PUSH, 1, 0, {1, 1}, 4);
  Deliver();
  Install(MapAt(5, 0, 1));  // and comes back: a snapshot re-creates it
  Deliver();
  const std::vector<PartitionUpdates> primary = engines_[0]->UpdateCounts();
  const std::vector<PartitionUpdates> backup = engines_[1]->BackupUpdateCounts();
  ASSERT_EQ(primary.size(), 1u);
  ASSERT_EQ(backup.size(), 1u);
  EXPECT_THAT(backup[0].applied_by_worker, ElementsAre(1, 2));
  EXPECT_EQ(backup[0].applied_digest_by_worker, primary[0].applied_digest_by_worker);
}

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

TEST_F(ReplicationTest, ARoundOfOneGradientGoesToTheBackupAsItsMessageAndTheCopiesStayBitwiseEqual) {
  // One worker: the round's sum is the received message itself, applied and
  // sent to the backup without a copy. Nothing may write into it while it
  // is in flight, and the next round's gradient must not replace it there.
  // Async: the same for a batch of one push.
  const int n = 1031;
  for (const Consistency mode : {SYNC, ASYNC}) {
    SCOPED_TRACE(mode);
    hold_in_flight_ = true;
    in_flight_.clear();
    Make(mode, [](ClusterConfig& c) { c.set_num_workers(1); }, n);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint64_t round = 0; round < 4; ++round) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      Send(0, PUSH_PULL, 0, round, g);
      ASSERT_EQ(outbox_.size(), 1u) << "round " << round;
      EXPECT_TRUE(outbox_.front().payload ==
                  std::string(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float)))
          << "the update of round " << round << " is its one gradient";
      Deliver();
      ASSERT_EQ(answers_.size(), round + 1);
      EXPECT_EQ(answers_.back().status_code(), 0) << answers_.back().error();
      EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "round " << round;
    }
    ExpectInFlightUnchanged();
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
  Make(SYNC, SumOnlyOnebitAggregates, n);
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

// The snapshot does not carry the last round's contributors: a copy
// promoted right after it answers a retry of that round with contributors 0,
// which a worker reads as "all of them" (worker.cc), so once a worker was
// removed from the job the retrying worker scales the aggregate by 1/W
// instead of 1/(W-1) and its weights leave its peers'.
TEST_F(ReplicationTest, ACopyPromotedRightAfterItsSnapshotAnswersTheLastRoundWithItsContributors) {
  const int n = 4;
  Make(SYNC, [](ClusterConfig& config) { config.set_update_mode(SUM_ONLY); }, n);
  auto map = [this](uint64_t epoch, uint32_t primary, std::optional<uint32_t> backup) {
    ShardMap m = MapAt(epoch, primary, backup);
    m.add_excluded_workers(1);  // worker 1 left the job
    return m;
  };
  Install(map(4, 0, std::nullopt));  // server 1's copy goes away
  const uint64_t id = Send(0, PUSH_PULL, 0, 0, {1.0f, 2.0f, 3.0f, 4.0f}, 4);
  ASSERT_EQ(answers_.size(), 1u);
  ASSERT_EQ(answers_[0].status_code(), 0) << answers_[0].error();
  ASSERT_EQ(answers_[0].contributors(), 1u);
  Install(map(5, 0, 1));  // the copy comes back: a snapshot at round 1
  Deliver();
  Install(map(6, 1, std::nullopt));  // server 0 dies at once; server 1 takes over
  Send(1, PUSH_PULL, 0, 0, std::vector<float>(n, 0.0f), 6, id);  // worker 0 re-sends round 0
  ASSERT_EQ(answers_.size(), 2u);
  ASSERT_EQ(answers_[1].status_code(), 0) << answers_[1].error();
  EXPECT_EQ(answers_[1].request_id(), id);
  EXPECT_TRUE(answer_payloads_[1] == answer_payloads_[0]);
  EXPECT_EQ(answers_[1].contributors(), answers_[0].contributors())
      << "the promoted copy lost the last round's contributors (0 reads as all workers)";
}

// A snapshot of a partition no INIT has reached yet marks the new copy
// initialised (ApplySnapshot), so the primary's INIT, replicated next, is
// confirmed as one applied already and the copy keeps zero weights: promoted
// later, it would train from them.
TEST_F(ReplicationTest, ACopyReCreatedBeforeTheInitTakesTheInitWhenItComes) {
  const int n = 4;
  Make(SYNC, nullptr, n, /*init=*/false);
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  Install(MapAt(5, 0, 1));             // and comes back before any INIT: a snapshot re-creates it
  Deliver();
  Send(0, INIT, 0, 0, std::vector<float>(n, 1.0f), 5);
  Deliver();
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0].status_code(), 0) << answers_[0].error();
  EXPECT_EQ(Weights(0), std::vector<float>(n, 1.0f));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0))) << "the copy dropped the INIT: backup[0] = " << Weights(1)[0];
}

// Server 1's copy goes away at epoch 4, round 0 completes without it, and
// the copy comes back at epoch 5; server 1 installs only the latest map it
// got, 5. What it still holds misses round 0: it is a new copy, not synced
// (a failover would otherwise take it for a valid one) until the snapshot.
class SkippedDropTest : public ReplicationTest {
 protected:
  // Epoch 4 on server 0 only, round 0 there, then epoch 5 on both.
  void DropRoundZeroAndGiveBack() {
    ASSERT_TRUE(engines_[0]->InstallShardMap(MapAt(4, 0, std::nullopt), 0).ok());
    Send(0, PUSH, 0, 0, {1.0f, 1.0f}, 4);
    Send(0, PUSH, 1, 0, {1.0f, 1.0f}, 4);
    ASSERT_TRUE(outbox_.empty()) << "no backup listed at epoch 4";
    Install(GivenBack(MapAt(5, 0, 1)));
  }

  // `map` with server 1's copy listed at epoch 5.
  static ShardMap GivenBack(ShardMap map) {
    (*map.mutable_partitions(0)->mutable_listed_at())[1] = 5;
    return map;
  }
};

TEST_F(SkippedDropTest, ACopyGivenBackInMapsItSkippedWaitsForASnapshot) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(DropRoundZeroAndGiveBack());
  EXPECT_THAT(engines_[1]->SyncedCopies(), IsEmpty()) << "a copy that missed round 0 says it is synced";
  ASSERT_EQ(outbox_.size(), 1u);
  EXPECT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// The primary skipped epoch 4 too (it kept sending server 1 its rounds): it
// still sends the copy listed anew a snapshot, which the copy waits for.
TEST_F(SkippedDropTest, APrimaryThatSkippedTheDropSendsTheCopyASnapshotToo) {
  Make(SYNC);
  Install(GivenBack(MapAt(5, 0, 1)));
  EXPECT_THAT(engines_[1]->SyncedCopies(), IsEmpty());
  ASSERT_EQ(outbox_.size(), 1u);
  EXPECT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
}

TEST_F(SkippedDropTest, ACopyGivenBackThenPromotedBeforeItsSnapshotAnswersDataLoss) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(DropRoundZeroAndGiveBack());
  outbox_.clear();  // lost with server 0
  ASSERT_TRUE(engines_[1]->InstallShardMap(GivenBack(MapAt(6, 1, std::nullopt)), 1).ok());
  Send(1, PUSH, 0, 1, {1.0f, 1.0f}, 6);
  ASSERT_EQ(answers_.size(), 3u);
  EXPECT_EQ(answers_.back().status_code(), static_cast<int>(absl::StatusCode::kDataLoss)) << answers_.back().error();
  EXPECT_THAT(answers_.back().error(), HasSubstr("before its copy was complete"));
}

// Server 1 dropped its copy (epoch 4); the maps that gave it back (5) and
// then made it the primary (6) reach it as one: it never held the state.
TEST_F(SkippedDropTest, ACopyNamedPrimaryOnAServerThatNeverGotItAnswersDataLoss) {
  Make(SYNC);
  Install(MapAt(4, 0, std::nullopt));
  ASSERT_TRUE(engines_[1]->InstallShardMap(GivenBack(MapAt(6, 1, std::nullopt)), 1).ok());
  Send(1, PULL, 1, 0, {}, 6);
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_.back().status_code(), static_cast<int>(absl::StatusCode::kDataLoss)) << answers_.back().error();
}

// A worker declared dead (or leaving) before the tensors were defined moves
// the epoch on: the servers install a map without partitions first. The map
// that defines the tensors is still the job's first: its copies begin equal,
// so its primaries serve and its backups are synced (no snapshot comes).
TEST_F(ReplicationTest, TheMapDefiningTheTensorsAfterAnEmptyOneListsCopiesFromTheStart) {
  Make(SYNC);
  for (uint32_t s : {0u, 1u}) Restart(s);
  ShardMap before_tensors;
  before_tensors.set_epoch(1);
  for (uint32_t s : {0u, 1u}) {
    ServerInfo* info = before_tensors.add_servers();
    info->set_index(s);
    info->set_data_address("tcp://s:" + std::to_string(s + 1));
  }
  before_tensors.add_excluded_workers(1);
  Install(before_tensors);
  ShardMap defined = MapAt(2, 0, 1);
  defined.add_excluded_workers(1);  // as DefineTensors copies it
  Install(defined);
  EXPECT_TRUE(outbox_.empty()) << "a snapshot for a copy listed from the start";
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u)) << "the backup waits for a snapshot that never comes";
  Send(0, INIT, 0, 0, {1.0f, 1.0f}, 2);
  Deliver();
  Send(0, PUSH_PULL, 0, 0, {1.0f, 1.0f}, 2);
  Deliver();
  ASSERT_EQ(answers_.size(), 2u);
  for (const DataHeader& a : answers_) EXPECT_EQ(a.status_code(), 0) << a.error();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// Server 1's copy is re-created, and server 0 dies before its snapshot
// arrives: the only copy left holds no valid state. It says so to every
// request instead of training on it, and passes nothing on to new copies.
TEST_F(ReplicationTest, ACopyPromotedBeforeItsSnapshotArrivedRefusesEveryRequestAsLost) {
  Make(SYNC);
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  Install(MapAt(5, 0, 1));             // and is re-created from a snapshot
  ASSERT_EQ(outbox_.size(), 1u);
  outbox_.clear();  // lost with server 0
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(6, 1, std::nullopt), 1).ok());
  Send(1, PUSH, 0, 0, {1.0f, 1.0f}, 6);
  Send(1, PULL, 1, 0, {}, 6);
  ASSERT_EQ(answers_.size(), 2u);
  for (const DataHeader& a : answers_) {
    EXPECT_EQ(a.status_code(), static_cast<int>(absl::StatusCode::kDataLoss)) << a.error();
    EXPECT_THAT(a.error(), HasSubstr("partition 5"));
    EXPECT_THAT(a.error(), HasSubstr("before its copy was complete"));
  }
  Restart(0);  // a new server gets a copy: no snapshot of a state that is not valid
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(7, 1, 0), 1).ok());
  EXPECT_TRUE(outbox_.empty());
}

TEST_F(ReplicationTest, ASnapshotWhoseEncodedAnswerLengthIsWrongIsRefusedAndTheRealOneTaken) {
  const int n = 4096;
  Make(SYNC, SumOnlyOnebitAggregates, n);
  Install(MapAt(4, 0, std::nullopt));  // server 1's copy goes away
  for (uint32_t rank : {0u, 1u}) Send(0, PUSH_PULL, rank, 0, std::vector<float>(n, 0.5f + rank), 4);
  ASSERT_EQ(answers_.size(), 2u);
  const size_t encoded = answer_payloads_[0].size();
  ASSERT_GT(encoded, 0u);
  Install(MapAt(5, 0, 1));  // a snapshot re-creates it; held here
  ASSERT_EQ(outbox_.size(), 1u);
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  const Message real = outbox_.front();
  outbox_.clear();
  ASSERT_GT(real.payload.size(), encoded + 16);
  // The encoded answer's length, before the answer and the count of pushes (0).
  const size_t at = real.payload.size() - 8 - encoded - 8;
  uint64_t stated = 0;
  std::memcpy(&stated, real.payload.data() + at, 8);
  ASSERT_EQ(stated, encoded);
  for (const uint64_t hostile : {~uint64_t{0}, uint64_t{encoded + 1}, uint64_t{encoded - 1}, uint64_t{0},
                                 uint64_t{real.payload.size()}}) {
    std::string bytes = real.payload;
    std::memcpy(bytes.data() + at, &hostile, 8);
    const DataHeader answer = Replica(0, 1, 5, real.header, bytes);
    EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << hostile;
  }
  // Still waiting for its snapshot: an update is refused.
  EXPECT_EQ(Replica(0, 1, 5, Summed(1, {0, 1}), "").status_code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(Replica(0, 1, 5, real.header, real.payload).status_code(), 0);
  Install(MapAt(6, 1, std::nullopt));  // server 1 takes over
  Send(1, PUSH_PULL, 0, 0, std::vector<float>(n, 0.0f), 6, answers_[0].request_id());
  ASSERT_EQ(answers_.size(), 3u);
  EXPECT_EQ(answers_[2].status_code(), 0) << answers_[2].error();
  EXPECT_TRUE(answer_payloads_[2] == answer_payloads_[0]);
}

TEST_F(ReplicationTest, ABackupThatDroppedItsCopyAtALaterMapIsNoErrorForThePrimary) {
  // A copy moved to a server that joined is dropped at a map its primary
  // may not have installed yet: the updates sent meanwhile are refused as
  // NOT_FOUND. That is the move, not copies that differ: no error.
  Make(SYNC);
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(4, 0, std::nullopt), 1).ok());  // server 0 still at epoch 3
  const uint64_t a = Send(0, PUSH, 0, 0, {2, 2});
  const uint64_t b = Send(0, PUSH, 1, 0, {4, 4});
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(a, b)) << "the round waits for no confirmation that will not come";
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_EQ(engines_[0]->stats().errors, 0u) << "the primary counted the move as an error";
  EXPECT_EQ(Weights(0), std::vector<float>({-2, -2}));
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
  zmq::message_t peer(std::string("server0"));
  zmq::message_t empty;
  engines_[1]->Handle(peer, h, &empty);
  ASSERT_FALSE(acks_.empty());
  EXPECT_EQ(acks_.back().header.status_code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(acks_.back().header.error(), HasSubstr("not forwarded to this copy"));
  EXPECT_EQ(Weights(1), std::vector<float>(n, 1.0f));
}

// A malformed update from a buggy or hostile primary: `summed_workers` is
// meaningful only on a sync round's update (replica_of PUSH), but the size
// check of HandleReplica expects no payload for any kind that names them, and
// ReplicaIsNew checks them only for PUSH. An INIT naming one with no payload
// is taken: the backup marks itself initialised with its zero weights, so the
// real INIT is answered as one applied already and the copies differ.
TEST_F(ReplicationTest, AnInitThatNamesSummedWorkersAndCarriesNoWeightsIsRefusedAndChangesNothing) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit"); }, n, /*init=*/false);
  DataHeader init;
  init.set_replica_of(INIT);
  init.add_summed_workers(0);
  const DataHeader answer = ToBackup(init, "");
  EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << answer.error();
  // The primary's real INIT then reaches the backup as usual.
  Send(0, INIT, 0, 0, std::vector<float>(n, 1.0f));
  Deliver();
  EXPECT_EQ(Weights(0), std::vector<float>(n, 1.0f));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0))) << "the backup kept its zero weights: backup[0] = " << Weights(1)[0];
}

// A malformed forwarded push (bytes its codec cannot decode) is confirmed
// at once, and so is the round update that names it: SumForwarded only logs
// the decoding error and applies the round anyway, with a sum that lacks
// that push (here, its first: p.acc keeps whatever the last round left).
// The backup confirms an update it did not apply as the primary did, and
// its weights change.
TEST_F(ReplicationTest, ARoundThatNamesAForwardedPushTheBackupCannotDecodeIsRefusedAndChangesNothing) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit:threshold=0.25"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  const std::string good = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);
  const std::string truncated = good.substr(0, good.size() - 8);
  std::vector<DataHeader> answers;
  answers.push_back(ToBackup(Forwarded(0, 0, spec), truncated));
  answers.push_back(ToBackup(Forwarded(1, 0, spec), good));
  answers.push_back(ToBackup(Summed(0, {0, 1}), ""));
  const bool refused = std::any_of(answers.begin(), answers.end(), [](const DataHeader& a) { return a.status_code() != 0; });
  EXPECT_TRUE(refused) << "every update was confirmed, though the round could not be summed";
  EXPECT_EQ(Weights(1), std::vector<float>(n, 1.0f)) << "the backup applied a round it could not sum";
}

// ReplicaIsNew takes a forwarded push of any round at or past the backup's,
// of any size: nothing bounds p.forwarded. Sync forwards only the open
// round's pushes (ssp a few rounds ahead), yet a backup takes and keeps
// pushes of rounds arbitrarily far ahead. The same holds for a backup that
// refused one round's update (it never applies another, so nothing it holds
// is ever dropped, while every later round's pushes keep arriving).
TEST_F(ReplicationTest, ABackupHoldsForwardedPushesOnlyOfRoundsNearItsOwn) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  const std::string good = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);
  const DataHeader huge = ToBackup(Forwarded(0, 0, spec), std::string(64 * n, '\1'));
  EXPECT_NE(huge.status_code(), 0) << "a forwarded push larger than any a worker may send was kept";
  int taken = 0;
  for (uint64_t round = 1; round <= 1000; ++round) {
    for (uint32_t rank : {0u, 1u}) {
      if (ToBackup(Forwarded(rank, round, spec), good).status_code() == 0) ++taken;
    }
  }
  EXPECT_LE(taken, 2 * 8) << "the backup holds the pushes of every round it was sent";
}

// Found by the replica fuzzer: only round-based primaries forward pushes; an
// async copy that held one counted it as a sync round's push once promoted,
// into a round sum it does not have.
TEST_F(ReplicationTest, AnAsyncOrSspOnArrivalBackupRefusesAForwardedPush) {
  for (const bool ssp : {false, true}) {
    SCOPED_TRACE(ssp ? "ssp on arrival" : "async");
    Make(ssp ? SSP : ASYNC, [ssp](ClusterConfig& config) {
      if (ssp) config.set_staleness(2);
    });
    const std::vector<float> g = {0.5f, 0.5f};
    const DataHeader answer = ToBackup(Forwarded(0, 0, ""), std::string(reinterpret_cast<const char*>(g.data()), 8));
    EXPECT_NE(answer.status_code(), 0) << "a forwarded push was taken";
    EXPECT_EQ(engines_[1]->Queues().forwarded, 0u);
    if (engines_[1]->Queues().forwarded != 0) return;  // promoting would count it into nothing
    Install(MapAt(4, 1, std::nullopt));
    EXPECT_EQ(Weights(1), std::vector<float>(2, 1.0f));
  }
}

// Found by the replica fuzzer: a raw forwarded push (ssp in rounds sends
// pushes as the workers sent them) was held at any size from 1 byte, then
// summed or, once promoted, counted as n floats: a read past its end.
TEST_F(ReplicationTest, ABackupRefusesARawForwardedPushThatIsNotNFloats) {
  const int n = 64;
  Make(
      SSP,
      [](ClusterConfig& config) {
        config.set_staleness(1);
        config.set_ssp_in_rounds(true);
      },
      n);
  for (const size_t bytes : {size_t{4}, n * sizeof(float) - 4, n * sizeof(float) + 4}) {
    const DataHeader answer = ToBackup(Forwarded(0, 0, ""), std::string(bytes, '\0'));
    EXPECT_NE(answer.status_code(), 0) << "a raw forwarded push of " << bytes << " bytes was taken";
  }
  EXPECT_EQ(engines_[1]->Queues().forwarded, 0u);
  DataHeader real = Forwarded(0, 0, "");
  real.set_replica_request_id(7);
  EXPECT_EQ(ToBackup(real, std::string(n * sizeof(float), '\0')).status_code(), 0) << "the real one is taken";
  EXPECT_EQ(engines_[1]->Queues().forwarded, 1u);
}

// Found by the replica fuzzer's bound on held pushes: a snapshot moves a
// copy past rounds whose forwarded pushes it held, and kept them; each
// further snapshot let the window of rounds it takes fill up again.
TEST_F(ReplicationTest, ASnapshotDropsTheForwardedPushesOfTheRoundsItCovers) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  for (uint64_t round = 0; round < 4; ++round) {
    for (uint32_t rank : {0u, 1u}) {
      const std::string push = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, round);
      const DataHeader answer = ToBackup(Forwarded(rank, round, spec), push);
      EXPECT_EQ(answer.status_code(), 0) << answer.error();
    }
  }
  ASSERT_EQ(engines_[1]->Queues().forwarded, 8u);
  // Sync, SGD, no pull codec: the weights, then per worker its last request
  // id, pushes applied, their digest and rejoin, then the INIT flag, then no pushes.
  DataHeader snapshot;
  snapshot.set_replica_of(SNAPSHOT);
  snapshot.set_round(3);
  snapshot.set_contributors(2);
  std::string state(n * sizeof(float) + 10 * sizeof(uint64_t), '\0');
  state[n * sizeof(float) + 8 * sizeof(uint64_t)] = 1;
  ASSERT_EQ(ToBackup(snapshot, state).status_code(), 0);
  EXPECT_EQ(engines_[1]->Queues().forwarded, 2u) << "only round 3's pushes are of a round not applied";
}

// A server that joins a long-running job (its engine fresh, at epoch 0)
// may get its snapshot before its own map, routed many epochs past 0: it
// holds it until that map, as it would a request a few epochs ahead.
TEST_F(ReplicationTest, AJoinedServerHoldsASnapshotThatArrivesBeforeItsFirstMap) {
  Make(SYNC);
  Send(0, PUSH, 0, 0, {2.0f, 4.0f});
  Send(0, PUSH, 1, 0, {6.0f, 8.0f});
  Deliver();
  ShardMap joined;
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOne(&joined));
  Deliver();  // the snapshot reaches server 1 before its map
  EXPECT_TRUE(engines_[1]->SyncedCopies().empty());
  ASSERT_TRUE(engines_[1]->InstallShardMap(joined, 1).ok());
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  Send(0, PUSH, 0, 1, {1.0f, 1.0f}, 12);
  Send(0, PUSH, 1, 1, {1.0f, 1.0f}, 12);
  Deliver();
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// The line that says a snapshot went and the one that probes it name the
// same update, the one the backup confirms: before, the first named the
// partition's round ("at update 313") and the probe its update count
// ("update 315"), which read as two snapshots (review21's chaos run).
TEST_F(ReplicationTest, TheSnapshotAndItsProbeNameTheSameUpdate) {
  Make(SYNC);
  WarningLines said;
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  outbox_.clear();  // the snapshot, lost
  engines_[0]->ProbeUnconfirmedSnapshots();
  engines_[0]->ProbeUnconfirmedSnapshots();
  const std::string lines = said.Joined();
  std::smatch sent, probed;
  ASSERT_TRUE(std::regex_search(lines, sent, std::regex("re-creating a copy of partition 5 .*update ([0-9]+)")))
      << lines;
  ASSERT_TRUE(std::regex_search(lines, probed, std::regex("the snapshot of partition 5 \\(update ([0-9]+)\\)")))
      << lines;
  EXPECT_EQ(sent[1], probed[1]) << lines;
}

// A snapshot lost on its way (a server that just joined holds sealed
// messages from senders its first map does not list only so far) was never
// answered, and the partition completed no round again: its primary waits
// for the confirmation of the update before a round's. Now a backup that has
// not confirmed its snapshot from one check to the next is asked whether it
// arrived; its copy, still waiting for it, refuses, and the refusal
// re-creates it.
TEST_F(ReplicationTest, ASnapshotLostOnItsWayIsProbedSentAgainAndTheRoundsGoOn) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  ASSERT_EQ(outbox_.size(), 1u);
  outbox_.clear();  // the snapshot, lost
  DeliveredRound(0, 12);
  EXPECT_TRUE(answers_.empty()) << "a round completed before its backup confirmed the snapshot";
  engines_[0]->ProbeUnconfirmedSnapshots();  // unconfirmed: noted
  EXPECT_TRUE(outbox_.empty()) << "probed before a whole check period passed";
  engines_[0]->ProbeUnconfirmedSnapshots();  // still unconfirmed: probed
  ASSERT_EQ(outbox_.size(), 1u);
  EXPECT_EQ(engines_[0]->stats().snapshot_probes, 1u);
  EXPECT_NE(outbox_.front().header.replica_of(), SNAPSHOT) << "sent again before the backup said it was lost";
  EXPECT_TRUE(outbox_.front().payload.empty());
  DeliverOneUpdate();
  ASSERT_EQ(acks_.size(), 1u);
  EXPECT_EQ(acks_.front().header.status_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << "a copy waiting for its snapshot answered the probe OK";
  Deliver();  // the refusal; then the snapshot again, and round 0
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  ASSERT_EQ(answers_.size(), 2u);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  DeliveredRound(1, 12);
  EXPECT_EQ(answers_.size(), 4u);
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  engines_[0]->ProbeUnconfirmedSnapshots();
  engines_[0]->ProbeUnconfirmedSnapshots();
  EXPECT_TRUE(outbox_.empty()) << "a confirmed snapshot probed or sent again";
}

// chaos16: a primary cut off from its backup only (both still heartbeat, so
// neither is declared dead) stalled every round of its partitions with no
// word from any node. A backup that confirms nothing for a whole check while
// updates wait is reported once, naming it, and once when it confirms again.
TEST_F(ReplicationTest, ABackupThatConfirmsNothingForAWholeCheckIsReportedOnceAndAgainWhenItResumes) {
  Make(SYNC);
  engines_[0]->CheckReplicationStalls();
  Send(0, PUSH, 0, 0, {2.0f, 4.0f});
  Send(0, PUSH, 1, 0, {6.0f, 8.0f});  // round 0 goes to the backup, whose link is down
  ASSERT_EQ(outbox_.size(), 1u);
  EXPECT_TRUE(engines_[0]->CheckReplicationStalls().empty()) << "reported before a whole check passed";
  auto stalls = engines_[0]->CheckReplicationStalls();
  ASSERT_EQ(stalls.size(), 1u) << "a backup that confirmed nothing for a whole check was not reported";
  EXPECT_EQ(stalls[0].backup, 1u);
  EXPECT_EQ(stalls[0].address, "tcp://s:2");
  EXPECT_THAT(stalls[0].partitions, ElementsAre(5u));
  EXPECT_FALSE(stalls[0].resumed);
  EXPECT_TRUE(engines_[0]->CheckReplicationStalls().empty()) << "the same stall reported twice";

  Deliver();  // the link is back
  ASSERT_EQ(answers_.size(), 2u);
  stalls = engines_[0]->CheckReplicationStalls();
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_TRUE(stalls[0].resumed);
  EXPECT_TRUE(engines_[0]->CheckReplicationStalls().empty());
}

// A primary whose connection to its backup broke (a cut: no answer to its
// heartbeats) makes it again with its queue dropped: the round's update in
// flight on it is lost, and nothing would send it again. The backup gets a
// snapshot instead, and the round is answered once it confirms that.
TEST_F(ReplicationTest, APartitionWhoseUpdateWasLostWithTheConnectionToItsBackupSendsItASnapshot) {
  Make(SYNC);
  EXPECT_TRUE(engines_[0]->ConnectionToBackupBroke(1).empty()) << "a snapshot with nothing unconfirmed";
  EXPECT_TRUE(outbox_.empty());
  Round(0, 3);
  ASSERT_EQ(outbox_.size(), 1u);
  outbox_.clear();  // round 0's update, lost with the connection
  EXPECT_THAT(engines_[0]->ConnectionToBackupBroke(1), ElementsAre(5u));
  ASSERT_EQ(outbox_.size(), 1u);
  EXPECT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  EXPECT_TRUE(answers_.empty()) << "round 0 answered before its backup confirmed it";
  Deliver();
  ASSERT_EQ(answers_.size(), 2u) << "round 0 still waits for a confirmation that cannot come";
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  DeliveredRound(1, 3);
  EXPECT_EQ(answers_.size(), 4u);
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// A snapshot in flight on a connection that broke is sent again on the next
// one; the old connection may still deliver its copy after the heal, behind
// the fresh one and the rounds applied since. It applies nothing: the copy
// would go back to the state of the first snapshot.
TEST_F(ReplicationTest, ASnapshotDeliveredLateByABrokenConnectionAfterItsFreshCopyChangesNothing) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  ASSERT_EQ(outbox_.size(), 1u);
  const Message first = outbox_.front();
  outbox_.clear();  // on the connection that broke
  EXPECT_THAT(engines_[0]->ConnectionToBackupBroke(1), ElementsAre(5u));
  Deliver();  // the fresh snapshot
  DeliveredRound(0, 12);
  ASSERT_EQ(answers_.size(), 2u);
  ASSERT_TRUE(SameBits(Weights(1), Weights(0)));
  outbox_.push_back(first);  // the old connection delivers it after the heal
  Deliver();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0))) << "the late snapshot took the copy back before round 0";
  DeliveredRound(1, 12);
  EXPECT_EQ(answers_.size(), 4u);
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// chaos16: a primary paused (or cut off from the scheduler) past the
// heartbeat timeout, its backup promoted meanwhile at a later epoch, and
// still at its own epoch when it handles the workers' pushes of a round:
// the promoted copy refuses the round's update, and that refusal confirmed
// it, so the stale primary answered the workers OK for an update the job's
// primary never applied. It now leaves them unanswered, for the workers to
// re-send by the newer map, and sends that copy no snapshot.
TEST_F(ReplicationTest, APrimaryReplacedMeanwhileAcknowledgesNoRoundItsPromotedBackupRefused) {
  Make(SYNC);
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(4, 1, std::nullopt), 1).ok());  // server 0 declared dead
  Send(0, PUSH, 0, 0, {2.0f, 4.0f});
  Send(0, PUSH, 1, 0, {6.0f, 8.0f});
  Deliver();
  EXPECT_TRUE(answers_.empty()) << "the replaced primary acknowledged a round its promoted backup refused";
  for (const Message& m : replicated_) EXPECT_NE(m.header.replica_of(), SNAPSHOT) << "a snapshot sent to the new primary";
  EXPECT_EQ(Weights(1), std::vector<float>({1.0f, 1.0f})) << "the new primary changed";
}

// The snapshot is lost, and so is the first probe (held past its time by a
// server that just joined): the next check probes again instead of leaving
// the partition waiting for an answer that never comes.
TEST_F(ReplicationTest, AProbeLostAsWellIsFollowedByAnotherAndTheLostSnapshotIsSentAgain) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  ASSERT_EQ(outbox_.size(), 1u);
  outbox_.clear();  // the snapshot, lost
  Send(0, PUSH, 0, 0, {2.0f, 4.0f}, 12);
  Send(0, PUSH, 1, 0, {6.0f, 8.0f}, 12);
  Deliver();
  engines_[0]->ProbeUnconfirmedSnapshots();
  engines_[0]->ProbeUnconfirmedSnapshots();
  ASSERT_EQ(outbox_.size(), 1u);
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT_PROBE);
  outbox_.clear();  // the probe, lost too
  engines_[0]->ProbeUnconfirmedSnapshots();
  ASSERT_EQ(outbox_.size(), 1u) << "a lost probe leaves the partition waiting";
  EXPECT_EQ(outbox_.front().header.replica_of(), SNAPSHOT_PROBE);
  Deliver();  // refused; the snapshot again, then round 0
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  ASSERT_EQ(answers_.size(), 2u);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  EXPECT_EQ(engines_[0]->stats().snapshots_sent, 2u);
}

// A snapshot slow on its way (a large partition, a slow link, many queued
// to a replacement server) is unconfirmed at several checks. It was sent
// again at each (3 times), every copy queued behind the last on the same
// link, and the partition waited for the last: the stall grew to four
// transfers. Now it is sent once and probed (a header at each check), and
// the rounds go on as soon as that one snapshot is confirmed.
TEST_F(ReplicationTest, ASnapshotSlowOnItsWayIsSentOnceAndTheRoundsGoOnWhenItArrives) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  Send(0, PUSH, 0, 0, {2.0f, 4.0f}, 12);
  Send(0, PUSH, 1, 0, {6.0f, 8.0f}, 12);
  for (int check = 0; check < 5; ++check) engines_[0]->ProbeUnconfirmedSnapshots();  // still on its way
  auto sent = [this](Op kind) {
    int count = 0;
    for (const Message& m : outbox_) count += m.header.replica_of() == kind ? 1 : 0;
    return count;
  };
  EXPECT_EQ(sent(SNAPSHOT), 1) << "a snapshot still on its way was sent again";
  EXPECT_EQ(sent(SNAPSHOT_PROBE), 4) << "a probe at each check after the first";
  EXPECT_EQ(outbox_.size(), 5u) << "more than the snapshot and its probes";
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  DeliverOneUpdate();  // the snapshot arrives, and its confirmation
  ASSERT_EQ(acks_.size(), 1u);
  engines_[0]->HandleReplicaAck(acks_.front().from, acks_.front().header);
  acks_.clear();
  EXPECT_EQ(sent(PUSH), 1) << "round 0 waits for more than its snapshot";
  Deliver();
  ASSERT_EQ(answers_.size(), 2u);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  EXPECT_EQ(engines_[0]->stats().snapshots_sent, 1u);
}

// A copy that refused an update but still holds a state (synced) is
// re-created by its primary; that snapshot is lost. The probe that follows
// must not find the copy synced and confirm it: it names the snapshot, which
// the copy never applied, so the copy refuses (and is synced no more) and
// the primary sends the snapshot again.
TEST_F(ReplicationTest, ACopyWhoseReCreatingSnapshotIsLostRefusesTheProbeAndIsReCreated) {
  Make(SYNC);
  Round(0, 3);
  ASSERT_EQ(outbox_.size(), 1u);
  DataHeader refusal;  // round 0's update, lost, and refused as if it had come
  refusal.set_op(RESPONSE);
  refusal.set_partition_id(5);
  refusal.set_request_id(outbox_.front().header.request_id());
  refusal.set_status_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  refusal.set_server_epoch(3);
  outbox_.clear();
  engines_[0]->HandleReplicaAck(1, refusal);
  ASSERT_EQ(outbox_.size(), 1u) << "the refused copy is not re-created";
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  outbox_.clear();  // lost
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u)) << "the stale copy still counts itself synced";
  ASSERT_FALSE(SameBits(Weights(1), Weights(0)));
  engines_[0]->ProbeUnconfirmedSnapshots();
  engines_[0]->ProbeUnconfirmedSnapshots();  // the snapshot, lost on its way, is probed
  ASSERT_EQ(outbox_.size(), 1u);
  DeliverOneUpdate();
  ASSERT_EQ(acks_.size(), 1u);
  EXPECT_NE(acks_.front().header.status_code(), 0) << "a copy that lacks its snapshot confirmed it";
  EXPECT_TRUE(engines_[1]->SyncedCopies().empty()) << "a copy that lacks its snapshot still counts itself synced";
  Deliver();  // the refusal; then the snapshot again
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
  EXPECT_EQ(engines_[0]->stats().snapshots_sent, 2u);
}

// A backup slow but alive has not confirmed its snapshot at several checks:
// it is probed, the snapshot arrives and the copy syncs. Snapshots once
// sent again to it took the tries of the re-creation after a refusal (they
// were shared): an update the copy later refused left it differing from its
// primary for good, and a failover would have promoted it.
TEST_F(ReplicationTest, ASnapshotProbedAtASlowBackupLeavesARefusedCopyItsReCreation) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(ReplaceServerOneServingTheMap());
  for (int check = 0; check < 5; ++check) engines_[0]->ProbeUnconfirmedSnapshots();  // still on its way
  Deliver();  // the snapshot and the probe arrive
  ASSERT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  ASSERT_NO_FATAL_FAILURE(MissRoundZeroAndRefuseRoundOne(12));
  Deliver();  // the refusal; then a snapshot
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u)) << "the refused copy was not re-created";
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// A copy whose server is more than 4 epochs behind its primary refuses the
// snapshot that re-creates it (and every update after it: it holds no copy
// yet). Once its refusals say its server has caught up, the primary sends
// the snapshot again, and the copy is synced and equal.
TEST_F(ReplicationTest, ACopyThatRefusedItsSnapshotGetsItAgainOnceItsServerCaughtUp) {
  for (const Consistency mode : {SYNC, ASYNC}) {
    SCOPED_TRACE(mode == SYNC ? "sync" : "async");
    Make(mode);
    auto round = [&](uint64_t r, uint64_t epoch) {
      Send(0, PUSH, 0, mode == SYNC ? r : 0, {2.0f, 4.0f}, epoch);
      Send(0, PUSH, 1, mode == SYNC ? r : 0, {6.0f, 8.0f}, epoch);
      Deliver();
    };
    round(0, 3);
    ASSERT_TRUE(engines_[0]->InstallShardMap(MapAt(4, 0, std::nullopt), 0).ok());  // server 1 died
    Restart(1);
    ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(4, 0, std::nullopt), 1).ok());
    ShardMap joined = MapAt(10, 0, 1);
    joined.mutable_servers(1)->set_data_address("tcp://s:9");
    ASSERT_TRUE(engines_[0]->InstallShardMap(joined, 0).ok());
    round(1, 10);  // the snapshot and the round refused: server 1 serves epoch 4
    EXPECT_TRUE(engines_[1]->SyncedCopies().empty());
    ASSERT_TRUE(engines_[1]->InstallShardMap(joined, 1).ok());
    round(2, 10);  // refused (no snapshot yet), saying epoch 10: the snapshot again
    EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
    round(3, 10);
    for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
    EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
    answers_.clear();
  }
}

// A backup that refuses an update (here: one it never got, so the next
// is refused as a gap) differs from its primary from then on. The primary
// re-creates it with a snapshot instead of going on with a copy that
// could be promoted.
TEST_F(ReplicationTest, ABackupThatRefusedAnUpdateIsReCreatedFromASnapshot) {
  Make(SYNC);
  ASSERT_NO_FATAL_FAILURE(MissRoundZeroAndRefuseRoundOne(3));
  Deliver();  // the refusal; then a snapshot
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  Round(2, 3);
  Deliver();
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_TRUE(SameBits(Weights(1), Weights(0)));
}

// Found by the replica fuzzer's pair mode: a map that re-creates a copy
// while an async batch is open snapshots the batch's request ids (taken at
// arrival) without its gradient (applied when the batch closes); the
// batch's update then looks like one the new copy has, and it skips it.
TEST_F(ReplicationTest, ACopyReCreatedWhileAnAsyncBatchIsOpenGetsThatBatch) {
  Make(ASYNC);
  Install(MapAt(4, 1, std::nullopt));  // server 0 dies
  Restart(0);
  engines_[1]->BeginBatch();
  Send(1, PUSH, 1, 0, {0.5f, 0.5f}, /*epoch=*/4);
  Install(MapAt(5, 1, 0));  // server 0 comes back: a copy re-created from a snapshot
  engines_[1]->EndBatch();
  Deliver();
  EXPECT_NE(Weights(1), std::vector<float>(2, 1.0f)) << "the batch was applied";
  EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the re-created copy lacks the batch";
}

// Async: worker 0 rejoins (a new process, its request ids afresh) while a
// re-created copy's snapshot is in flight. The copy installs the map that
// lists the rejoin first, then applies the snapshot, taken before the
// primary knew of it: the copy holds the old process's last request id,
// and skips the new process's first pushes as ones it has applied.
TEST_F(ReplicationTest, ACopyWhoseSnapshotPredatesARejoinItKnowsCountsTheRejoinedWorkersPushes) {
  Make(ASYNC);
  Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 1);
  Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 2);
  Deliver();
  // Server 1 comes back at a new address: a copy re-created from a snapshot.
  ShardMap map = ServerOneComesBackAtANewAddress();
  ASSERT_EQ(outbox_.size(), 1u);
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  map.set_epoch(5);
  RejoinWorkerZero(map, /*epoch=*/0);
  Install(map);
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  ExpectTheNewProcessesPushOnBothCopies(5);
}

// Async: worker 0's pushes are on their way to the backup when it rejoins
// (a new process, its request ids afresh) and the backup installs the map
// first: the old process's updates, applied after the rejoin reset the
// backup's counters, raise them again, and the backup skips the new
// process's first push as one it has applied.
TEST_F(ReplicationTest, UpdatesInFlightAcrossARejoinLeaveTheBackupCountingTheNewProcess) {
  Make(ASYNC);
  Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 1);
  Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 2);
  ASSERT_EQ(outbox_.size(), 2u);
  ShardMap map = MapAt(4, 0, 1);
  RejoinWorkerZero(map, /*epoch=*/4);  // the map that lists it first
  Install(map);
  Deliver();
  ExpectTheNewProcessesPushOnBothCopies(4);
}

// After worker 0 rejoined (a new process, registration kNewProcess), a push
// naming no registration, or the dead process's (3, a late push arriving
// before the new process pushed), is not the new process's: refused, and it
// must not lock the new process out as a "restarted" worker (async resets
// the rank's counters, so the rank has not "started" yet).
TEST_F(ReplicationTest, APushNotOfTheProcessThatRejoinedIsRefusedAndTheNewProcessGoesOn) {
  for (const auto& [old, says] : {std::pair<uint64_t, std::string>{0, "names no registration"},
                                  std::pair<uint64_t, std::string>{3, "names registration 3"}}) {
    SCOPED_TRACE(says);
    incarnations_.clear();
    if (old != 0) incarnations_[0] = old;  // the process that dies
    Make(ASYNC);
    Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 1);
    Deliver();
    ShardMap map = MapAt(4, 0, 1);
    RejoinWorkerZero(map, /*epoch=*/4);
    Install(map);
    answers_.clear();
    const std::vector<float> before = Weights(0);
    Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 4, 2);  // still the old registration
    Deliver();
    ASSERT_EQ(answers_.size(), 1u);
    EXPECT_EQ(answers_[0].status_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(answers_[0].error(), HasSubstr(says));
    EXPECT_EQ(Weights(0), before);
    ExpectTheNewProcessesPushOnBothCopies(4);
  }
}

// A copy made after its server applied a rejoin (here server 1's, re-created
// from a snapshot, then promoted) was never told the rank's registration:
// Rejoin sets it only on the copies held at the time. CheckIncarnation then
// takes whatever the first push names: a push naming none is counted (the
// refusal above does not hold there), and a late push of the process that
// died (its own registration) is applied and takes the rank over, so the
// new process's pushes are refused as a restarted worker's from then on.
TEST_F(ReplicationTest, ACopyMadeAfterARejoinKnowsTheRegistrationOfTheNewProcess) {
  Make(ASYNC);
  incarnations_[0] = 3;  // the first process's registration
  Send(0, PUSH, 0, 0, {0.5f, 0.5f}, 3, 1);
  Deliver();
  auto with_rejoin = [](ShardMap map) {
    RejoinWorkerZero(map, /*epoch=*/4);
    return map;
  };
  Install(with_rejoin(MapAt(4, 0, 1)));
  ExpectTheNewProcessesPushOnBothCopies(4);
  Install(with_rejoin(MapAt(5, 0, std::nullopt)));  // server 1's copy goes away
  Install(with_rejoin(MapAt(6, 0, 1)));             // and is re-created from a snapshot
  Deliver();
  ASSERT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
  // Server 0 dies: server 1's copy is promoted.
  ASSERT_TRUE(engines_[1]->InstallShardMap(with_rejoin(MapAt(7, 1, std::nullopt)), 1).ok());
  answers_.clear();
  const std::vector<float> before = Weights(1);
  incarnations_.erase(0);
  Send(1, PUSH, 0, 0, {0.5f, 0.5f}, 7, 2);  // names no registration
  incarnations_[0] = 3;
  Send(1, PUSH, 0, 0, {0.5f, 0.5f}, 3, 2);  // the dead process's, late
  incarnations_[0] = kNewProcess;
  Send(1, PUSH, 0, 0, {0.25f, 0.25f}, 7, 2);
  ASSERT_EQ(answers_.size(), 3u);
  EXPECT_THAT(answers_[0].error(), HasSubstr("names no registration"));
  EXPECT_EQ(answers_[1].status_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << "the dead process's push was taken";
  EXPECT_EQ(answers_[2].status_code(), 0) << "the new process's push: " << answers_[2].error();
  // Only the new process's push applied (async: the gradient over two workers).
  EXPECT_EQ(Weights(1), (std::vector<float>{before[0] - 0.125f, before[1] - 0.125f}));
}

// Scenarios checked and found to keep the copies equal (no bug): a backup
// re-created mid-round, a worker removed mid-round, a hand-off with a round
// open, a deterministic promotion, and warm-up rounds before the codec.
TEST_F(ReplicationTest, ABackupRecreatedMidRoundGetsThatRoundAsItsSum) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  SendBytes(0, PUSH, 0, 0, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0));
  Deliver();
  // Server 1 comes back at a new address: a new copy, sent a snapshot.
  ShardMap map = MapAt(4, 0, 1);
  map.mutable_servers(1)->set_data_address("tcp://s:9");
  Install(map);
  SendBytes(0, PUSH, 1, 0, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0), 4);
  Deliver();
  const Traffic t = TakeTraffic();
  EXPECT_EQ(t.forwarded_pushes, 1);
  EXPECT_EQ(t.summed_rounds, 0) << "the new copy lacks the push forwarded before it";
  EXPECT_EQ(answers_.size(), 2u);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_FALSE(SameBits(Weights(0), std::vector<float>(n, 1.0f)));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
}

// SSP in rounds: a push answered ahead of its round lives on the backups
// as the forwarded push until the round completes. Server 1 dies and a new
// one takes its place while round 0 is open: its snapshot holds the rounds
// applied and the open rounds' pushes. Then server 0 dies too, before round
// 0 completes (once the new copy confirmed its snapshot, or the moment it
// applied it, with the confirmation and all after it lost): the new copy,
// promoted, must count worker 0's answered push (the worker will not send
// it again).
TEST_F(ReplicationTest, ACopyReCreatedWhileAnSspRoundIsOpenGetsThePushesAnsweredInIt) {
  for (const bool confirmed : {true, false}) {
    SCOPED_TRACE(confirmed ? "snapshot confirmed" : "primary dead once the snapshot is applied");
    Make(SSP, [](ClusterConfig& config) {
      config.set_staleness(2);
      config.set_ssp_in_rounds(true);
    });
    const uint64_t early = Send(0, PUSH, 0, 0, {2.0f, 4.0f});
    const uint64_t parked = Send(0, PUSH, 0, 1, {10.0f, 20.0f});
    Deliver();
    EXPECT_THAT(Answered(), ElementsAre(early, parked)) << "answered ahead of round 0, within the bound";
    answers_.clear();
    // A new server 1, at a new address, while round 0 is open.
    const ShardMap map = ServerOneComesBackAtANewAddress();
    if (confirmed) {
      Deliver();
    } else {
      ASSERT_EQ(outbox_.size(), 1u);
      ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
      DeliverOneUpdate();
      acks_.clear();
    }
    EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
    // Server 0 dies: server 1 alone holds partition 5.
    ShardMap alone = MapAt(5, 1, std::nullopt);
    alone.mutable_servers(1)->set_data_address("tcp://s:9");
    ASSERT_TRUE(engines_[1]->InstallShardMap(alone, 1).ok());
    const uint64_t late = Send(1, PUSH, 1, 0, {6.0f, 8.0f}, 5);
    const uint64_t next = Send(1, PUSH, 1, 1, {0.0f, 0.0f}, 5);
    const uint64_t after = Send(1, PUSH, 0, 2, {0.0f, 0.0f}, 5);
    EXPECT_THAT(Answered(), ElementsAre(late, next, after));
    for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
    // Round 0: 1 - (2 + 6) / 2, 1 - (4 + 8) / 2; round 1: minus (10 + 0) / 2, (20 + 0) / 2.
    EXPECT_EQ(Weights(1), (std::vector<float>{-8.0f, -15.0f}));
    answers_.clear();
  }
}

// SSP in rounds: the snapshot of a copy re-created while rounds are open
// carries their pushes, counted and parked: with eight workers, seven of
// them two rounds ahead of the slowest, 21 pushes of a whole partition. A
// server's socket drops a frame over MaxFrameBytes (and disconnects its
// sender), so a snapshot over it never arrives: the copy refuses every
// later update for want of it and is never synced, and the partition is
// left without a valid backup.
TEST_F(ReplicationTest, ASnapshotWithTheOpenRoundsPushesFitsInAServersFrame) {
  const int n = 16384;
  Make(SSP, [](ClusterConfig& config) {
    config.set_num_workers(8);
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
    config.set_partition_bytes(n * sizeof(float));
  }, n);
  for (uint32_t rank = 0; rank < 7; ++rank) {
    for (uint64_t round = 0; round < 3; ++round) Send(0, PUSH, rank, round, std::vector<float>(n, 1.0f));
  }
  Deliver();
  EXPECT_EQ(answers_.size(), 14u) << "rounds 0 and 1 answered ahead of round 0 (round 2 waits for round 1)";
  ServerOneComesBackAtANewAddress();
  ASSERT_EQ(outbox_.size(), 1u);
  ASSERT_EQ(outbox_.front().header.replica_of(), SNAPSHOT);
  EXPECT_LE(static_cast<int64_t>(outbox_.front().payload.size()), PartitionEngine::MaxFrameBytes(config_));
  Deliver();
  EXPECT_THAT(engines_[1]->SyncedCopies(), ElementsAre(5u));
}

// Zero-copy sends: a round's sum and the answers' weights or aggregate go
// out referencing the engine's buffers, and ZeroMQ may still hold them when
// the next round starts. The same rounds, with every message held until
// the end, give the same answers and copies, and no held message changes.
TEST_F(ReplicationTest, MessagesStillBeingSentAreNeverWrittenIntoAndChangeNothing) {
  const int n = 64;
  struct Mode {
    const char* name;
    std::function<void(ClusterConfig&)> tweak;
    Consistency consistency = SYNC;
  };
  const std::vector<Mode> modes = {
      {"sync", nullptr},
      {"sync, reject_non_finite (staged sums)", [](ClusterConfig& c) { c.set_reject_non_finite(true); }},
      {"sum-only", [](ClusterConfig& c) { c.set_update_mode(SUM_ONLY); }},
      {"sum-only, staged", [](ClusterConfig& c) {
         c.set_update_mode(SUM_ONLY);
         c.set_reject_non_finite(true);
       }},
      {"deterministic", [](ClusterConfig& c) { c.set_deterministic(true); }},
      {"deterministic sum-only", [](ClusterConfig& c) {
         c.set_deterministic(true);
         c.set_update_mode(SUM_ONLY);
       }},
      {"sum-only, onebit aggregates", SumOnlyOnebitAggregates},
      {"ssp in rounds", [](ClusterConfig& c) {
         c.set_staleness(2);
         c.set_ssp_in_rounds(true);
         c.set_reject_non_finite(true);
       }, SSP},
  };
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    std::vector<std::string> runs[2];
    std::vector<float> weights[2][2];
    for (const bool hold : {false, true}) {
      in_flight_.clear();
      hold_in_flight_ = hold;
      Make(mode.consistency, mode.tweak, n);
      std::mt19937 rng(7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      auto grad = [&] {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        return g;
      };
      uint64_t epoch = 3;
      for (uint64_t r = 0; r < 6; ++r) {
        if (r == 2) {
          // Server 1 comes back at a new address: a snapshot mid-training.
          ShardMap map = MapAt(++epoch, 0, 1);
          map.mutable_servers(1)->set_data_address("tcp://s:9");
          Install(map);
        }
        if (r == 4) {
          // Hand-off to server 1, then server 1 the primary.
          ShardMap map = MapAt(++epoch, 0, 1, /*handoff=*/true);
          map.mutable_servers(1)->set_data_address("tcp://s:9");
          Install(map);
          Deliver();
          map = MapAt(++epoch, 1, 0);
          map.mutable_servers(1)->set_data_address("tcp://s:9");
          Install(map);
        }
        const uint32_t primary = r >= 4 ? 1 : 0;
        for (uint32_t rank : {1u, 0u}) {
          Send(primary, PUSH_PULL, rank, r, grad(), epoch);
          if (rank == 1) Deliver();
        }
        Deliver();
        Send(primary, PULL, 0, r + 1, {}, epoch);
        Deliver();
      }
      for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
      runs[hold] = answer_payloads_;
      EXPECT_EQ(answers_.size(), 18u);
      if (hold) {
        EXPECT_GT(in_flight_.size(), 20u);
      }
      weights[hold][0] = Weights(0);
      weights[hold][1] = Weights(1);
      ExpectInFlightUnchanged();
      in_flight_.clear();
    }
    EXPECT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < std::min(runs[0].size(), runs[1].size()); ++i) {
      EXPECT_TRUE(runs[0][i] == runs[1][i]) << "answer " << i << " differs when messages are still being sent";
    }
    EXPECT_TRUE(SameBits(weights[0][0], weights[1][0]));
    EXPECT_TRUE(SameBits(weights[0][1], weights[1][1]));
    EXPECT_TRUE(SameBits(weights[1][0], weights[1][1]));
  }
}

// SSP in rounds, three copies: server 2 (the primary, played by the test)
// forwarded worker 0's push of round 0 to both backups, then its push of
// round 1 to server 0 only, and died before server 1 had it (so that push
// was not answered). Server 0, promoted with server 1 its backup, holds
// that push parked: the worker's retry is answered, so server 1 must hold
// it before server 0 dies too, or server 1, promoted, refuses the worker's
// next push (owes round 1) and the answered gradient is lost.
TEST_F(ReplicationTest, ABackupThatStaysABackupGetsThePushesAPromotedSspCopyReplays) {
  Make(SSP, [](ClusterConfig& config) {
    config.set_num_servers(3);
    config.set_replication(3);
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  }, 2, /*init=*/false);
  Install(MapOfThree(4, 2, {0, 1}));
  const std::vector<float> ones = {1.0f, 1.0f};
  auto bytes = [](const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  DataHeader init;
  init.set_replica_of(INIT);
  for (uint32_t to : {0u, 1u}) ASSERT_EQ(Replica(2, to, 4, init, bytes(ones)).status_code(), 0);
  for (uint32_t to : {0u, 1u}) ASSERT_EQ(Replica(2, to, 4, Forwarded(0, 0, ""), bytes({2.0f, 4.0f})).status_code(), 0);
  ASSERT_EQ(Replica(2, 0, 4, Forwarded(0, 1, ""), bytes({10.0f, 20.0f})).status_code(), 0);
  // Server 2 dies: server 0 the primary, server 1 its backup.
  Install(MapOfThree(5, 0, {1}));
  Deliver();
  // Worker 0 re-sends its unanswered push of round 1 (same request id).
  const uint64_t retry = Send(0, PUSH, 0, 1, {10.0f, 20.0f}, 5, Forwarded(0, 1, "").replica_request_id());
  const uint64_t first = Send(0, PUSH, 1, 0, {6.0f, 8.0f}, 5);
  Deliver();
  EXPECT_THAT(Answered(), ElementsAre(retry, first));
  answers_.clear();
  // Server 0 dies too: server 1 alone.
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapOfThree(6, 1, {}), 1).ok());
  const uint64_t next = Send(1, PUSH, 1, 1, {0.0f, 0.0f}, 6);
  const uint64_t after = Send(1, PUSH, 0, 2, {0.0f, 0.0f}, 6);
  EXPECT_THAT(Answered(), ElementsAre(next, after));
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  // Round 0: 1 - (2 + 6) / 2, 1 - (4 + 8) / 2; round 1: minus (10 + 0) / 2, (20 + 0) / 2.
  EXPECT_EQ(Weights(1), (std::vector<float>{-8.0f, -15.0f}));
}

// SSP in rounds (and sync with forwarded compressed pushes), at random: two
// workers push rounds (at most two pushes in flight each), replica updates
// and confirmations arrive one at a time, the primary dies (its undelivered
// messages lost; only once its backup is synced, which a re-created copy is
// with the open rounds' pushes), a new server takes the dead one's place as the
// backup, and the primary role is handed off. Every worker re-sends what
// was not answered to the new primary. At the end the weights are those of
// the fault-free run: no answered push is lost, none is counted twice.
TEST_F(ReplicationTest, SspInRoundsSurvivesRandomFailoversAndReCreatedCopies) {
  struct Variant {
    const char* name;
    std::string sync_codec;  // empty: ssp in rounds
    bool deterministic = false, staged = false, handoffs = false;
    uint32_t staleness = 2;
  };
  const std::vector<Variant> variants = {
      {"ssp", "", false, false, false},
      {"ssp, deterministic", "", true, false, false},
      {"ssp, staged sums", "", false, true, false},
      {"ssp, hand-offs", "", false, false, true},
      {"ssp 1, deterministic, hand-offs", "", true, false, true, 1},
      {"sync 2bit, deterministic, hand-offs", "2bit:threshold=0.25", true, false, true},
  };
  for (const Variant& v : variants) {
    std::vector<float> sync_reference;
    for (uint32_t seed = 1; seed <= 60; ++seed) {
      SCOPED_TRACE(std::string(v.name) + ", seed " + std::to_string(seed));
      std::mt19937 rng(seed);
      const uint64_t rounds = 8;
      const bool sync_codec = !v.sync_codec.empty();
      const int n = sync_codec ? 4096 : 2;
      const std::string spec = sync_codec ? compression::ParseCodecSpec(v.sync_codec)->ToString() : "";
      Make(sync_codec ? SYNC : SSP, [&](ClusterConfig& config) {
        if (!sync_codec) {
          config.set_staleness(v.staleness);
          config.set_ssp_in_rounds(true);
        } else {
          config.mutable_compression()->set_codec(v.sync_codec);
        }
        config.set_deterministic(v.deterministic);
        config.set_reject_non_finite(v.staged);
      }, n);
      bool handing_off = false;
      uint32_t primary = 0;
      std::optional<uint32_t> backup = 1;
      uint64_t epoch = 3;
      int address = 10;
      std::string addresses[2] = {"tcp://s:1", "tcp://s:2"};
      auto map_now = [&] {
        // Copied by hand: GCC 12 takes the copy of `backup` for uninitialised (-Wmaybe-uninitialized).
        ShardMap m = MapAt(epoch, primary, backup ? std::optional<uint32_t>(*backup) : std::nullopt, handing_off);
        for (uint32_t s : {0u, 1u}) m.mutable_servers(s)->set_data_address(addresses[s]);
        return m;
      };
      struct Push {
        uint64_t round, id;
        bool answered = false;
      };
      std::vector<Push> pushes[2];
      auto grad = [&](uint32_t rank, uint64_t round) {
        if (!sync_codec) return std::vector<float>{static_cast<float>(rank + 1), static_cast<float>(round + 1)};
        std::mt19937 g(1000 * round + rank);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> v(n);
        for (float& x : v) x = normal(g);
        return v;
      };
      auto send_push = [&](uint32_t rank, uint64_t round, uint64_t id) {
        if (!sync_codec) return Send(primary, PUSH, rank, round, grad(rank, round), epoch, id);
        return SendBytes(primary, PUSH, rank, round, spec, EncodeForTest(spec, grad(rank, round), 5, round), epoch, id);
      };
      size_t seen = 0;
      bool failed = false;
      auto collect = [&] {
        for (; seen < answers_.size(); ++seen) {
          const DataHeader& h = answers_[seen];
          for (auto& list : pushes) {
            for (Push& p : list) {
              if (p.id != h.request_id()) continue;
              if (h.status_code() != 0) {
                ADD_FAILURE() << "push " << p.id << " of round " << p.round << " refused: " << h.error();
                failed = true;
              }
              p.answered = true;
            }
          }
        }
      };
      auto deliver_one = [&] {
        if (!outbox_.empty() && (acks_.empty() || rng() % 2 == 0)) {
          Message m = std::move(outbox_.front());
          outbox_.pop_front();
          zmq::message_t peer("server" + std::to_string(m.from));
          zmq::message_t payload(m.payload.data(), m.payload.size());
          engines_[m.to]->Handle(peer, m.header, &payload);
        } else if (!acks_.empty()) {
          Message m = std::move(acks_.front());
          acks_.pop_front();
          engines_[m.to]->HandleReplicaAck(m.from, m.header);
        }
      };
      auto resend = [&] {
        for (uint32_t rank : {0u, 1u}) {
          for (const Push& p : pushes[rank]) {
            if (!p.answered) send_push(rank, p.round, p.id);
          }
        }
      };
      int steps = 0;
      while (!failed && steps++ < 2000) {
        collect();
        bool done = true;
        for (auto& list : pushes) {
          done = done && list.size() == rounds && std::all_of(list.begin(), list.end(), [](const Push& p) { return p.answered; });
        }
        if (done) break;
        if (handing_off && !engines_[primary]->HandoffsDone().empty()) {
          handing_off = false;
          std::swap(primary, *backup);
          ++epoch;
          Install(map_now());
          resend();
          continue;
        }
        int action = rng() % 10;
        if (sync_codec && seed == 1 && action >= 8) action = 5;  // the fault-free reference
        if (action < 4) {
          const uint32_t rank = rng() % 2;
          auto& list = pushes[rank];
          const int open = std::count_if(list.begin(), list.end(), [](const Push& p) { return !p.answered; });
          if (list.size() < rounds && open < 2) {
            const uint64_t round = list.size();
            list.push_back(Push{round, 0});
            list.back().id = send_push(rank, round, 0);
          }
        } else if (action < 8) {
          deliver_one();
        } else if (action == 9 && backup && !handing_off && v.handoffs && rng() % 2 == 0 &&
                   !engines_[*backup]->SyncedCopies().empty()) {
          handing_off = true;
          ++epoch;
          Install(map_now());
        } else if (action == 8 && backup && !handing_off && rng() % 3 == 0) {
          // The primary dies; its backup, if synced, takes over.
          const std::vector<uint64_t> synced = engines_[*backup]->SyncedCopies();
          if (synced.empty()) continue;
          const uint32_t dead = primary;
          std::erase_if(outbox_, [&](const Message& m) { return m.from == dead || m.to == dead; });
          std::erase_if(acks_, [&](const Message& m) { return m.from == dead || m.to == dead; });
          primary = *backup;
          backup.reset();
          ++epoch;
          ASSERT_TRUE(engines_[primary]->InstallShardMap(map_now(), primary).ok());
          Restart(dead);
          engines_[dead]->JoinRunningJob();
          resend();
        } else if (action == 9 && !backup) {
          // A new server in the dead one's place, as the backup.
          const uint32_t fresh = 1 - primary;
          addresses[fresh] = "tcp://s:" + std::to_string(++address);
          backup = fresh;
          ++epoch;
          Install(map_now());
        }
      }
      collect();
      ASSERT_FALSE(failed);
      ASSERT_LT(steps, 2000) << "did not finish";
      Deliver();
      if (sync_codec) {
        if (seed == 1) sync_reference = Weights(primary);
        EXPECT_TRUE(SameBits(Weights(primary), sync_reference));
        if (backup) {
          EXPECT_TRUE(SameBits(Weights(*backup), sync_reference));
        }
        if (HasFailure()) break;
        continue;
      }
      // Each round r: minus (1 + 2) / 2 and (r + 1 + r + 1) / 2.
      std::vector<float> expected = {1.0f, 1.0f};
      for (uint64_t r = 0; r < rounds; ++r) {
        expected[0] -= 1.5f;
        expected[1] -= static_cast<float>(r + 1);
      }
      EXPECT_EQ(Weights(primary), expected);
      if (backup) {
        EXPECT_EQ(Weights(*backup), expected);
      }
      if (HasFailure()) break;
    }
  }
}

// SSP in rounds: the pushes of the open round go to a re-created copy
// right after its snapshot, one message each. A copy whose server has not
// installed the map yet holds them until it has, but only so many (its
// deferred requests are bounded): with many workers (or many partitions
// re-created at once) the rest are refused, and the copy, promoted, lacks
// answered pushes: their workers' next pushes are refused (owe round 0).
TEST_F(ReplicationTest, ACopyWhoseMapIsLateStillGetsEveryOpenPushOfTheRounds) {
  const uint32_t workers = 4200;
  Make(SSP, [](ClusterConfig& config) {
    config.set_num_workers(workers);
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  });
  // Every worker but the last pushes round 0: the round stays open.
  for (uint32_t rank = 0; rank + 1 < workers; ++rank) Send(0, PUSH, rank, 0, {1.0f, 1.0f});
  Deliver();
  ASSERT_EQ(answers_.size(), workers - 1);
  for (const DataHeader& h : answers_) ASSERT_EQ(h.status_code(), 0) << h.error();
  answers_.clear();
  // Server 1 dies; a new one takes its place (epoch 4: no copy there yet).
  ShardMap alone = MapAt(4, 0, std::nullopt);
  alone.mutable_servers(1)->set_data_address("tcp://s:9");
  ASSERT_TRUE(engines_[0]->InstallShardMap(alone, 0).ok());
  Restart(1);
  engines_[1]->JoinRunningJob();
  ASSERT_TRUE(engines_[1]->InstallShardMap(alone, 1).ok());
  // Epoch 5 re-creates the copy on server 1, which installs it late.
  ShardMap recreated = MapAt(5, 0, 1);
  recreated.mutable_servers(1)->set_data_address("tcp://s:9");
  ASSERT_TRUE(engines_[0]->InstallShardMap(recreated, 0).ok());
  Deliver();
  ASSERT_TRUE(engines_[1]->InstallShardMap(recreated, 1).ok());
  Deliver();
  // Server 0 dies before round 0 completes.
  ShardMap last = MapAt(6, 1, std::nullopt);
  last.mutable_servers(1)->set_data_address("tcp://s:9");
  ASSERT_TRUE(engines_[1]->InstallShardMap(last, 1).ok());
  int refused = 0;
  for (uint32_t rank = 0; rank + 1 < workers; ++rank) Send(1, PUSH, rank, 1, {0.0f, 0.0f}, 6);
  for (const DataHeader& h : answers_) refused += h.status_code() != 0;
  EXPECT_EQ(refused, 0) << "the promoted copy lacks answered pushes of round 0, e.g. " << answers_.back().error();
  answers_.clear();
  Send(1, PUSH, workers - 1, 0, {1.0f, 1.0f}, 6);
  EXPECT_EQ(Weights(1), (std::vector<float>{0.0f, 0.0f})) << "round 0 did not complete with every worker's push";
}

TEST_F(ReplicationTest, ARoundCompletedWithoutARemovedWorkerSumsTheOthersPushes) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit:threshold=0.25"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  SendBytes(0, PUSH, 0, 0, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0));
  Deliver();
  ShardMap map = MapAt(4, 0, 1);
  map.add_excluded_workers(1);
  Install(map);
  Deliver();
  const Traffic t = TakeTraffic();
  EXPECT_EQ(t.summed_rounds, 1);
  EXPECT_EQ(Weights(0), std::vector<float>(n, 0.75f));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
  SendBytes(0, PUSH, 0, 1, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 1), 4);
  Deliver();
  EXPECT_EQ(Weights(0), std::vector<float>(n, 0.5f));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
}

TEST_F(ReplicationTest, AWorkerRemovedWhileTheLastRoundIsUnconfirmedCompletesTheNextOnlyOnceItIs) {
  Make(SYNC);
  for (uint32_t w : {0u, 1u}) Send(0, PUSH, w, 0, {1.0f, 1.0f});
  ASSERT_EQ(outbox_.size(), 1u);  // round 0, not yet confirmed by the backup
  Send(0, PUSH, 0, 1, {1.0f, 1.0f});
  ShardMap map = MapAt(4, 0, 1);
  map.add_excluded_workers(1);
  Install(map);
  EXPECT_EQ(outbox_.size(), 1u) << "round 1 completed while round 0 was not on the backup";
  EXPECT_EQ(Weights(0), (std::vector<float>{0.0f, 0.0f}));
  Deliver();
  EXPECT_EQ(Weights(0), (std::vector<float>{-1.0f, -1.0f}));
  EXPECT_EQ(Weights(1), Weights(0));
}

// SSP in rounds: worker 1 pushed rounds 0 to 2 (forwarded to the backup as
// they came) and was removed while its push of round 2 was parked: the
// primary refused that push. The backup, promoted later, must not count it.
TEST_F(ReplicationTest, ABackupPromotedAfterAWorkersRemovalDoesNotCountItsPushesThePrimaryRefused) {
  Make(SSP, [](ClusterConfig& config) {
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  });
  Send(0, PUSH, 0, 0, {1.0f, 1.0f});
  for (uint64_t round : {0u, 1u}) Send(0, PUSH, 1, round, {1.0f, 1.0f});
  Send(0, PUSH, 1, 2, {100.0f, 100.0f});
  Deliver();
  ShardMap removed = MapAt(4, 0, 1);
  removed.add_excluded_workers(1);
  Install(removed);
  Deliver();
  ShardMap promoted = MapAt(5, 1, std::nullopt);
  promoted.add_excluded_workers(1);
  ASSERT_TRUE(engines_[1]->InstallShardMap(promoted, 1).ok());
  Send(1, PUSH, 0, 1, {1.0f, 1.0f}, 5);
  Send(1, PUSH, 0, 2, {2.0f, 2.0f}, 5);
  // Round 0: 1 - (1 + 1) / 2; round 1: minus (1 + 1) / 2; round 2: minus 2, worker 0's alone.
  EXPECT_EQ(Weights(1), (std::vector<float>{-3.0f, -3.0f}));
}

// SSP in rounds: worker 0's push of round 0 was counted in the open round
// when the worker was removed; it rejoined at round 0, and its new
// process's push of round 0 was answered as a retry of that one. A backup
// promoted then must count the counted push, or it refuses the new
// process's next push for owing round 0.
TEST_F(ReplicationTest, ABackupPromotedAfterARemovalKeepsTheRemovedWorkersPushOfTheOpenRound) {
  Make(SSP, [](ClusterConfig& config) {
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  });
  Send(0, PUSH, 0, 0, {2.0f, 2.0f});
  Deliver();
  ShardMap removed = MapAt(4, 0, 1);
  removed.add_excluded_workers(0);
  Install(removed);
  ShardMap rejoined = MapAt(5, 0, 1);
  RejoinWorkerZero(rejoined, 5);
  Install(rejoined);
  incarnations_[0] = kNewProcess;
  Send(0, PUSH, 0, 0, {2.0f, 2.0f}, 5, 1);
  Deliver();
  ShardMap promoted = MapAt(6, 1, std::nullopt);
  RejoinWorkerZero(promoted, 5);
  ASSERT_TRUE(engines_[1]->InstallShardMap(promoted, 1).ok());
  answers_.clear();
  Send(1, PUSH, 0, 1, {0.0f, 0.0f}, 6, 2);
  Send(1, PUSH, 1, 0, {0.0f, 0.0f}, 6);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  // Round 0: 1 - (2 + 0) / 2.
  EXPECT_EQ(Weights(1), (std::vector<float>{0.0f, 0.0f}));
}

TEST_F(ReplicationTest, AHandOffWithARoundOpenCompletesItOnBothCopiesThenSwitches) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) { config.mutable_compression()->set_codec("2bit:threshold=0.25"); }, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  const std::string g0 = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);
  SendBytes(0, PUSH, 0, 0, spec, g0);
  Deliver();
  Install(MapAt(4, 0, 1, /*handoff=*/true));
  EXPECT_TRUE(engines_[0]->HandoffsDone().empty()) << "a round is open";
  SendBytes(0, PUSH, 1, 0, spec, g0, 4);
  Deliver();
  EXPECT_EQ(engines_[0]->HandoffsDone().size(), 1u);
  EXPECT_EQ(TakeTraffic().summed_rounds, 1);
  Install(MapAt(5, 1, 0));
  Deliver();  // the new primary's snapshot to the old one
  for (uint32_t rank : {0u, 1u}) SendBytes(1, PUSH, rank, 1, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 1), 5);
  Deliver();
  EXPECT_EQ(TakeTraffic().summed_rounds, 1);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_EQ(answers_.size(), 4u);
  EXPECT_EQ(Weights(1), std::vector<float>(n, 0.5f));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
}

// SSP in rounds: worker 0 rejoined at round 1 and pushed it while round 0
// had no push, so the primary parked that push and answered it. The
// primary role is handed off; the new primary dies before its snapshot
// reaches the old one, which is promoted: it must still hold that push.
TEST_F(ReplicationTest, AnOldPrimaryPromotedBeforeTheNewOnesSnapshotKeepsTheParkedPushesItAnswered) {
  Make(SSP, [](ClusterConfig& config) {
    config.set_staleness(2);
    config.set_ssp_in_rounds(true);
  });
  auto with_rejoin = [](ShardMap map) {
    map.add_excluded_workers(0);
    if (map.epoch() < 5) return map;
    map.clear_excluded_workers();
    WorkerRejoin* rejoin = map.add_rejoined_workers();
    rejoin->set_rank(0);
    rejoin->set_round(1);
    rejoin->set_incarnation(kNewProcess);
    rejoin->set_epoch(5);
    return map;
  };
  Install(with_rejoin(MapAt(4, 0, 1)));
  Install(with_rejoin(MapAt(5, 0, 1)));
  incarnations_[0] = kNewProcess;
  const uint64_t parked = Send(0, PUSH, 0, 1, {2.0f, 2.0f}, 5);
  Deliver();
  ASSERT_THAT(Answered(), ElementsAre(parked));
  Install(with_rejoin(MapAt(6, 0, 1, /*handoff=*/true)));
  Deliver();
  ASSERT_EQ(engines_[0]->HandoffsDone().size(), 1u);
  Install(with_rejoin(MapAt(7, 1, 0)));
  outbox_.clear();  // the new primary's snapshot, lost with it
  ASSERT_TRUE(engines_[0]->InstallShardMap(with_rejoin(MapAt(8, 0, std::nullopt)), 0).ok());
  answers_.clear();
  Send(0, PUSH, 1, 0, {1.0f, 1.0f}, 8);
  Send(0, PUSH, 1, 1, {0.0f, 0.0f}, 8);
  Send(0, PUSH, 0, 2, {0.0f, 0.0f}, 8);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  // Round 0: 1 - 1, worker 1's alone; round 1: minus (2 + 0) / 2.
  EXPECT_EQ(Weights(0), (std::vector<float>{-1.0f, -1.0f}));
}

TEST_F(ReplicationTest, ADeterministicBackupPromotedMidRoundCountsTheForwardedPushOnce) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) {
    config.mutable_compression()->set_codec("2bit:threshold=0.25");
    config.set_deterministic(true);
  }, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  const std::string g = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);
  const uint64_t first = SendBytes(0, PUSH, 0, 0, spec, g);
  Deliver();
  ASSERT_TRUE(engines_[1]->InstallShardMap(MapAt(4, 1, std::nullopt), 1).ok());
  SendBytes(1, PUSH, 1, 0, spec, g, 4);
  SendBytes(1, PUSH, 0, 0, spec, g, 4, first);
  EXPECT_EQ(answers_.size(), 2u);
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_EQ(Weights(1), std::vector<float>(n, 0.75f));
}

TEST_F(ReplicationTest, WarmupRoundsGoAsTheSumAndTheCodecsRoundsAsTheirPushes) {
  const int n = 4096;
  Make(SYNC, [](ClusterConfig& config) {
    config.mutable_compression()->set_codec("2bit");
    config.mutable_compression()->set_uncompressed_rounds(1);
    config.mutable_compression()->set_warmup_codec("fp16");
    config.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
    config.mutable_optimizer()->set_learning_rate(0.01f);
  }, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint64_t round = 0; round < 3; ++round) {
    const std::string codec = round == 0 ? "fp16" : spec;
    for (uint32_t rank : {1u, 0u}) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      SendBytes(0, PUSH, rank, round, codec, EncodeForTest(codec, g, 5, round));
    }
    Deliver();
    const Traffic t = TakeTraffic();
    EXPECT_EQ(t.summed_rounds, round == 0 ? 0 : 1) << round;
    EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << round;
  }
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
}

// Replication 3, with a third server (2) played by the test: it is the
// primary, servers 0 and 1 its backups. It forwards worker 0's push of round
// 0 to both and worker 1's to server 1 only, then dies; server 0 becomes the
// primary with server 1 its backup (sent a snapshot: it now holds pushes
// forwarded by the dead primary). Server 0 counted worker 0's push again
// before it listed its backups, so round 0 reaches server 1 as its sum.
TEST_F(ReplicationTest, ABackupThatStaysABackupWhileAnotherIsPromotedSumsWhatTheNewPrimaryCounted) {
  const int n = 4096;
  const std::vector<std::string> g = StartThreeCopies(n, 11);
  const std::string spec = compression::ParseCodecSpec(kThreeCopiesCodec)->ToString();
  const std::vector<float> ones(n, 1.0f);
  // From server 2, to `to`.
  auto from_dead = [&](uint32_t to, DataHeader h, const std::string& payload) {
    const DataHeader answer = Replica(2, to, 4, h, payload);
    EXPECT_EQ(answer.status_code(), 0) << answer.error();
  };
  for (uint32_t to : {0u, 1u}) from_dead(to, Forwarded(0, 0, spec), g[0]);
  from_dead(1, Forwarded(1, 0, spec), g[1]);
  Install(MapOfThree(5, 0, {1}));
  Deliver();
  const uint64_t retry1 = SendBytes(0, PUSH, 1, 0, spec, g[1], 5, 77);
  const uint64_t retry0 = SendBytes(0, PUSH, 0, 0, spec, g[0], 5, 78);
  Deliver();
  EXPECT_EQ(TakeTraffic().summed_rounds, 0);
  EXPECT_THAT(Answered(), ::testing::UnorderedElementsAre(retry1, retry0));
  for (const DataHeader& h : answers_) EXPECT_EQ(h.status_code(), 0) << h.error();
  EXPECT_FALSE(SameBits(Weights(0), ones));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1)));
}

// Replication 3, as above, but an update the dead primary (server 2) sent
// before it died reaches the backup that stays (server 1) after the new
// primary's snapshot: ZeroMQ queues each sender's messages apart and the
// backup's socket takes them in turn, so nothing orders the two. Nothing in
// HandleReplica refuses an update from a primary the map has replaced
// (epoch 4, the backup serves 5): server 1 applies the dead primary's round
// 0 (workers 0 and 1), then confirms the new primary's round 0 (worker 0
// only: worker 1 was removed with it) as one it has applied already. The
// copies differ from then on, silently. (Not new with the forwarded pushes:
// a round sent as its fp32 sum goes the same way.)
TEST_F(ReplicationTest, AnUpdateFromAReplacedPrimaryThatArrivesLateIsRefused) {
  const int n = 4096;
  ServerTwoCountsRoundZero(StartThreeCopies(n, 5));
  const std::vector<float> ones(n, 1.0f);
  ServerZeroTakesOverAt(5);
  // Server 2's round 0, sent before it died, arrives now.
  const DataHeader late = Replica(2, 1, 4, Summed(0, {0, 1}), "");
  EXPECT_NE(late.status_code(), 0) << "server 1 took an update from the primary the map replaced";
  Deliver();
  EXPECT_FALSE(SameBits(Weights(0), ones)) << "server 0 completed round 0 with worker 0";
  EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the copies differ";
}

// As above, but the dead primary (server 2) sent its round 0 at epoch 5, a
// map that changed no role (a membership change) and that server 1 never
// installed: the watch keeps only the latest map, and server 1 went from
// epoch 4 to 6. The epoch rule takes the new primary's "since" as the epoch
// server 1 had before plus one (5), so the late update passes it.
TEST_F(ReplicationTest, AnUpdateFromAReplacedPrimaryIsRefusedWhenTheBackupSkippedTheMapItWasRoutedAt) {
  const int n = 4096;
  ServerTwoCountsRoundZero(StartThreeCopies(n, 5));
  ASSERT_TRUE(engines_[0]->InstallShardMap(MapOfThree(5, 2, {0, 1}), 0).ok());  // server 1 skips it
  ServerZeroTakesOverAt(6);
  const DataHeader late = Replica(2, 1, 5, Summed(0, {0, 1}), "");
  EXPECT_NE(late.status_code(), 0) << "server 1 took an update from the primary the map replaced";
  Deliver();
  EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the copies differ";
}

// Replication 3 again: the dead primary (server 2) forwarded worker 0's push
// of round 0 to server 1 only. Worker 0 then pushes round 0 to the new
// primary (server 0) with other bytes under a new request id (its step was
// failed and run again, its error feedback re-encoding the gradient):
// server 0 counts them and forwards them, but server 1 answers the forward
// as one it holds already, keyed by (worker, round) only, and sums the dead
// primary's bytes for the round the new primary names.
TEST_F(ReplicationTest, ABackupSumsThePushTheNewPrimaryCountedNotAnOlderOneOfTheSameRound) {
  const int n = 4096;
  const std::vector<std::string> g = StartThreeCopies(n, 9);
  const std::string spec = compression::ParseCodecSpec(kThreeCopiesCodec)->ToString();
  const std::vector<float> ones(n, 1.0f);
  EXPECT_EQ(Replica(2, 1, 4, Forwarded(0, 0, spec), g[0]).status_code(), 0);
  ShardMap map = MapOfThree(5, 0, {1});
  map.add_excluded_workers(1);
  Install(map);
  Deliver();
  SendBytes(0, PUSH, 0, 0, spec, g[1], 5);  // other bytes, a new request id
  Deliver();
  EXPECT_EQ(TakeTraffic().summed_rounds, 1);
  EXPECT_FALSE(SameBits(Weights(0), ones));
  EXPECT_TRUE(SameBits(Weights(0), Weights(1))) << "the backup summed another push than the primary counted";
}

}  // namespace
}  // namespace shardps
