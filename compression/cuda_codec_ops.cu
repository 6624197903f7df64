// CUDA implementation of cuda_codec_ops.h. Every kernel computes with the
// shared functions of codec_math.h (and --fmad=false), so payloads and fused
// error-feedback residuals are bit-identical to the CPU codecs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "compression/codec_math.h"
#include "compression/cuda_codec_ops.h"

namespace shardps::compression {
namespace {

namespace m = math;
constexpr int kThreads = 256;
constexpr size_t kSamples = 4096;  // Same sampling as top_k_codec.cc.

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

unsigned GridFor(size_t items) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>((items + kThreads - 1) / kThreads, 65535)));
}

#define GRID_STRIDE(i, count) \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (count); i += size_t{gridDim.x} * blockDim.x)

// ---- dense elementwise codecs (fused error feedback when residual != null) ----

__global__ void RawEncodeKernel(const float* in, float* residual, size_t n, float* out) {
  GRID_STRIDE(i, n) {
    const float v = in[i] + residual[i];
    out[i] = v;
    residual[i] = v - v;
  }
}

template <bool kBf16>
__global__ void HalfEncodeKernel(const float* in, float* residual, size_t n, uint16_t* out) {
  GRID_STRIDE(i, n) {
    const float v = residual ? in[i] + residual[i] : in[i];
    const uint16_t h = kBf16 ? m::FloatToBf16(v) : m::FloatToHalf(v);
    out[i] = h;
    if (residual) residual[i] = v - (kBf16 ? m::Bf16ToFloat(h) : m::HalfToFloat(h));
  }
}

