#include "common/tensor_spec.h"
#include "scheduler/shard_assignment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include <google/protobuf/util/message_differencer.h>

namespace shardps {
namespace {

TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape) { return Float32Tensor(name, shape); }

std::vector<ServerInfo> Servers(int n) {
  std::vector<ServerInfo> s(n);
  for (int i = 0; i < n; ++i) {
    s[i].set_index(i);
    s[i].set_data_address("tcp://h:" + std::to_string(7000 + i));
  }
  return s;
}

TEST(ShardAssignmentTest, PartitionsCoverEachTensorWithinTheByteLimit) {
  std::vector<TensorSpec> tensors = {Tensor("w", {1000, 37}), Tensor("b", {3})};
  auto map = BuildShardMap(tensors, Servers(3), 4096, 1);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<uint64_t> covered(2, 0);
  for (const PartitionInfo& p : map->partitions()) {
    EXPECT_LE(p.num_elements() * 4, 4096u);
    EXPECT_EQ(p.offset(), covered[p.tensor()]) << "partitions are contiguous and in order";
    covered[p.tensor()] += p.num_elements();
  }
  EXPECT_EQ(covered[0], 37000u);
  EXPECT_EQ(covered[1], 3u);
}

TEST(ShardAssignmentTest, ServerLoadsDifferByAtMostOnePartition) {
  std::mt19937 rng(7);
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 40; ++i) tensors.push_back(Tensor("t" + std::to_string(i), {1 + int64_t(rng() % 300000)}));
  const uint64_t partition_bytes = 256 * 1024;
  auto map = BuildShardMap(tensors, Servers(5), partition_bytes, 1);
  ASSERT_TRUE(map.ok());
  std::vector<uint64_t> bytes(5, 0);
  for (const PartitionInfo& p : map->partitions()) bytes[p.server()] += p.num_elements() * 4;
  auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  EXPECT_LE(*hi - *lo, partition_bytes);
}

TEST(ShardAssignmentTest, IsDeterministic) {
  std::vector<TensorSpec> tensors = {Tensor("a", {5000}), Tensor("b", {777, 3}), Tensor("c", {1})};
  auto m1 = BuildShardMap(tensors, Servers(2), 1024, 4);
  auto m2 = BuildShardMap(tensors, Servers(2), 1024, 4);
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*m1, *m2));
  EXPECT_EQ(m1->epoch(), 4u);
}

TEST(ShardAssignmentTest, RejectsBadSpecs) {
  EXPECT_FALSE(BuildShardMap({Tensor("a", {0})}, Servers(1), 1024, 1).ok());
  EXPECT_FALSE(BuildShardMap({Tensor("a", {2}), Tensor("a", {3})}, Servers(1), 1024, 1).ok());
  EXPECT_FALSE(BuildShardMap({Tensor("", {2})}, Servers(1), 1024, 1).ok());
  // A client that is not ours can still send any bytes: a name past the limit.
  EXPECT_THAT(BuildShardMap({Tensor(std::string(4097, 'a'), {2})}, Servers(1), 1024, 1).status().message(),
              ::testing::HasSubstr("is 4097 bytes long; at most 4096"));
  TensorSpec long_codec = Tensor("a", {2});
  long_codec.set_codec(std::string(4097, 'c'));
  EXPECT_THAT(BuildShardMap({long_codec}, Servers(1), 1024, 1).status().message(),
              ::testing::HasSubstr("codec of tensor 'a'"));
  EXPECT_FALSE(BuildShardMap({Tensor("a", {2})}, {}, 1024, 1).ok());
  TensorSpec no_dtype = Tensor("a", {2});
  no_dtype.set_dtype(DTYPE_UNSPECIFIED);
  EXPECT_FALSE(BuildShardMap({no_dtype}, Servers(1), 1024, 1).ok());
}

// Found by tests/fuzz/scheduler_fuzzer.cc: dimensions each within the limit
// whose product wraps around 64 bits were taken for a small tensor (2^32 x
// 2^32 = 0 elements: a map with no partition for it).
TEST(ShardAssignmentTest, RejectsShapesWhoseProductOverflows) {
  const int64_t big = int64_t{1} << 32;
  for (const auto& shape : {std::vector<int64_t>{big, big}, std::vector<int64_t>{int64_t{1} << 40, (1 << 24) + 1},
                            std::vector<int64_t>{1 << 21, 1 << 20}}) {
    auto map = BuildShardMap({Tensor("a", shape)}, Servers(1), 1 << 30, 1);
    ASSERT_FALSE(map.ok()) << shape[0] << "x" << shape[1];
    EXPECT_THAT(map.status().message(), ::testing::HasSubstr("too large"));
  }
}

}  // namespace
}  // namespace shardps
