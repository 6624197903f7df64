#include "common/checkpoint_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/durable_file.h"

namespace shardps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("ckpt-store-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static PartitionCheckpoint State(uint64_t id, uint64_t round) {
    PartitionCheckpoint s;
    s.set_partition_id(id);
    s.set_tensor("w");
    s.set_num_elements(2);
    s.set_round(round);
    const float w[2] = {1.5f, -2.0f};
    s.set_weights(std::string(reinterpret_cast<const char *>(w), sizeof(w)));
    return s;
  }

  // Round `round` of a map with partitions 0 (server 0) and 1 (server 1);
  // writes the partition files and manifests of `servers` only.
  std::string WriteRound(uint64_t round, std::vector<uint32_t> servers) {
    const std::string round_dir = CheckpointRoundDir(dir_, round);
    for (uint32_t server : servers) {
      auto entry = WritePartitionCheckpoint(round_dir, State(server, round));
      EXPECT_TRUE(entry.ok()) << entry.status();
      CheckpointManifest m;
      m.set_round(round);
      m.set_server(server);
      for (uint32_t p = 0; p < 2; ++p) {
        CheckpointManifest::Owner *owner = m.add_partitions();
        owner->set_partition_id(p);
        owner->set_server(p);
      }
      *m.add_entries() = *entry;
      EXPECT_TRUE(WriteCheckpointManifest(round_dir, m).ok());
    }
    return round_dir;
  }

  std::string dir_;
};

TEST_F(CheckpointStoreTest, CompleteRoundIsFoundAndItsPartitionsLoad) {
  const std::string round_dir = WriteRound(10, {0, 1});
  auto point = FindRestorePoint(dir_);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->round, 10u);
  EXPECT_EQ(point->round_dir, round_dir);
  auto state = LoadPartitionCheckpoint(round_dir, 1);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->SerializeAsString(), State(1, 10).SerializeAsString());
}

TEST_F(CheckpointStoreTest, CorruptPartitionFileIsRefusedNamingIt) {
  const std::string round_dir = WriteRound(10, {0, 1});
  const std::string file = round_dir + "/partition-1.ckpt";
  std::string data = *ReadWholeFile(file);
  data[data.size() - 3] ^= 0x40;  // one flipped bit in the weights
  ASSERT_TRUE(WriteFileDurably(file, data).ok());
  auto point = FindRestorePoint(dir_);
  ASSERT_FALSE(point.ok());
  EXPECT_EQ(point.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(point.status().message(), HasSubstr(file));
  EXPECT_FALSE(LoadPartitionCheckpoint(round_dir, 1).ok());
  EXPECT_TRUE(LoadPartitionCheckpoint(round_dir, 0).ok()) << "the intact file still reads";
}

TEST_F(CheckpointStoreTest, MissingPartitionFileIsRefusedNamingIt) {
  const std::string round_dir = WriteRound(10, {0, 1});
  fs::remove(round_dir + "/partition-0.ckpt");
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(round.ok());
  EXPECT_THAT(round.status().message(), HasSubstr(round_dir + "/partition-0.ckpt"));
}

TEST_F(CheckpointStoreTest, RoundWithoutEveryManifestIsPartialAndNamesTheMissingOne) {
  const std::string round_dir = WriteRound(10, {0});
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(round.ok());
  EXPECT_EQ(round.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(round.status().message(), HasSubstr(round_dir + "/server-1.manifest is missing"));
  auto point = FindRestorePoint(dir_);
  ASSERT_FALSE(point.ok()) << "no complete round to fall back to";
  EXPECT_THAT(point.status().message(), HasSubstr("server-1.manifest"));
  EXPECT_FALSE(LoadPartitionCheckpoint(round_dir, 0).ok()) << "a partial round is never loaded";
}

TEST_F(CheckpointStoreTest, TornManifestIsRefusedNamingIt) {
  const std::string round_dir = WriteRound(10, {0, 1});
  const std::string manifest = round_dir + "/server-0.manifest";
  std::string data = *ReadWholeFile(manifest);
  ASSERT_TRUE(WriteFileDurably(manifest, data.substr(0, data.size() / 2)).ok());
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(round.ok());
  EXPECT_THAT(round.status().message(), HasSubstr(manifest));
}

TEST_F(CheckpointStoreTest, LatestCompleteRoundIsTakenAndAnUnfinishedLaterOneSkipped) {
  WriteRound(10, {0, 1});
  WriteRound(20, {0});  // a server died before writing round 20
  auto point = FindRestorePoint(dir_);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->round, 10u);
  WriteRound(20, {1});
  point = FindRestorePoint(dir_);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->round, 20u);
}

TEST_F(CheckpointStoreTest, RestorePointGoesIntoTheConfig) {
  WriteRound(10, {0, 1});
  ClusterConfig config;
  ASSERT_TRUE(SetRestorePoint(dir_, &config).ok());
  EXPECT_EQ(config.checkpoint().restore_round(), 10u);
  EXPECT_EQ(config.checkpoint().restore_dir(), CheckpointRoundDir(dir_, 10));
  EXPECT_FALSE(SetRestorePoint(dir_ + "/nothing-here", &config).ok());
}

}  // namespace
}  // namespace shardps