template <bool kBf16>
__global__ void HalfDecodeKernel(const uint16_t* in, size_t n, float* out, bool accumulate) {
  GRID_STRIDE(i, n) {
    const float v = kBf16 ? m::Bf16ToFloat(in[i]) : m::HalfToFloat(in[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

__global__ void AddKernel(const float* in, size_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = out[i] + in[i];
}

// One thread per 16-value word; word[0] of `out` is the threshold header.
__global__ void TwoBitEncodeKernel(const float* in, float* residual, size_t n, float t,
                                   uint32_t* out) {
  const size_t words = (n + 15) / 16;
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = m::FloatBits(t);
  GRID_STRIDE(w, words) {
    uint32_t word = 0;
    for (size_t i = w * 16, s = 0; i < n && s < 16; ++i, ++s) {
      const float v = residual ? in[i] + residual[i] : in[i];
      const uint32_t code = m::TwoBitCode(v, t);
      word |= code << (2 * s);
      if (residual) residual[i] = v - m::TwoBitValue(code, t);
    }
    out[1 + w] = word;
  }
}

__global__ void TwoBitDecodeKernel(const uint32_t* in, size_t n, float* out, bool accumulate) {
  const float t = m::BitsFloat(in[0]);
  GRID_STRIDE(i, n) {
    const float v = m::TwoBitValue((in[1 + i / 16] >> (2 * (i % 16))) & 3u, t);
    out[i] = accumulate ? out[i] + v : v;
  }
}

// Records the lowest invalid word (code 3 or, in the last word, padding).
__global__ void TwoBitValidateKernel(const uint32_t* in, size_t n, unsigned long long* bad) {
  const size_t words = (n + 15) / 16;
  GRID_STRIDE(w, words) {
    const uint32_t word = in[1 + w];
    bool invalid = (word & (word >> 1) & m::kLowBits) != 0;
    if (w == words - 1 && n % 16 != 0) invalid |= (word >> (2 * (n % 16))) != 0;
    if (invalid) atomicMin(bad, static_cast<unsigned long long>(w));
  }
}

// ---- onebit: fixed-order mean |v| (see codec_math.h), then pack ----

// One warp per kSumBlock values: lane l sums elements l, l+32, ... in double.
// Loads are issued kSumUnroll at a time (a kSumBlock has 256 per lane and
// there are few warps), the adds still go one by one in element order.
constexpr int kSumUnroll = 8;
__global__ void BlockAbsSumKernel(const float* __restrict__ in, const float* __restrict__ residual,
                                  size_t n, double* sums) {
  const size_t warp = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  const size_t begin = warp * m::kSumBlock;
  if (begin >= n) return;
  const size_t end = min(n, begin + m::kSumBlock);
  double acc = 0;
  size_t i = begin + lane;
  for (; i + 32 * (kSumUnroll - 1) < end; i += 32 * kSumUnroll) {
    float v[kSumUnroll];
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
      v[u] = residual ? in[i + 32 * u] + residual[i + 32 * u] : in[i + 32 * u];
    }
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) acc += fabs(static_cast<double>(v[u]));
  }
  for (; i < end; i += 32) {
    acc += fabs(static_cast<double>(residual ? in[i] + residual[i] : in[i]));
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (lane == 0) sums[warp] = acc;
}

// One warp: folds the block sums the same way and writes the scale header.
__global__ void MeanAbsKernel(const double* sums, size_t num_blocks, size_t n, uint32_t* out) {
  const unsigned lane = threadIdx.x;
  double acc = 0;
  for (size_t i = lane; i < num_blocks; i += 32) acc += fabs(sums[i]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (lane == 0) out[0] = m::FloatBits(n == 0 ? 0.0f : static_cast<float>(acc / static_cast<double>(n)));
}

// One warp per 32-value word: lane b reads value b (coalesced) and the warp
// ballot is the word (bit b = value b negative; padding lanes vote 0).
__global__ void OneBitPackKernel(const float* __restrict__ in, float* __restrict__ residual,
                                 size_t n, uint32_t* out) {
  const size_t words = (n + 31) / 32;
  const float s = m::BitsFloat(out[0]);
  const unsigned lane = threadIdx.x % 32;
  const size_t warps = size_t{gridDim.x} * blockDim.x / 32;
  // w is the same for the whole warp, so every lane reaches the ballot.
  for (size_t w = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) / 32; w < words; w += warps) {
    const size_t i = w * 32 + lane;
    bool negative = false;
    if (i < n) {
      const float v = residual ? in[i] + residual[i] : in[i];
      negative = v < 0.0f;
      if (residual) residual[i] = v - (negative ? -s : s);
    }
    const uint32_t word = __ballot_sync(0xffffffffu, negative);
    if (lane == 0) out[1 + w] = word;
  }
}

__global__ void OneBitDecodeKernel(const uint32_t* in, size_t n, float* out, bool accumulate) {
  const float s = m::BitsFloat(in[0]);
  GRID_STRIDE(i, n) {
    const float v = ((in[1 + i / 32] >> (i % 32)) & 1u) ? -s : s;
    out[i] = accumulate ? out[i] + v : v;
  }
}

// ---- randomk ----

__global__ void AccumulateKernel(const float* in, size_t n, float* residual) {
  GRID_STRIDE(i, n) residual[i] = residual[i] + in[i];
}

// src is `in`, or the residual already holding in + residual (fused).
__global__ void RandomKGatherKernel(float* src, bool fused, bool unbiased, size_t n, size_t k,
                                    uint64_t seed, float* out) {
  GRID_STRIDE(j, k) {
    const uint32_t idx = m::RandomKIndex(seed, j, n, k);
    const float v = src[idx];
    out[j] = v;
    if (fused) src[idx] = v - (0.0f + (unbiased ? v * m::RandomKScale(j, n, k) : v));
  }
}

__global__ void RandomKScatterKernel(const float* in, bool unbiased, size_t n, size_t k,
                                     uint64_t seed, float* out) {
  GRID_STRIDE(j, k) {
    const float v = in[j];
    out[m::RandomKIndex(seed, j, n, k)] += unbiased ? v * m::RandomKScale(j, n, k) : v;
  }
}

// ---- topk ----

__global__ void SampleKernel(const float* src, size_t n, uint32_t* samples) {
  GRID_STRIDE(j, kSamples) samples[j] = m::FloatBits(src[m::SplitMix64(j) % n]) & 0x7fffffffu;
}

struct AboveThreshold {
  const float* src;
  const uint32_t* threshold;
  __device__ bool operator()(uint32_t i) const {
    return (m::FloatBits(src[i]) & 0x7fffffffu) >= *threshold;
  }
};

struct AtLeastKth {
  const float* src;
  const uint64_t* kth;
  __device__ bool operator()(uint32_t i) const { return m::TopKKey(src[i], i) >= *kth; }
};

// |x| bits of each candidate: the sort key (the index rides along as value).
__global__ void KeysKernel(const float* src, const uint32_t* cand, size_t c, uint32_t* keys) {
  GRID_STRIDE(j, c) keys[j] = m::FloatBits(src[cand[j]]) & 0x7fffffffu;
}

// The k-th largest TopKKey: a stable descending sort of |x| bits over
// candidates in index order puts equal values smallest index first, which is
// TopKKey's order.
__global__ void PickKthKernel(const uint32_t* sorted_keys, const uint32_t* sorted_index, size_t k,
                              uint64_t* kth) {
  *kth = (static_cast<uint64_t>(sorted_keys[k - 1]) << 32) | (0xffffffffu - sorted_index[k - 1]);
}

__global__ void PickThresholdKernel(const uint32_t* sorted, size_t rank, uint32_t* threshold) {
  *threshold = sorted[rank];
}

// Writes count + (index, value) pairs; the fused path clears what was sent.
__global__ void TopKWriteKernel(float* src, bool fused, const uint32_t* sel, size_t k,
                                uint32_t* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = static_cast<uint32_t>(k);
  GRID_STRIDE(j, k) {
    const uint32_t idx = sel[j];
    const float v = src[idx];
    out[1 + 2 * j] = idx;
    out[2 + 2 * j] = m::FloatBits(v);
    if (fused) src[idx] = v - (0.0f + v);
  }
}

__global__ void TopKValidateKernel(const uint32_t* in, size_t count, size_t n,
                                   unsigned long long* bad) {
  GRID_STRIDE(j, count) {
    const uint32_t idx = in[1 + 2 * j];
    if (idx >= n || (j > 0 && idx <= in[1 + 2 * (j - 1)])) atomicMin(bad, static_cast<unsigned long long>(j));
  }
}

__global__ void TopKScatterKernel(const uint32_t* in, size_t count, float* out) {
  GRID_STRIDE(j, count) out[in[1 + 2 * j]] += m::BitsFloat(in[2 + 2 * j]);
}

// ---- host side ----

size_t K(const CodecParams& p, size_t n) { return m::SparseCount(n, p.ratio); }

size_t EncodedBytes(const CodecParams& p, size_t n) {
  if (p.name == "none") return 4 * n;
  if (p.name == "fp16" || p.name == "bf16") return 2 * n;
  if (p.name == "2bit") return 4 + (n + 15) / 16 * 4;
  if (p.name == "onebit") return 4 + (n + 31) / 32 * 4;
  if (p.name == "topk") return 4 + 8 * K(p, n);
  return 4 * K(p, n);  // randomk
}

size_t Align(size_t x) { return (x + 255) / 256 * 256; }

// Carves the topk workspace: fixed buffers, then cub temp storage.
struct TopKWorkspace {
  uint32_t* samples_in;
  uint32_t* samples_out;
  uint32_t* threshold;
  uint64_t* kth;
  int* num_selected;
  uint32_t* cand;
  uint32_t* sel;
  uint32_t* keys_in;
  uint32_t* keys_out;
  uint32_t* sorted_index;
  void* temp;
  size_t temp_bytes;
  size_t total;
};

absl::StatusOr<TopKWorkspace> LayoutTopK(size_t n, void* base) {
  size_t temp = 0, q = 0;
  int nn = static_cast<int>(n);
  SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
      nullptr, q, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), int{kSamples}));
  temp = std::max(temp, q);
  SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, q, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), nn, 0, 31));
  temp = std::max(temp, q);
  SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
      nullptr, q, thrust::counting_iterator<uint32_t>(0), static_cast<uint32_t*>(nullptr),
      static_cast<int*>(nullptr), nn, AboveThreshold{nullptr, nullptr}));
  temp = std::max(temp, q);
  SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
      nullptr, q, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int*>(nullptr), nn, AtLeastKth{nullptr, nullptr}));
  temp = std::max(temp, q);
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { void* r = p + off; off += Align(bytes); return r; };
  TopKWorkspace w;
  w.samples_in = static_cast<uint32_t*>(take(4 * kSamples));
  w.samples_out = static_cast<uint32_t*>(take(4 * kSamples));
  w.threshold = static_cast<uint32_t*>(take(4));
  w.kth = static_cast<uint64_t*>(take(8));
  w.num_selected = static_cast<int*>(take(8));
  w.cand = static_cast<uint32_t*>(take(4 * n));
  w.sel = static_cast<uint32_t*>(take(4 * n));
  w.keys_in = static_cast<uint32_t*>(take(4 * n));
  w.keys_out = static_cast<uint32_t*>(take(4 * n));
  w.sorted_index = static_cast<uint32_t*>(take(4 * n));
  w.temp_bytes = temp;
  w.temp = take(temp);
  w.total = off;
  return w;
}

