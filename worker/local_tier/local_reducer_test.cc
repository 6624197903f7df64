#include "worker/local_tier/local_reducer.h"

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {
namespace {

// D CPU devices holding the given gradients, and a reducer over them.
class CpuTier {
 public:
  explicit CpuTier(const std::vector<std::vector<float>>& grads, int threads = 0) {
    auto devices = CreateDevices("cpu:" + std::to_string(grads.size()));
    CHECK_OK_OR_DIE(devices.status());
    devices_ = std::move(*devices);
    std::vector<Device*> raw;
    for (size_t d = 0; d < grads.size(); ++d) {
      raw.push_back(devices_[d].get());
      auto buffer = devices_[d]->Allocate(grads[d].size());
      CHECK_OK_OR_DIE(buffer.status());
      CHECK_OK_OR_DIE((*buffer)->CopyFromHost(grads[d]));
      buffers_.push_back(std::move(*buffer));
    }
    LocalReducerOptions options;
    options.num_threads = threads;
    auto reducer = LocalReducer::Create(raw, options);
    CHECK_OK_OR_DIE(reducer.status());
    reducer_ = std::move(*reducer);
  }

  LocalReducer& reducer() { return *reducer_; }
  std::vector<const DeviceBuffer*> inputs() const { return BufferPointers<const DeviceBuffer>(buffers_); }
  std::vector<DeviceBuffer*> outputs() const { return BufferPointers<DeviceBuffer>(buffers_); }
  std::vector<float> Contents(int d) const {
    std::vector<float> out(buffers_[d]->size());
    CHECK_OK_OR_DIE(buffers_[d]->CopyToHost(0, absl::MakeSpan(out)));
    return out;
  }

 private:
  // Setup failures are bugs in the test environment: stop at once.
  static void CHECK_OK_OR_DIE(const absl::Status& status) {
    if (status.ok()) return;
    std::cerr << "test setup failed: " << status << "\n";
    std::abort();
  }

  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::unique_ptr<LocalReducer> reducer_;
};

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CpuMergeTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(CpuMergeTest, SumAndAverageAreBitwiseEqualToSerialDeviceOrderLoop) {
  const auto [d, n] = GetParam();
  const auto grads = RandomGradients(d, n, 1234 + d);
  CpuTier tier(grads);
  std::vector<float> out(n);
  for (MergeOp op : {MergeOp::kSum, MergeOp::kAverage}) {
    ASSERT_TRUE(tier.reducer().Merge(tier.inputs(), 0, absl::MakeSpan(out), op).ok());
    EXPECT_TRUE(BitwiseEqual(out, SerialMerge(grads, 0, n, op))) << "op " << static_cast<int>(op);
  }
}

TEST_P(CpuMergeTest, BroadcastWritesTheBufferToEveryDevice) {
  const auto [d, n] = GetParam();
  CpuTier tier(RandomGradients(d, n, 99));
  const std::vector<float> weights = RandomGradients(1, n, 7)[0];
  ASSERT_TRUE(tier.reducer().Broadcast(weights, tier.outputs(), 0).ok());
  for (int i = 0; i < d; ++i) EXPECT_TRUE(BitwiseEqual(tier.Contents(i), weights)) << i;
}

INSTANTIATE_TEST_SUITE_P(DevicesAndOddSizes, CpuMergeTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(size_t{1}, size_t{7}, size_t{1023},
                                                              (size_t{1} << 20) + 3)));

TEST(CpuLocalReducerTest, SubRangeMergeReadsOnlyThatRange) {
  const auto grads = RandomGradients(3, 70001, 5);
  CpuTier tier(grads);
  std::vector<float> out(40000);
  ASSERT_TRUE(tier.reducer().Merge(tier.inputs(), 12345, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitwiseEqual(out, SerialMerge(grads, 12345, out.size(), MergeOp::kSum)));
}

TEST(CpuLocalReducerTest, SubRangeBroadcastLeavesTheRestUntouched) {
  const auto grads = RandomGradients(2, 1000, 6);
  CpuTier tier(grads);
  const std::vector<float> part(100, 3.5f);
  ASSERT_TRUE(tier.reducer().Broadcast(part, tier.outputs(), 450).ok());
  for (int d = 0; d < 2; ++d) {
    std::vector<float> want = grads[d];
    std::copy(part.begin(), part.end(), want.begin() + 450);
    EXPECT_TRUE(BitwiseEqual(tier.Contents(d), want)) << d;
  }
}

TEST(CpuLocalReducerTest, ResultDoesNotDependOnThreadCount) {
  const auto grads = RandomGradients(5, 300007, 8);
  std::vector<float> one(300007), three(300007);
  CpuTier serial(grads, 1), parallel(grads, 3);
  ASSERT_TRUE(serial.reducer().Merge(serial.inputs(), 0, absl::MakeSpan(one)).ok());
  ASSERT_TRUE(parallel.reducer().Merge(parallel.inputs(), 0, absl::MakeSpan(three)).ok());
  EXPECT_TRUE(BitwiseEqual(one, three));
}

TEST(CpuLocalReducerTest, WrongBufferCountIsInvalidArgument) {
  CpuTier tier(RandomGradients(3, 10, 1));
  auto inputs = tier.inputs();
  inputs.pop_back();
  std::vector<float> out(10);
  EXPECT_EQ(tier.reducer().Merge(inputs, 0, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuLocalReducerTest, BufferOnAnotherDeviceIsInvalidArgument) {
  CpuTier tier(RandomGradients(2, 10, 1));
  auto inputs = tier.inputs();
  std::swap(inputs[0], inputs[1]);
  std::vector<float> out(10);
  absl::Status status = tier.reducer().Merge(inputs, 0, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("cpu:0"));
}

TEST(CpuLocalReducerTest, RangePastTheBufferEndIsInvalidArgument) {
  CpuTier tier(RandomGradients(2, 10, 1));
  std::vector<float> out(4);
  EXPECT_EQ(tier.reducer().Merge(tier.inputs(), 7, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tier.reducer().Broadcast(out, tier.outputs(), 8).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalReducerTest, EmptyDeviceListIsInvalidArgument) {
  EXPECT_EQ(LocalReducer::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardps
