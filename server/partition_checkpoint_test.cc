// PartitionEngine's checkpoints: what a server writes at a round boundary is
// enough for another engine to continue with bitwise the same weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "common/checkpoint_store.h"
#include "server/partition_engine.h"

namespace shardps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint64_t kPartition = 5;

ShardMap Map(uint64_t n) {
  ShardMap map;
  map.set_epoch(1);
  map.add_tensors()->set_name("t");
  PartitionInfo* info = map.add_partitions();
  info->set_id(kPartition);
  info->set_num_elements(n);
  return map;
}

class PartitionCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("partition-ckpt-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    // Adam: its moments and step count must come back for the next step to match.
    config_.set_num_workers(2);
    config_.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
    config_.mutable_optimizer()->set_learning_rate(0.1f);
    config_.mutable_checkpoint()->set_dir(dir_);
    config_.mutable_checkpoint()->set_every_rounds(2);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<PartitionEngine> Engine(const ClusterConfig& config, uint64_t n = 3) {
    auto engine = PartitionEngine::Create(config, [this](const zmq::message_t&, DataHeader& h, zmq::message_t*) {
      if (!h.error().empty()) errors_.push_back(h.error());
    });
    EXPECT_TRUE(engine.ok()) << engine.status();
    absl::Status s = (*engine)->InstallShardMap(Map(n), 0);
    EXPECT_TRUE(s.ok()) << s;
    return *std::move(engine);
  }

  // An engine of an async job, whose checkpoints are written on request only.
  std::unique_ptr<PartitionEngine> AsyncEngine() {
    ClusterConfig config = config_;
    config.clear_checkpoint();
    config.set_consistency(ASYNC);
    auto created = PartitionEngine::Create(config, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *std::move(created) : nullptr;
  }

  void Send(PartitionEngine& engine, Op op, uint32_t rank, uint64_t round, std::vector<float> values,
            uint64_t partition = kPartition) {
    DataHeader h;
    h.set_op(op);
    h.set_worker_rank(rank);
    h.set_round(round);
    h.set_epoch(1);
    h.set_partition_id(partition);
    h.set_request_id(++next_id_);
    h.set_dtype(FLOAT32);
    h.set_num_elements(values.size());
    zmq::message_t peer("w" + std::to_string(rank));
    zmq::message_t payload(values.data(), values.size() * sizeof(float));
    engine.Handle(peer, h, &payload);
  }

  // Round `round`: both workers push gradients that differ by round.
  void Round(PartitionEngine& engine, uint64_t round, uint64_t partition = kPartition) {
    const float r = static_cast<float>(round);
    Send(engine, PUSH, 0, round, {0.5f + r, -1.0f, 0.25f * r}, partition);
    Send(engine, PUSH, 1, round, {-0.125f, 2.0f - r, 1.0f}, partition);
  }

  static std::vector<float> Weights(const PartitionEngine& engine) {
    const float* w = engine.weights(kPartition);
    return std::vector<float>(w, w + 3);
  }

  std::string dir_;
  ClusterConfig config_;
  std::vector<std::string> errors_;
  uint64_t next_id_ = 0;
};

TEST_F(PartitionCheckpointTest, RestoredEngineContinuesWithBitwiseTheSameWeights) {
  auto original = Engine(config_);
  Send(*original, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Round(*original, 0);
  Round(*original, 1);  // checkpoint of round 2
  const std::vector<float> at_checkpoint = Weights(*original);
  Round(*original, 2);
  Round(*original, 3);  // and of round 4

  ClusterConfig restore = config_;
  ASSERT_TRUE(SetRestorePoint(CheckpointRoundDir(dir_, 2), &restore).ok());
  EXPECT_EQ(restore.checkpoint().restore_round(), 2u);
  restore.mutable_checkpoint()->clear_dir();
  auto restored = Engine(restore);
  EXPECT_EQ(Weights(*restored), at_checkpoint);
  Send(*restored, INIT, 0, 2, {9.0f, 9.0f, 9.0f});  // a resumed job's INIT is refused and changes nothing
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_NE(errors_[0].find("restored from a checkpoint"), std::string::npos) << errors_[0];
  errors_.clear();
  Round(*restored, 2);
  Round(*restored, 3);
  const std::vector<float> a = Weights(*original), b = Weights(*restored);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

TEST_F(PartitionCheckpointTest, ARestoredEngineKeepsTheRoundsCompletedWithNoGradientOutOfAdamsStepCount) {
  auto original = Engine(config_);
  Send(*original, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Round(*original, 0);
  for (uint32_t rank : {0u, 1u}) {  // round 1 frozen: no gradient, and the checkpoint of round 2
    DataHeader h;
    h.set_op(PUSH);
    h.set_worker_rank(rank);
    h.set_round(1);
    h.set_epoch(1);
    h.set_partition_id(kPartition);
    h.set_request_id(++next_id_);
    h.set_no_gradient(true);
    original->Handle(zmq::message_t(std::string("w")), h, nullptr);
  }
  Round(*original, 2);

  ClusterConfig restore = config_;
  ASSERT_TRUE(SetRestorePoint(CheckpointRoundDir(dir_, 2), &restore).ok());
  restore.mutable_checkpoint()->clear_dir();
  auto restored = Engine(restore);
  Round(*restored, 2);
  const std::vector<float> a = Weights(*original), b = Weights(*restored);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "Adam's bias correction differs";
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

TEST_F(PartitionCheckpointTest, AFailedCheckpointIsNoLongerReportedOnceALaterOneOfItsDirectoryIsWritten) {
  // chaos17: a checkpoint directory on a disk that filled, then was freed:
  // later rounds were written, but the server reported the full disk's error
  // in every heartbeat and `shardps status` showed it under the server.
  fs::create_directories(dir_);
  std::ofstream(CheckpointRoundDir(dir_, 2)) << "a file where round 2's directory goes";
  auto engine = Engine(config_);
  Send(*engine, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Round(*engine, 0);
  Round(*engine, 1);  // round 2 cannot be written
  EXPECT_EQ(engine->checkpoint_failure().round(), 2u);
  EXPECT_THAT(engine->checkpoint_failure().error(), HasSubstr("not written"));
  Round(*engine, 2);
  Round(*engine, 3);  // round 4 is
  EXPECT_TRUE(VerifyCheckpointRound(CheckpointRoundDir(dir_, 4)).ok());
  EXPECT_TRUE(engine->checkpoint_failure().dir().empty()) << engine->checkpoint_failure().ShortDebugString();
}

TEST_F(PartitionCheckpointTest, ModelThatDoesNotMatchTheCheckpointIsRefused) {
  auto original = Engine(config_);
  Send(*original, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Round(*original, 0);
  Round(*original, 1);
  ClusterConfig restore = config_;
  ASSERT_TRUE(SetRestorePoint(dir_, &restore).ok());
  auto engine = PartitionEngine::Create(restore, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
  ASSERT_TRUE(engine.ok());
  absl::Status s = (*engine)->InstallShardMap(Map(4), 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("partition 5"));
  EXPECT_THAT(s.message(), HasSubstr("not the same model"));
}

TEST_F(PartitionCheckpointTest, ACheckpointTheMapAsksForIsWrittenAtItsRound) {
  ClusterConfig config = config_;
  config.clear_checkpoint();
  auto engine = Engine(config);
  Send(*engine, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Round(*engine, 0);
  Round(*engine, 1);
  ShardMap map = Map(3);
  map.set_epoch(2);
  map.mutable_checkpoint()->set_dir(dir_ + "/later");
  map.mutable_checkpoint()->set_round(3);
  ASSERT_TRUE(engine->InstallShardMap(map, 0).ok());
  EXPECT_FALSE(VerifyCheckpointRound(CheckpointRoundDir(dir_ + "/later", 3)).ok()) << "round 3 is not done yet";
  Round(*engine, 2);
  auto round = VerifyCheckpointRound(CheckpointRoundDir(dir_ + "/later", 3));
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(engine->completed_round(), 3u);
  // Asked for the round the partition is at: written at once.
  map.set_epoch(3);
  map.mutable_checkpoint()->set_dir(dir_ + "/now");
  ASSERT_TRUE(engine->InstallShardMap(map, 0).ok());
  EXPECT_TRUE(VerifyCheckpointRound(CheckpointRoundDir(dir_ + "/now", 3)).ok());
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

// Server 1's part of the checkpoint of round 9 in `round_dir`: partition 7
// at version 4, and its manifest listing it.
void WriteServerOnesPart(const std::string& round_dir) {
  PartitionCheckpoint seven;
  seven.set_partition_id(7);
  seven.set_round(9);
  seven.set_version(4);
  auto entry = WritePartitionCheckpoint(round_dir, seven, 1, 0);
  ASSERT_TRUE(entry.ok()) << entry.status();
  CheckpointManifest server1;
  server1.set_round(9);
  server1.set_server(1);
  *server1.add_entries() = *entry;
  ASSERT_TRUE(WriteCheckpointManifest(round_dir, server1).ok());
}

TEST_F(PartitionCheckpointTest, AnAsyncCheckpointGetsThePartitionsAServerTookOverAfterTheRequest) {
  // Server 0 is primary of partition 5 and backup of 6 and 7 (primary on
  // server 1) when the checkpoint is asked for; server 1 then dies without
  // writing its part. The partitions server 0 takes over are written too, at
  // their versions, unless server 1's manifest already lists them (a file
  // rewritten at another version would fail that manifest's checksum).
  std::unique_ptr<PartitionEngine> async = AsyncEngine();
  ASSERT_NE(async, nullptr);
  PartitionEngine& engine = *async;
  ShardMap map = Map(3);
  for (uint64_t id : {6, 7}) {
    PartitionInfo* other = map.add_partitions();
    other->set_id(id);
    other->set_offset(3 * (id - 5));
    other->set_num_elements(3);
    other->set_server(1);
    other->add_backups(0);
  }
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  Send(engine, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  Send(engine, PUSH, 0, 0, {0.5f, -1.0f, 0.25f});
  const std::string ckpt = dir_ + "/async";
  const std::string round_dir = CheckpointRoundDir(ckpt, 9);
  // Server 1 wrote partition 7 and its manifest before it died, not 6.
  ASSERT_NO_FATAL_FAILURE(WriteServerOnesPart(round_dir));

  map.set_epoch(2);
  map.mutable_checkpoint()->set_dir(ckpt);
  map.mutable_checkpoint()->set_round(9);
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  auto incomplete = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_THAT(incomplete.status().message(), HasSubstr("partition 6"));
  // Server 1 is declared dead: server 0 is the primary of 6 and 7 now.
  map.set_epoch(3);
  for (int i = 1; i < 3; ++i) {
    map.mutable_partitions(i)->set_server(0);
    map.mutable_partitions(i)->clear_backups();
  }
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(*round, 9u);
  auto five = LoadPartitionCheckpoint(round_dir, kPartition);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->version(), 1u) << "the push applied before the request";
  auto six = LoadPartitionCheckpoint(round_dir, 6);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_TRUE(six->has_version());
  auto kept = LoadPartitionCheckpoint(round_dir, 7);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->version(), 4u) << "server 1's part, not written again";
  // A later map with the same request writes nothing more.
  map.set_epoch(4);
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  EXPECT_TRUE(VerifyCheckpointRound(round_dir).ok());
}

// Partitions 5, 6 and 7 (3 floats each), `primaries` their servers (6 with
// `backup_of_6` as its backup when set), at `epoch`, asking for the
// checkpoint of `round` into `dir`.
ShardMap ThreePartitions(uint64_t epoch, std::vector<uint32_t> primaries, const std::string& dir, uint64_t round,
                         std::optional<uint32_t> backup_of_6 = std::nullopt) {
  ShardMap map;
  map.set_epoch(epoch);
  map.add_tensors()->set_name("t");
  for (uint64_t i = 0; i < 3; ++i) {
    PartitionInfo* info = map.add_partitions();
    info->set_id(kPartition + i);
    info->set_num_elements(3);
    info->set_offset(3 * i);
    info->set_server(primaries[i]);
    if (i == 1 && backup_of_6) info->add_backups(*backup_of_6);
  }
  map.mutable_checkpoint()->set_dir(dir);
  map.mutable_checkpoint()->set_round(round);
  return map;
}

TEST_F(PartitionCheckpointTest, PrimariesHandedOffMidCheckpointLeaveEveryServersManifestComplete) {
  // Found in review: a server wrote its manifest once it had written as
  // many partitions as it was primary of. One that handed a partition off
  // before the round (server 0: 5 written, 6 handed to server 1 at round 1)
  // never wrote it, and one given a partition after its manifest (server 1:
  // 7 written, then 6) wrote none, or one naming only the last: the
  // checkpoint never completed (a grown cluster's hand-offs do this).
  ClusterConfig config = config_;
  config.clear_checkpoint();
  const std::string dir = dir_ + "/handed";
  const std::string round_dir = CheckpointRoundDir(dir, 2);
  auto Create = [&](uint32_t index, const ShardMap& map) {
    auto engine = PartitionEngine::Create(config, [this](const zmq::message_t&, DataHeader& h, zmq::message_t*) {
      if (!h.error().empty()) errors_.push_back(h.error());
    });
    EXPECT_TRUE(engine.ok()) << engine.status();
    EXPECT_TRUE((*engine)->InstallShardMap(map, index).ok());
    return *std::move(engine);
  };
  auto server0 = Create(0, ThreePartitions(2, {0, 0, 1}, dir, 2));
  auto server1 = Create(1, ThreePartitions(2, {0, 0, 1}, dir, 2, /*backup_of_6=*/1));
  for (uint64_t id : {5, 6}) Send(*server0, INIT, 0, 0, {1.0f, 2.0f, 3.0f}, id);
  Send(*server1, INIT, 0, 0, {1.0f, 2.0f, 3.0f}, 7);
  Round(*server0, 0, 5);
  Round(*server0, 1, 5);  // 5 written at round 2
  Round(*server0, 0, 6);
  Round(*server1, 0, 7);
  Round(*server1, 1, 7);  // 7 written at round 2: server 1's manifest lists it
  EXPECT_FALSE(VerifyCheckpointRound(round_dir).ok()) << "partition 6 is not written yet";

  // Partition 6 is handed to server 1 at round 1, server 0 keeping a copy
  // (its copy on server 1, which no replication fed here, runs rounds 0 and
  // 1 again).
  const ShardMap switched = ThreePartitions(3, {0, 1, 1}, dir, 2, /*backup_of_6=*/0);
  ASSERT_TRUE(server0->InstallShardMap(switched, 0).ok());
  ASSERT_TRUE(server1->InstallShardMap(switched, 1).ok());
  Send(*server1, INIT, 0, 0, {1.0f, 2.0f, 3.0f}, 6);
  Round(*server1, 0, 6);
  Round(*server1, 1, 6);  // 6 written at round 2 on server 1
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(*round, 2u);
  for (uint64_t id : {5, 6, 7}) EXPECT_TRUE(LoadPartitionCheckpoint(round_dir, id).ok()) << id;
  EXPECT_TRUE(errors_.empty()) << errors_.front();
}

TEST_F(PartitionCheckpointTest, AnAsyncCheckpointAskedInTheMapThatHandsAServerAPartitionKeepsTheOldPrimarysPart) {
  // Server 0 skipped the map that asked for the checkpoint (a watch hands
  // over only the latest) and installs the request together with partition
  // 7, which server 1 wrote, with its manifest, before handing it off.
  // Rewritten here at another version, server 1's manifest would fail its
  // checksum and the checkpoint would never verify.
  std::unique_ptr<PartitionEngine> async = AsyncEngine();
  ASSERT_NE(async, nullptr);
  PartitionEngine& engine = *async;
  ShardMap map = Map(3);
  PartitionInfo* seven = map.add_partitions();
  seven->set_id(7);
  seven->set_offset(3);
  seven->set_num_elements(3);
  seven->set_server(1);
  seven->add_backups(0);
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  Send(engine, INIT, 0, 0, {1.0f, 2.0f, 3.0f});
  const std::string ckpt = dir_ + "/async";
  const std::string round_dir = CheckpointRoundDir(ckpt, 9);
  ASSERT_NO_FATAL_FAILURE(WriteServerOnesPart(round_dir));

  map.set_epoch(4);
  map.mutable_checkpoint()->set_dir(ckpt);
  map.mutable_checkpoint()->set_round(9);
  map.mutable_partitions(1)->set_server(0);
  map.mutable_partitions(1)->clear_backups();
  ASSERT_TRUE(engine.InstallShardMap(map, 0).ok());
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  auto kept = LoadPartitionCheckpoint(round_dir, 7);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->version(), 4u) << "server 1's part, not written again";
  EXPECT_TRUE(LoadPartitionCheckpoint(round_dir, kPartition).ok());
}

}  // namespace
}  // namespace shardps