// Candidates with |x| bits >= *threshold, in index order; returns the count.
absl::StatusOr<size_t> Gather(const float* src, size_t n, const TopKWorkspace& w, cudaStream_t s) {
  size_t temp = w.temp_bytes;
  SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
      w.temp, temp, thrust::counting_iterator<uint32_t>(0), w.cand, w.num_selected,
      static_cast<int>(n), AboveThreshold{src, w.threshold}, s));
  int count = 0;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&count, w.num_selected, sizeof(int),
                                               cudaMemcpyDeviceToHost, s));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return static_cast<size_t>(count);
}

absl::Status TopKEncode(const CodecParams& p, float* src, bool fused, size_t n, uint32_t* out,
                        void* workspace, cudaStream_t s) {
  const size_t k = K(p, n);
  if (k == 0) return CudaStatus(cudaMemsetAsync(out, 0, 4, s), "cudaMemsetAsync", __FILE__, __LINE__);
  auto layout = LayoutTopK(n, workspace);
  if (!layout.ok()) return layout.status();
  const TopKWorkspace& w = *layout;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.threshold, 0, 4, s));
  if (n > 4 * kSamples) {
    SampleKernel<<<GridFor(kSamples), kThreads, 0, s>>>(src, n, w.samples_in);
    size_t temp = w.temp_bytes;
    SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
        w.temp, temp, w.samples_in, w.samples_out, int{kSamples}, 0, 32, s));
    const double expected = static_cast<double>(kSamples) * static_cast<double>(k) / n;
    const size_t rank = std::min(kSamples - 1, static_cast<size_t>(expected * 1.5) + 32);
    PickThresholdKernel<<<1, 1, 0, s>>>(w.samples_out, rank, w.threshold);
  }
  auto count = Gather(src, n, w, s);
  if (!count.ok()) return count.status();
  if (*count < k) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.threshold, 0, 4, s));
    count = Gather(src, n, w, s);
    if (!count.ok()) return count.status();
  }
  const uint32_t* sel = w.cand;
  if (*count > k) {
    const size_t c = *count;
    KeysKernel<<<GridFor(c), kThreads, 0, s>>>(src, w.cand, c, w.keys_in);
    size_t temp = w.temp_bytes;
    // |x| < 2^31: bit 31 is always clear, so 31 key bits suffice.
    SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
        w.temp, temp, w.keys_in, w.keys_out, w.cand, w.sorted_index, static_cast<int>(c), 0, 31, s));
    PickKthKernel<<<1, 1, 0, s>>>(w.keys_out, w.sorted_index, k, w.kth);
    temp = w.temp_bytes;
    SHARDPS_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(w.temp, temp, w.cand, w.sel,
                                                       w.num_selected, static_cast<int>(c),
                                                       AtLeastKth{src, w.kth}, s));
    sel = w.sel;
  }
  TopKWriteKernel<<<GridFor(k), kThreads, 0, s>>>(src, fused, sel, k, out);
  return CudaStatus(cudaGetLastError(), "TopKWriteKernel", __FILE__, __LINE__);
}

