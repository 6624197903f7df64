#include "common/checkpoint_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

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
      auto entry = WritePartitionCheckpoint(round_dir, State(server, round), server, 0);
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

  // Job `job`'s checkpoint of round 10 (written at `written_ms`):
  // partition p of three is owned by owners[p] and holds `value`; writes
  // the files and manifests of `servers` only.
  std::string WriteJobRound(uint64_t job, int64_t written_ms, const std::vector<uint32_t> &owners,
                            const std::vector<uint32_t> &servers, float value) {
    const std::string round_dir = CheckpointRoundDir(dir_, 10);
    for (uint32_t server : servers) {
      CheckpointManifest m;
      m.set_round(10);
      m.set_server(server);
      m.set_job(job);
      m.set_written_unix_ms(written_ms);
      for (uint32_t p = 0; p < owners.size(); ++p) {
        CheckpointManifest::Owner *owner = m.add_partitions();
        owner->set_partition_id(p);
        owner->set_server(owners[p]);
        if (owners[p] != server) continue;
        PartitionCheckpoint state = State(p, 10);
        const float w[2] = {value, value};
        state.set_weights(std::string(reinterpret_cast<const char *>(w), sizeof(w)));
        auto entry = WritePartitionCheckpoint(round_dir, state, server, job);
        EXPECT_TRUE(entry.ok()) << entry.status();
        *m.add_entries() = *entry;
      }
      EXPECT_TRUE(WriteCheckpointManifest(round_dir, m).ok());
    }
    return round_dir;
  }

  static float FirstWeight(const PartitionCheckpoint &state) {
    float w;
    std::memcpy(&w, state.weights().data(), sizeof(w));
    return w;
  }

  std::string dir_;
};

TEST_F(CheckpointStoreTest, ARoundALaterJobWroteAgainIsThatJobsAlone) {
  // Job 7 wrote round 10 from three servers; job 8 (resumed from an earlier
  // round, its partitions placed on two servers) wrote it again. Server 2's
  // manifest is job 7's and names a file job 8 rewrote.
  WriteJobRound(7, 1000, {0, 1, 2}, {0, 1, 2}, 1.0f);
  const std::string round_dir = WriteJobRound(8, 2000, {0, 1, 0}, {0, 1}, 2.0f);
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  for (uint64_t p = 0; p < 3; ++p) {
    auto state = LoadPartitionCheckpoint(round_dir, p);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(FirstWeight(*state), 2.0f) << "partition " << p;
  }
  EXPECT_EQ(PartitionsListedElsewhere(round_dir, 0, 8), std::set<uint64_t>{1});
  EXPECT_EQ(PartitionsListedElsewhere(round_dir, 0, 7), std::set<uint64_t>{2}) << "server 1 wrote job 8's since";
}

TEST_F(CheckpointStoreTest, ALaterJobsPartialRoundIsNeverMixedWithAnEarlierJobs) {
  // Job 8 died after server 0's manifest: servers 1 and 2 still hold job 7's,
  // whose files are intact, but the round is not job 8's checkpoint.
  WriteJobRound(7, 1000, {0, 1, 2}, {0, 1, 2}, 1.0f);
  const std::string round_dir = WriteJobRound(8, 2000, {0, 1, 2}, {0}, 2.0f);
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(round.ok());
  EXPECT_EQ(round.status().code(), absl::StatusCode::kFailedPrecondition) << round.status();
  EXPECT_THAT(round.status().message(), HasSubstr("server-1.manifest is missing"));
  EXPECT_FALSE(LoadPartitionCheckpoint(round_dir, 1).ok());
}

TEST_F(CheckpointStoreTest, ALaterJobThatDiesBeforeItsManifestsLeavesTheEarlierJobsRoundIntact) {
  // Job 8, resumed from an earlier round, wrote partition 0's file on
  // server 0 again and died before any manifest: job 7's round still
  // verifies, with job 7's weights.
  const std::string round_dir = WriteJobRound(7, 1000, {0, 1, 2}, {0, 1, 2}, 1.0f);
  PartitionCheckpoint state = State(0, 10);
  const float w[2] = {2.0f, 2.0f};
  state.set_weights(std::string(reinterpret_cast<const char *>(w), sizeof(w)));
  ASSERT_TRUE(WritePartitionCheckpoint(round_dir, state, 0, 8).ok());
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  auto loaded = LoadPartitionCheckpoint(round_dir, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(FirstWeight(*loaded), 1.0f);
}

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
  const std::string file = round_dir + "/partition-1.server-1.job-0000000000000000.ckpt";
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

TEST_F(CheckpointStoreTest, APartitionTwoServersWroteVerifiesWhicheverWroteLast) {
  // An async checkpoint's partition handed from server 0 to server 1 as
  // the request came: each wrote it at the version it had and listed it.
  // Server 0 wrote last; its file must not break server 1's manifest.
  const std::string round_dir = CheckpointRoundDir(dir_, 10);
  for (uint32_t server : {1u, 0u}) {
    CheckpointManifest m;
    m.set_round(10);
    m.set_server(server);
    CheckpointManifest::Owner *owner = m.add_partitions();
    owner->set_partition_id(0);
    owner->set_server(server);
    PartitionCheckpoint state = State(0, 10);
    const float w[2] = {float(server), float(server)};
    state.set_weights(std::string(reinterpret_cast<const char *>(w), sizeof(w)));
    auto entry = WritePartitionCheckpoint(round_dir, state, server, 0);
    ASSERT_TRUE(entry.ok()) << entry.status();
    *m.add_entries() = *entry;
    ASSERT_TRUE(WriteCheckpointManifest(round_dir, m).ok());
  }
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_TRUE(round.ok()) << round.status();
  auto state = LoadPartitionCheckpoint(round_dir, 0);
  ASSERT_TRUE(state.ok()) << state.status();
}

TEST_F(CheckpointStoreTest, MissingPartitionFileIsRefusedNamingIt) {
  const std::string round_dir = WriteRound(10, {0, 1});
  fs::remove(round_dir + "/partition-0.server-0.job-0000000000000000.ckpt");
  auto round = VerifyCheckpointRound(round_dir);
  ASSERT_FALSE(round.ok());
  EXPECT_THAT(round.status().message(), HasSubstr(round_dir + "/partition-0.server-0.job-0000000000000000.ckpt"));
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
