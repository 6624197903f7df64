// CUDA local tier tests: results must equal the CPU reducer's on fixed-seed
// data. Every test skips cleanly when there is no GPU (or no CUDA in the
// build). With one GPU, D > 1 is exercised by several devices on that GPU.
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/local_tier/device_cuda.h"
#include "worker/local_tier/local_reducer.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {
namespace {

class CudaLocalReducerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = CudaDeviceCount();
    if (gpus_ == 0) GTEST_SKIP() << "no CUDA device (built with CUDA: " << CudaBuilt() << ")";
  }

  // D CUDA devices, round-robin over the GPUs, holding `grads`.
  void MakeTier(const std::vector<std::vector<float>>& grads, LocalReducerOptions options = {}) {
    std::vector<Device*> raw;
    for (size_t d = 0; d < grads.size(); ++d) {
      auto device = CreateCudaDevice(static_cast<int>(d) % gpus_, static_cast<int>(d));
      ASSERT_TRUE(device.ok()) << device.status();
      auto buffer = (*device)->Allocate(grads[d].size());
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      ASSERT_TRUE((*buffer)->CopyFromHost(grads[d]).ok());
      raw.push_back(device->get());
      devices_.push_back(std::move(*device));
      buffers_.push_back(std::move(*buffer));
    }
    auto reducer = LocalReducer::Create(raw, options);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    reducer_ = std::move(*reducer);
  }

  std::vector<const DeviceBuffer*> inputs() const { return BufferPointers<const DeviceBuffer>(buffers_); }
  std::vector<DeviceBuffer*> outputs() const { return BufferPointers<DeviceBuffer>(buffers_); }

  int gpus_ = 0;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;  // Destroyed before devices_.
  std::unique_ptr<LocalReducer> reducer_;
};

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(CudaLocalReducerTest, CudaMergeIsBitwiseEqualToCpuOrder) {
  for (int d : {1, 2, 3, 5, 8}) {
    for (size_t n : {size_t{1}, size_t{1023}, (size_t{1} << 20) + 3}) {
      const auto grads = RandomGradients(d, n, 42 + d);
      reducer_.reset();  // a reducer borrows its devices: it goes first
      buffers_.clear();
      devices_.clear();
      MakeTier(grads);
      std::vector<float> out(n);
      for (MergeOp op : {MergeOp::kSum, MergeOp::kAverage}) {
        ASSERT_TRUE(reducer_->Merge(inputs(), 0, absl::MakeSpan(out), op).ok());
        EXPECT_TRUE(BitwiseEqual(out, SerialMerge(grads, 0, n, op)))
            << "D=" << d << " n=" << n << " op=" << static_cast<int>(op);
      }
    }
  }
}

TEST_F(CudaLocalReducerTest, CudaSubRangeMergeAndBroadcast) {
  const auto grads = RandomGradients(3, 100003, 11);
  MakeTier(grads);
  std::vector<float> out(50000);
  ASSERT_TRUE(reducer_->Merge(inputs(), 777, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitwiseEqual(out, SerialMerge(grads, 777, out.size(), MergeOp::kSum)));
  ASSERT_TRUE(reducer_->Broadcast(out, outputs(), 1000).ok());
  for (size_t d = 0; d < grads.size(); ++d) {
    std::vector<float> want = grads[d], got(want.size());
    std::copy(out.begin(), out.end(), want.begin() + 1000);
    ASSERT_TRUE(buffers_[d]->CopyToHost(0, absl::MakeSpan(got)).ok());
    EXPECT_TRUE(BitwiseEqual(got, want)) << d;
  }
}

TEST_F(CudaLocalReducerTest, CudaBufferRoundTripsAndCopiesBetweenDevices) {
  MakeTier(RandomGradients(2, 4099, 3));
  std::vector<float> a(4099), b(4099);
  ASSERT_TRUE(buffers_[1]->CopyFrom(*buffers_[0]).ok());
  ASSERT_TRUE(buffers_[0]->CopyToHost(0, absl::MakeSpan(a)).ok());
  ASSERT_TRUE(buffers_[1]->CopyToHost(0, absl::MakeSpan(b)).ok());
  EXPECT_TRUE(BitwiseEqual(a, b));
}

#if defined(SHARDPS_WITH_NCCL)
TEST_F(CudaLocalReducerTest, CudaNcclMergeMatchesCpuWithinRounding) {
  if (gpus_ < 2) GTEST_SKIP() << "NCCL path needs two distinct GPUs";
  const int d = gpus_ < 4 ? gpus_ : 4;
  const auto grads = RandomGradients(d, 65537, 21);
  LocalReducerOptions options;
  options.use_nccl = true;
  MakeTier(grads, options);
  std::vector<float> out(65537);
  ASSERT_TRUE(reducer_->Merge(inputs(), 0, absl::MakeSpan(out)).ok());
  const auto want = SerialMerge(grads, 0, out.size(), MergeOp::kSum);
  for (size_t i = 0; i < out.size(); ++i) {
    float bound = 0;
    for (const auto& g : grads) bound += std::abs(g[i]);
    ASSERT_NEAR(out[i], want[i], bound * 1e-6f) << i;
  }
}
#endif

}  // namespace
}  // namespace shardps
