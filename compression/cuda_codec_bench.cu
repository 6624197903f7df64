// CudaBenchCodec (declared in cuda_codec_ops.h): times the GPU codecs with CUDA
// events against a device-to-device copy of the same buffer.
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/cuda_status.h"
#include "compression/cuda_codec_ops.h"

namespace shardps::compression {
namespace {

// Device allocation freed on scope exit.
struct DeviceMemory {
  void* ptr = nullptr;
  ~DeviceMemory() { cudaFree(ptr); }
};

// Median milliseconds of `iters` runs of fn (after one warm-up run).
template <typename Fn>
absl::StatusOr<float> MedianMs(int iters, cudaEvent_t start, cudaEvent_t stop, Fn&& fn) {
  absl::Status st = fn();
  if (!st.ok()) return st;
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    st = fn();
    if (!st.ok()) return st;
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float t = 0;
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return std::max(ms[iters / 2], 1e-6f);
}

}  // namespace

absl::StatusOr<CudaCodecTiming> CudaBenchCodec(const CodecParams& params, size_t n, int iters) {
  if (iters < 1) return absl::InvalidArgumentError("iters must be >= 1");
  auto ws_bytes = CudaWorkspaceBytes(params, n);
  if (!ws_bytes.ok()) return ws_bytes.status();
  const size_t out_bytes = 4 * n + 64;  // >= every codec's payload.
  DeviceMemory in, out, copy, ws;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&in.ptr, 4 * n));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&out.ptr, out_bytes));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&copy.ptr, 4 * n));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws.ptr, *ws_bytes));
  std::vector<float> host(n);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(rng);
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(in.ptr, host.data(), 4 * n, cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  size_t payload = 0;
  auto encode = [&]() -> absl::Status {
    auto size = CudaEncode(params, static_cast<const float*>(in.ptr), n, nullptr, 42,
                           static_cast<uint8_t*>(out.ptr), out_bytes, ws.ptr, *ws_bytes, nullptr);
    payload = size.value_or(0);
    return size.status();
  };
  auto decode = [&] {
    return CudaDecode(params, static_cast<const uint8_t*>(out.ptr), payload, 42,
                      static_cast<float*>(copy.ptr), n, false, ws.ptr, *ws_bytes, nullptr);
  };
  auto memcpy_d2d = [&]() -> absl::Status {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy.ptr, in.ptr, 4 * n, cudaMemcpyDeviceToDevice));
    return absl::OkStatus();
  };
  auto enc_ms = MedianMs(iters, start, stop, encode);
  auto dec_ms = enc_ms.ok() ? MedianMs(iters, start, stop, decode) : enc_ms;
  auto copy_ms = dec_ms.ok() ? MedianMs(iters, start, stop, memcpy_d2d) : dec_ms;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!copy_ms.ok()) return copy_ms.status();
  const double gb = 4.0 * n / 1e9;
  return CudaCodecTiming{gb / (*enc_ms / 1e3), gb / (*dec_ms / 1e3), gb / (*copy_ms / 1e3)};
}

}  // namespace shardps::compression