absl::Status OneBitEncode(const float* in, float* residual, size_t n, uint32_t* out,
                          void* workspace, cudaStream_t s) {
  const size_t blocks = (n + m::kSumBlock - 1) / m::kSumBlock;
  double* sums = static_cast<double*>(workspace);
  if (blocks > 0) {
    const size_t threads = blocks * 32;
    BlockAbsSumKernel<<<(threads + kThreads - 1) / kThreads, kThreads, 0, s>>>(in, residual, n, sums);
  }
  MeanAbsKernel<<<1, 32, 0, s>>>(sums, blocks, n, out);
  OneBitPackKernel<<<GridFor((n + 31) / 32 * 32), kThreads, 0, s>>>(in, residual, n, out);
  return CudaStatus(cudaGetLastError(), "OneBitPackKernel", __FILE__, __LINE__);
}

absl::Status DenseEncode(const CodecParams& p, const float* in, float* residual, size_t n,
                         uint64_t seed, uint8_t* out, void* workspace, cudaStream_t s) {
  if (p.name == "none") {
    if (residual == nullptr) {
      SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, in, 4 * n, cudaMemcpyDeviceToDevice, s));
    } else {
      RawEncodeKernel<<<GridFor(n), kThreads, 0, s>>>(in, residual, n, reinterpret_cast<float*>(out));
    }
  } else if (p.name == "fp16") {
    HalfEncodeKernel<false><<<GridFor(n), kThreads, 0, s>>>(in, residual, n, reinterpret_cast<uint16_t*>(out));
  } else if (p.name == "bf16") {
    HalfEncodeKernel<true><<<GridFor(n), kThreads, 0, s>>>(in, residual, n, reinterpret_cast<uint16_t*>(out));
  } else if (p.name == "2bit") {
    if (p.scale > 0) {
      return absl::UnimplementedError("2bit with an adaptive threshold (scale) has no CUDA kernel yet");
    }
    TwoBitEncodeKernel<<<GridFor((n + 15) / 16), kThreads, 0, s>>>(in, residual, n, p.threshold,
                                                                  reinterpret_cast<uint32_t*>(out));
  } else if (p.name == "onebit") {
    return OneBitEncode(in, residual, n, reinterpret_cast<uint32_t*>(out), workspace, s);
  } else if (p.name == "randomk") {
    const size_t k = K(p, n);
    float* src = const_cast<float*>(in);  // Only written when fused (then src = residual).
    if (residual != nullptr) {
      AccumulateKernel<<<GridFor(n), kThreads, 0, s>>>(in, n, residual);
      src = residual;
    }
    if (k > 0) {
      RandomKGatherKernel<<<GridFor(k), kThreads, 0, s>>>(src, residual != nullptr, p.unbiased, n,
                                                          k, seed, reinterpret_cast<float*>(out));
    }
  }
  return CudaStatus(cudaGetLastError(), "encode kernel", __FILE__, __LINE__);
}

