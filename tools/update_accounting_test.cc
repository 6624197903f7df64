#include "tools/update_accounting.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"

namespace shardps {
namespace {

using Pushes = std::map<int, std::map<uint64_t, uint64_t>>;

// Per worker, the pushes acknowledged to it (no digests; there from the start).
std::map<int, WorkerAcks> Acks(const Pushes& pushes) {
  std::map<int, WorkerAcks> out;
  for (const auto& [rank, p] : pushes) out[rank].pushes = p;
  return out;
}

TEST(AccountUpdatesTest, SyncComparesRoundsCompletedWithRoundsAcknowledged) {
  std::map<uint64_t, PartitionApplied> applied = {{0, {10, {}, {}}}, {1, {9, {}, {}}}};
  EXPECT_EQ(AccountUpdates(false, applied, Acks({{0, {{0, 10}, {1, 10}}}, {1, {{0, 10}, {1, 10}}}})).lost, 2u)
      << "partition 1 lost a round each worker saw acknowledged";
  applied[1].completed = 11;
  UpdateAccounting twice = AccountUpdates(false, applied, Acks({{0, {{0, 10}, {1, 10}}}}));
  EXPECT_EQ(twice.lost, 0u);
  EXPECT_EQ(twice.duplicates, 1u);
  applied[1].completed = 10;
  UpdateAccounting clean = AccountUpdates(false, applied, Acks({{0, {{0, 10}, {1, 10}}}}));
  EXPECT_EQ(clean.lost + clean.duplicates, 0u);
}

TEST(AccountUpdatesTest, SyncComparesEachWorkersGradientsWithTheRoundsThatSummedThem) {
  // Partition 0 completed 10 rounds, 9 of them with worker 1's gradient,
  // though worker 1 was acknowledged 10: a round went on without a gradient
  // it acknowledged.
  std::map<uint64_t, PartitionApplied> applied = {{0, {10, {10, 9}, {}}}};
  const Pushes pushes = {{0, {{0, 10}}}, {1, {{0, 10}}}};
  EXPECT_EQ(AccountUpdates(false, applied, Acks(pushes)).lost, 1u);
  std::map<int, WorkerAcks> rejoined = Acks(pushes);
  rejoined[1].rejoin_round = 3;  // caught up: rounds completed without it were answered as retries
  EXPECT_EQ(AccountUpdates(false, applied, rejoined).lost, 0u);
  applied[0].applied_by_worker[1] = 10;
  EXPECT_EQ(AccountUpdates(false, applied, Acks(pushes)).lost, 0u);
  applied[0].applied_by_worker.clear();  // a file that named none: rounds only
  EXPECT_EQ(AccountUpdates(false, applied, Acks(pushes)).lost, 0u);
  // Restored at round 4: the counts are this run's, as the acknowledgements.
  applied[0] = {14, {10, 10}, {}};
  EXPECT_EQ(AccountUpdates(false, applied, Acks(pushes), 4).lost, 0u);
}

TEST(AccountUpdatesTest, SyncRoundsCompletedBeforeAWorkerRejoinedAreNoDuplicates) {
  // Both workers were killed and started again: rank 0's new process
  // rejoined at round 20 and was acknowledged 80 rounds, rank 1's at 40 and
  // 60. The job completed 100 rounds, none of them twice, though no
  // surviving process was acknowledged 100.
  std::map<uint64_t, PartitionApplied> applied = {{0, {100, {80, 60}, {}}}};
  std::map<int, WorkerAcks> acks = Acks({{0, {{0, 80}}}, {1, {{0, 60}}}});
  acks[0].rejoin_round = 20;
  acks[1].rejoin_round = 40;
  const UpdateAccounting both = AccountUpdates(false, applied, acks);
  EXPECT_EQ(both.lost + both.duplicates, 0u);
  applied[0].completed = 101;
  EXPECT_EQ(AccountUpdates(false, applied, acks).duplicates, 1u) << "a round past the last any worker pushed";
  // Restored at round 10: the rejoin rounds are the job's, the restored
  // ones none of this run's.
  applied[0].completed = 110;
  acks[0].rejoin_round = 30;
  acks[1].rejoin_round = 50;
  const UpdateAccounting resumed = AccountUpdates(false, applied, acks, 10);
  EXPECT_EQ(resumed.lost + resumed.duplicates, 0u);
}

TEST(AccountUpdatesTest, SyncCountsOnlyTheRoundsPastARestore) {
  // Restored at round 150, 250 rounds more: each worker saw 250 acknowledged.
  const std::map<uint64_t, PartitionApplied> applied = {{0, {400, {}, {}}}, {1, {400, {}, {}}}};
  const UpdateAccounting resumed = AccountUpdates(false, applied, Acks({{0, {{0, 250}, {1, 250}}}}), 150);
  EXPECT_EQ(resumed.lost + resumed.duplicates, 0u) << "the restored rounds are no duplicates";
  EXPECT_EQ(AccountUpdates(false, applied, Acks({{0, {{0, 250}, {1, 250}}}})).duplicates, 300u) << "before";
  EXPECT_EQ(AccountUpdates(false, applied, Acks({{0, {{0, 251}, {1, 250}}}}), 150).lost, 1u);
}

TEST(AccountUpdatesTest, AsyncComparesEachWorkersPushes) {
  std::map<uint64_t, PartitionApplied> applied = {{0, {7, {3, 4}, {}}}};
  UpdateAccounting a = AccountUpdates(true, applied, Acks({{0, {{0, 3}}}, {1, {{0, 5}}}}));
  EXPECT_EQ(a.lost, 1u);
  EXPECT_EQ(a.duplicates, 0u);
  UpdateAccounting b = AccountUpdates(true, applied, Acks({{0, {{0, 2}}}}));
  EXPECT_EQ(b.duplicates, 1u);
  EXPECT_EQ(AccountUpdates(true, {}, Acks({{0, {{5, 4}}}})).lost, 4u) << "a partition no survivor holds";
}

TEST(AccountUpdatesTest, AsyncTellsWhichPushesWhereTheCountsAgree) {
  // Worker 1 was acknowledged pushes 11, 12, 13 of partition 0; the server
  // applied 11, 12 and 12 again: three each, one lost and one duplicate.
  const uint64_t acked = PushDigest(11) + PushDigest(12) + PushDigest(13);
  const uint64_t applied_twice = PushDigest(11) + 2 * PushDigest(12);
  std::map<uint64_t, PartitionApplied> applied = {{0, {7, {4, 3}, {PushDigest(1), applied_twice}}}};
  std::map<int, WorkerAcks> acks = Acks({{0, {{0, 4}}}, {1, {{0, 3}}}});
  EXPECT_EQ(AccountUpdates(true, applied, acks).lost, 0u) << "counts alone cannot tell";
  acks[0].digests = {{0, PushDigest(1)}};
  acks[1].digests = {{0, acked}};
  const UpdateAccounting swapped = AccountUpdates(true, applied, acks);
  EXPECT_EQ(swapped.lost, 1u);
  EXPECT_EQ(swapped.duplicates, 1u);
  applied[0].applied_digest_by_worker[1] = acked;
  const UpdateAccounting clean = AccountUpdates(true, applied, acks);
  EXPECT_EQ(clean.lost + clean.duplicates, 0u);
  applied[0].applied_digest_by_worker.clear();  // a file that named none: counts only
  acks[1].digests = {{0, applied_twice}};
  EXPECT_EQ(AccountUpdates(true, applied, acks).lost, 0u);
}

// A file of `text` under the test's temporary directory; returns its path.
std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/update_accounting_test.", getpid(), ".", name);
  std::ofstream(path) << text;
  return path;
}

TEST(ReadServerUpdatesTest, APrimarysLineWinsOverEveryBackupCopy) {
  const std::string a = WriteFile("a", "0 10 4 6\nbackup 1 12 5 7\nstaleness 3 1.5 1\n");
  const std::string b = WriteFile("b", "1 11 5 6\nbackup 0 20 10 10\nbackup 2 8 4 4\n");
  const std::string c = WriteFile("c", "backup 2 9 4 5\n");
  const auto applied = ReadServerUpdates({a, b, c, absl::StrCat(::testing::TempDir(), "/no-such-updates-file")});
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied.at(0).completed, 10u) << "primary, though its backup applied more";
  EXPECT_THAT(applied.at(0).applied_by_worker, ::testing::ElementsAre(4, 6));
  EXPECT_EQ(applied.at(1).completed, 11u) << "primary in a later file";
  EXPECT_EQ(applied.at(2).completed, 9u) << "no primary: the backup copy that applied the most";
}

