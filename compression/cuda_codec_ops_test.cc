// CUDA codecs against the CPU implementation on fixed-seed data: payloads,
// decodes and the fused error-feedback residual must match bit for bit.
#include "compression/cuda_codec_ops.h"

#include <cstring>

#include "compression/codec.h"
#include "compression/codec_test_util.h"
#include "compression/error_feedback.h"
#include "gtest/gtest.h"

#if SHARDPS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace shardps::compression {
namespace {

#if SHARDPS_WITH_CUDA
// Device buffer owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes == 0 ? 4 : bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  template <typename T> T* as() { return static_cast<T*>(ptr_); }
  template <typename T> void Upload(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T> std::vector<T> Download(size_t count) {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

struct CudaRun {
  std::vector<uint8_t> payload;
  std::vector<float> decoded;
  std::vector<float> residual;
};

CudaRun RunOnDevice(const CodecParams& params, const std::vector<float>& x,
                    const std::vector<float>* residual, uint64_t seed) {
  const size_t n = x.size();
  auto codec = CreateCodec(params);
  const size_t bytes = (*codec)->EncodedBytes(n);
  auto ws_bytes = CudaWorkspaceBytes(params, n);
  EXPECT_TRUE(ws_bytes.ok()) << ws_bytes.status();
  DeviceBuffer in(n * 4), out(bytes), dec(n * 4), res(n * 4), ws(*ws_bytes);
  in.Upload(x);
  if (residual != nullptr) res.Upload(*residual);
  auto size = CudaEncode(params, in.as<float>(), n, residual ? res.as<float>() : nullptr, seed,
                         out.as<uint8_t>(), bytes, ws.as<void>(), *ws_bytes, nullptr);
  EXPECT_TRUE(size.ok()) << size.status();
  absl::Status st = CudaDecode(params, out.as<uint8_t>(), bytes, seed, dec.as<float>(), n, false,
                               ws.as<void>(), *ws_bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  CudaRun run{out.Download<uint8_t>(bytes), dec.Download<float>(n), {}};
  if (residual != nullptr) run.residual = res.Download<float>(n);
  return run;
}
#endif

class CudaCodecOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  }
};

TEST_P(CudaCodecOpsTest, EncodeAndDecodeMatchCpuBitwise) {
#if SHARDPS_WITH_CUDA
  auto params = ParseCodecSpec(GetParam());
  ASSERT_TRUE(params.ok());
  auto codec = CreateCodec(*params);
  for (size_t n : {size_t{1000}, size_t{1} << 20}) {
    const auto x = RandomGradient(n + 13, 91);
    const auto cpu = MustEncode(**codec, x, 17);
    const CudaRun gpu = RunOnDevice(*params, x, nullptr, 17);
    ASSERT_TRUE(cpu == gpu.payload) << GetParam() << " n=" << n;
    const auto cpu_decoded = MustDecode(**codec, cpu, x.size(), 17);
    ASSERT_EQ(0, std::memcmp(cpu_decoded.data(), gpu.decoded.data(), x.size() * 4)) << GetParam();
  }
#endif
}

TEST_P(CudaCodecOpsTest, FusedErrorFeedbackMatchesCpuBitwise) {
#if SHARDPS_WITH_CUDA
  auto params = ParseCodecSpec(GetParam());
  ASSERT_TRUE(params.ok());
  auto ef = ErrorFeedback::Create(*params);
  ASSERT_TRUE(ef.ok());
  const size_t n = 300007;
  std::vector<uint8_t> out((*ef)->MaxEncodedBytes(n));
  ASSERT_TRUE((*ef)->Encode(1, RandomGradient(n, 92), 3, absl::MakeSpan(out)).ok());
  const auto residual = (*ef)->Residual(1);
  const auto g = RandomGradient(n, 93);
  ASSERT_TRUE((*ef)->Encode(1, g, 4, absl::MakeSpan(out)).ok());
  const CudaRun gpu = RunOnDevice(*params, g, &residual, 4);
  ASSERT_TRUE(out == gpu.payload) << GetParam();
  const auto cpu_residual = (*ef)->Residual(1);
  ASSERT_EQ(0, std::memcmp(cpu_residual.data(), gpu.residual.data(), n * 4)) << GetParam();
#endif
}

TEST_P(CudaCodecOpsTest, MalformedPayloadIsRejectedOnDevice) {
#if SHARDPS_WITH_CUDA
  auto params = ParseCodecSpec(GetParam());
  ASSERT_TRUE(params.ok());
  const size_t n = 1000;
  auto codec = CreateCodec(*params);
  auto payload = MustEncode(**codec, RandomGradient(n, 94));
  payload.push_back(0);
  auto ws_bytes = CudaWorkspaceBytes(*params, n);
  ASSERT_TRUE(ws_bytes.ok());
  DeviceBuffer in(payload.size()), out(n * 4), ws(*ws_bytes);
  in.Upload(payload);
  out.Upload(std::vector<float>(n, 42.0f));
  EXPECT_EQ(CudaDecode(*params, in.as<uint8_t>(), payload.size(), 7, out.as<float>(), n, false,
                       ws.as<void>(), *ws_bytes, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.Download<float>(n), std::vector<float>(n, 42.0f));
#endif
}

#if SHARDPS_WITH_CUDA
// The GPU payload of `x` under `spec` equals the CPU's.
void ExpectGpuBytesEqualCpu(const char* spec, const std::vector<float>& x) {
  auto params = ParseCodecSpec(spec);
  ASSERT_TRUE(params.ok());
  auto codec = CreateCodec(*params);
  EXPECT_TRUE(MustEncode(**codec, x, 1) == RunOnDevice(*params, x, nullptr, 1).payload)
      << spec << " n=" << x.size();
}
#endif

// Many equal magnitudes around the k-th value: the GPU must break ties by
// index exactly like the CPU (smaller index first).
TEST(CudaCodecTiesTest, CudaTopKBreaksTiesByIndexLikeTheCpu) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
#if SHARDPS_WITH_CUDA
  for (size_t n : {size_t{5000}, size_t{200003}, size_t{1} << 22}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 7) - 3);
    ExpectGpuBytesEqualCpu("topk:ratio=0.01", x);
  }
#endif
}

// The onebit ballot gives the CPU's words for sizes that end mid-word.
TEST(CudaCodecTiesTest, CudaOneBitWordsMatchTheCpuForEveryTail) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
#if SHARDPS_WITH_CUDA
  for (size_t n : {size_t{1}, size_t{31}, size_t{33}, size_t{8191}, size_t{8193}, size_t{70001}}) {
    ExpectGpuBytesEqualCpu("onebit", RandomGradient(n, 95));
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CudaCodecOpsTest,
                         ::testing::Values("none", "fp16", "bf16", "2bit:threshold=0.7", "onebit",
                                           "topk:ratio=0.01", "randomk:ratio=0.05",
                                           "randomk:ratio=0.05,unbiased=0"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (!isalnum(c)) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace shardps::compression