absl::Status CheckArgs(const CodecParams& p, size_t n, const void* a, const void* b) {
  if (p.name != "none" && p.name != "fp16" && p.name != "bf16" && p.name != "2bit" &&
      p.name != "onebit" && p.name != "topk" && p.name != "randomk") {
    return absl::InvalidArgumentError(absl::StrCat("unknown codec ", p.name));
  }
  if (n > (size_t{1} << 31)) return absl::InvalidArgumentError("too many values for the GPU codec");
  if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 4 != 0) {
    return absl::InvalidArgumentError("GPU codec buffers must be 4-byte aligned");
  }
  return absl::OkStatus();
}

// Copies `bytes` from the device and waits.
absl::Status Fetch(void* host, const void* device, size_t bytes, cudaStream_t s) {
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

// Runs a validation kernel writing the lowest bad position into `flag`.
template <typename Launch>
absl::Status DeviceCheck(unsigned long long* flag, cudaStream_t s, Launch&& launch,
                         const char* what) {
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0xff, sizeof(*flag), s));
  SHARDPS_CUDA_CLEAR_STALE_ERROR();
  launch();
  SHARDPS_CUDA_RETURN_IF_LAUNCH_FAILED();
  unsigned long long bad = 0;
  absl::Status st = Fetch(&bad, flag, sizeof(bad), s);
  if (!st.ok()) return st;
  if (bad != ~0ull) return absl::InvalidArgumentError(absl::StrCat(what, " at position ", bad));
  return absl::OkStatus();
}

