// MergeEncode / DecodeBroadcast on CUDA devices must give the CPU reducer's
// bytes and values exactly: the server decodes GPU payloads with the CPU
// codecs. Fixed-seed data, several rounds (so error-feedback residuals kept
// on the GPU are checked too). Skips without a GPU; with one GPU, D = 3 puts
// three logical devices on it.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/local_tier/local_encode_test_util.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {
namespace {

class CudaMergeEncodeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device (built with CUDA: " << CudaBuilt() << ")";
  }

  LocalReducerOptions Options() const {
    LocalReducerOptions options;
    if (GetParam() != "raw") {
      auto params = compression::ParseCodecSpec(GetParam());
      EXPECT_TRUE(params.ok()) << params.status();
      options.push_codec = options.pull_codec = *params;
      options.error_feedback = true;
    }
    return options;
  }
};

TEST_P(CudaMergeEncodeTest, CudaPayloadsAreTheCpuBytesOverRounds) {
  const size_t n = 70001;
  auto grads = RandomGradients(3, n, 21);
  EncodeTier cpu, gpu;
  ASSERT_TRUE(cpu.Init(DeviceKind::kCpu, grads, Options()).ok());
  absl::Status made = gpu.Init(DeviceKind::kCuda, grads, Options());
  ASSERT_TRUE(made.ok()) << made;
  for (uint64_t round = 0; round < 3; ++round) {
    grads = RandomGradients(3, n, 300 + round);
    ASSERT_TRUE(cpu.SetContents(grads).ok());
    ASSERT_TRUE(gpu.SetContents(grads).ok());
    for (MergeOp op : {MergeOp::kAverage, MergeOp::kSum}) {
      auto want = cpu.Encode(ThreeRanges(n, round), op);
      auto got = gpu.Encode(ThreeRanges(n, round), op);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), want->size());
      for (size_t i = 0; i < want->size(); ++i) {
        EXPECT_TRUE((*got)[i] == (*want)[i]) << "round " << round << " range " << i;
      }
    }
  }
}

TEST_P(CudaMergeEncodeTest, CudaDecodeBroadcastGivesTheCpuValues) {
  const size_t n = 40000, offset = 1000, len = 33333;
  const auto start = RandomGradients(1, n, 5)[0];
  const std::vector<std::vector<float>> same = {start, start, start};
  EncodeTier source, cpu, gpu;
  ASSERT_TRUE(source.Init(DeviceKind::kCpu, RandomGradients(2, n, 6), Options()).ok());
  ASSERT_TRUE(cpu.Init(DeviceKind::kCpu, same, Options()).ok());
  absl::Status made = gpu.Init(DeviceKind::kCuda, same, Options());
  ASSERT_TRUE(made.ok()) << made;
  auto payloads = source.Encode({{{}, offset, len, 77, 0}});
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  for (bool accumulate : {true, false}) {
    auto cpu_out = cpu.raw_buffers();
    auto gpu_out = gpu.raw_buffers();
    ASSERT_TRUE(cpu.reducer().DecodeBroadcast((*payloads)[0], 77, len, accumulate, absl::MakeSpan(cpu_out), offset).ok());
    absl::Status s = gpu.reducer().DecodeBroadcast((*payloads)[0], 77, len, accumulate, absl::MakeSpan(gpu_out), offset);
    ASSERT_TRUE(s.ok()) << s;
    for (int d = 0; d < 3; ++d) {
      EXPECT_TRUE(gpu.Contents(d) == cpu.Contents(0)) << "device " << d << " accumulate " << accumulate;
    }
  }
}

TEST_P(CudaMergeEncodeTest, CudaMalformedPullPayloadChangesNothing) {
  const auto start = RandomGradients(1, 4096, 5)[0];
  EncodeTier gpu;
  absl::Status made = gpu.Init(DeviceKind::kCuda, {start, start}, Options());
  ASSERT_TRUE(made.ok()) << made;
  const std::vector<uint8_t> bad(3, 0xff);
  auto outputs = gpu.raw_buffers();
  absl::Status s = gpu.reducer().DecodeBroadcast(bad, 0, 4096, false, absl::MakeSpan(outputs), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (int d = 0; d < 2; ++d) EXPECT_TRUE(gpu.Contents(d) == start);
}

INSTANTIATE_TEST_SUITE_P(Codecs, CudaMergeEncodeTest,
                         ::testing::Values("raw", "none", "fp16", "bf16", "2bit", "onebit",
                                           "topk:ratio=0.01", "randomk:ratio=0.05"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace shardps