TEST(ReadServerUpdatesTest, ReadsEachWorkersDigestAfterItsCounts) {
  const std::string a = WriteFile("digests", "0 10 4 6 digests 18446744073709551615 5\nbackup 1 12 5 7\n");
  const auto applied = ReadServerUpdates({a});
  ASSERT_EQ(applied.size(), 2u);
  EXPECT_THAT(applied.at(0).applied_by_worker, ::testing::ElementsAre(4, 6));
  EXPECT_THAT(applied.at(0).applied_digest_by_worker, ::testing::ElementsAre(UINT64_MAX, 5));
  EXPECT_THAT(applied.at(1).applied_digest_by_worker, ::testing::IsEmpty());
}

TEST(ReadWorkerAcksTest, ReadsTheAcknowledgedPushesOfAResultFile) {
  const std::string path = WriteFile("result",
                                     "test_accuracy 0.85\nsteps 120\nacked.0 60\nacked.7 61\n"
                                     "acked_digest.0 18446744073709551615\nacked_digest.7 3\nrejoin_round 0\n");
  const WorkerAcks acks = ReadWorkerAcks(path);
  EXPECT_THAT(acks.pushes, ::testing::ElementsAre(::testing::Pair(0, 60), ::testing::Pair(7, 61)));
  EXPECT_THAT(acks.digests, ::testing::ElementsAre(::testing::Pair(0, UINT64_MAX), ::testing::Pair(7, 3)))
      << "all 64 bits, which a double would round";
  EXPECT_EQ(acks.rejoin_round, 0u);
  EXPECT_EQ(ReadWorkerAcks(WriteFile("rejoined", "acked.0 60\nrejoin_round 12\n")).rejoin_round, 12u);
  EXPECT_THAT(ReadWorkerAcks(path + ".missing").pushes, ::testing::IsEmpty());
}

TEST(ReadServerUpdatesTest, AnAsyncUpdateMissingFromAServersFileCountsAsLost) {
  const auto acked = Acks({{0, {{0, 4}, {1, 3}}}, {1, {{0, 6}, {1, 5}}}});
  const std::string whole = WriteFile("whole", "0 10 4 6\n1 8 3 5\n");
  const UpdateAccounting clean = AccountUpdates(true, ReadServerUpdates({whole}), acked);
  EXPECT_EQ(clean.lost + clean.duplicates, 0u);
  const std::string cut = WriteFile("cut", "0 10 4 6\n");
  EXPECT_EQ(AccountUpdates(true, ReadServerUpdates({cut}), acked).lost, 8u) << "partition 1's 3 + 5 pushes";
}

}  // namespace
}  // namespace shardps