absl::Status ValidateOnDevice(const CodecParams& p, const uint8_t* in, size_t in_bytes, size_t n,
                              void* workspace, cudaStream_t s, size_t* count) {
  const size_t want = EncodedBytes(p, n);
  auto size_error = [&](size_t expected) {
    return absl::InvalidArgumentError(absl::StrCat(p.name, " payload is ", in_bytes,
                                                   " bytes, expected ", expected, " for ", n, " values"));
  };
  auto* flag = static_cast<unsigned long long*>(workspace);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(in);
  if (p.name == "topk") {
    if (in_bytes < 4) return size_error(4);
    uint32_t c = 0;
    absl::Status st = Fetch(&c, in, 4, s);
    if (!st.ok()) return st;
    if (c > n) return absl::InvalidArgumentError(absl::StrCat("topk payload count ", c, " exceeds ", n, " values"));
    if (in_bytes != 4 + 8 * size_t{c}) return size_error(4 + 8 * size_t{c});
    *count = c;
    if (c == 0) return absl::OkStatus();
    return DeviceCheck(flag, s, [&] {
      TopKValidateKernel<<<GridFor(c), kThreads, 0, s>>>(words, c, n, flag);
    }, "topk payload index out of range or not ascending");
  }
  if (in_bytes != want) return size_error(want);
  if (p.name != "2bit" && p.name != "onebit") return absl::OkStatus();
  float header = 0;
  absl::Status st = Fetch(&header, in, 4, s);
  if (!st.ok()) return st;
  if (p.name == "onebit") {
    if (!(std::isfinite(header) && header >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("onebit payload scale must be finite and >= 0, got ", header));
    }
    uint32_t last = 0;
    if (n % 32 != 0) {
      st = Fetch(&last, in + in_bytes - 4, 4, s);
      if (!st.ok()) return st;
    }
    if ((n % 32 != 0) && (last >> (n % 32)) != 0) {
      return absl::InvalidArgumentError("onebit payload has non-zero padding bits");
    }
    return absl::OkStatus();
  }
  if (!(std::isfinite(header) && header > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("2bit payload threshold must be finite and > 0, got ", header));
  }
  if (n == 0) return absl::OkStatus();
  return DeviceCheck(flag, s, [&] {
    TwoBitValidateKernel<<<GridFor((n + 15) / 16), kThreads, 0, s>>>(words, n, flag);
  }, "2bit payload has code 3 or non-zero padding in word");
}

}  // namespace

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<size_t> CudaWorkspaceBytes(const CodecParams& params, size_t n) {
  absl::Status st = CheckArgs(params, n, nullptr, nullptr);
  if (!st.ok()) return st;
  size_t bytes = 256;  // Validation flag.
  if (params.name == "onebit") bytes = std::max(bytes, 8 * ((n + m::kSumBlock - 1) / m::kSumBlock));
  if (params.name == "topk") {
    auto layout = LayoutTopK(n, nullptr);
    if (!layout.ok()) return layout.status();
    bytes = std::max(bytes, layout->total);
  }
  return bytes;
}

absl::StatusOr<size_t> CudaEncode(const CodecParams& params, const float* in, size_t n,
                                  float* residual, uint64_t seed, uint8_t* out, size_t out_bytes,
                                  void* workspace, size_t workspace_bytes, void* stream) {
  absl::Status st = CheckArgs(params, n, in, out);
  if (!st.ok()) return st;
  const size_t bytes = EncodedBytes(params, n);
  auto need = CudaWorkspaceBytes(params, n);
  if (!need.ok()) return need.status();
  if (out_bytes < bytes || workspace_bytes < *need) {
    return absl::InvalidArgumentError(absl::StrCat("GPU encode needs ", bytes, " output and ", *need,
                                                   " workspace bytes, got ", out_bytes, " and ",
                                                   workspace_bytes));
  }
  cudaStream_t s = AsStream(stream);
  if (params.name == "topk") {
    float* src = const_cast<float*>(in);  // Never written unless fused (src = residual).
    if (residual != nullptr) {
      AccumulateKernel<<<GridFor(n), kThreads, 0, s>>>(in, n, residual);
      src = residual;
    }
    st = TopKEncode(params, src, residual != nullptr, n, reinterpret_cast<uint32_t*>(out), workspace, s);
  } else {
    st = DenseEncode(params, in, residual, n, seed, out, workspace, s);
  }
  if (!st.ok()) return st;
  return bytes;
}

absl::Status CudaDecode(const CodecParams& params, const uint8_t* in, size_t in_bytes,
                        uint64_t seed, float* out, size_t n, bool accumulate, void* workspace,
                        size_t workspace_bytes, void* stream) {
  absl::Status st = CheckArgs(params, n, in, out);
  if (!st.ok()) return st;
  if (workspace_bytes < 8) return absl::InvalidArgumentError("GPU decode needs a workspace");
  cudaStream_t s = AsStream(stream);
  size_t count = 0;
  st = ValidateOnDevice(params, in, in_bytes, n, workspace, s, &count);
  if (!st.ok()) return st;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(in);
  if (params.name == "none") {
    if (accumulate) {
      AddKernel<<<GridFor(n), kThreads, 0, s>>>(reinterpret_cast<const float*>(in), n, out);
    } else {
      SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, in, 4 * n, cudaMemcpyDeviceToDevice, s));
    }
  } else if (params.name == "fp16" || params.name == "bf16") {
    const auto* h = reinterpret_cast<const uint16_t*>(in);
    if (params.name == "fp16") HalfDecodeKernel<false><<<GridFor(n), kThreads, 0, s>>>(h, n, out, accumulate);
    else HalfDecodeKernel<true><<<GridFor(n), kThreads, 0, s>>>(h, n, out, accumulate);
  } else if (params.name == "2bit") {
    TwoBitDecodeKernel<<<GridFor(n), kThreads, 0, s>>>(words, n, out, accumulate);
  } else if (params.name == "onebit") {
    OneBitDecodeKernel<<<GridFor(n), kThreads, 0, s>>>(words, n, out, accumulate);
  } else {
    if (!accumulate) SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, 4 * n, s));
    if (params.name == "topk" && count > 0) {
      TopKScatterKernel<<<GridFor(count), kThreads, 0, s>>>(words, count, out);
    } else if (params.name == "randomk" && n > 0) {
      const size_t k = K(params, n);
      RandomKScatterKernel<<<GridFor(k), kThreads, 0, s>>>(reinterpret_cast<const float*>(in),
                                                           params.unbiased, n, k, seed, out);
    }
  }
  return CudaStatus(cudaGetLastError(), "decode kernel", __FILE__, __LINE__);
}

}  // namespace shardps::compression
