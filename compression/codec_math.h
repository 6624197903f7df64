// Scalar building blocks shared by the CPU kernels (.cc) and the CUDA kernels
// (.cu): float<->fp16/bf16 rounding, the 2-bit/1-bit codes, the counter-based
// PRNG behind randomk and the top-k key. Compiling the very same functions on
// host and device is what makes CPU and GPU payloads agree bit for bit.
// Internal header: plain C++17, no CUDA headers; all functions are pure and
// thread-safe.
#ifndef SHARDPS_COMPRESSION_CODEC_MATH_H_
#define SHARDPS_COMPRESSION_CODEC_MATH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SHARDPS_HD __host__ __device__ __forceinline__
#else
#define SHARDPS_HD inline
#endif

namespace shardps::compression::math {

SHARDPS_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

SHARDPS_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16, round to nearest even; NaN becomes a quiet NaN, overflow Inf.
// Branch-light so the CPU loop vectorises (after F. Giesen's float_to_half).
SHARDPS_HD uint16_t FloatToHalf(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= (143u << 23)) {  // >= 65536: overflow, Inf or NaN.
    o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < (113u << 23)) {  // Result is subnormal or zero: let the FPU round.
    const uint32_t magic = 126u << 23;  // 0.5f
    o = FloatBits(BitsFloat(x) + BitsFloat(magic)) - magic;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;
    o = x >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

SHARDPS_HD float HalfToFloat(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += static_cast<uint32_t>(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += static_cast<uint32_t>(128 - 16) << 23;  // Inf/NaN.
  } else if (exp == 0) {
    o = FloatBits(BitsFloat(o + (1u << 23)) - BitsFloat(113u << 23));  // Subnormal.
  }
  return BitsFloat(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// bfloat16, round to nearest even; NaN stays a (quiet) NaN.
SHARDPS_HD uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

SHARDPS_HD float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// 2-bit code of one value: 1 = +t, 2 = -t, 0 = zero (3 is invalid on the wire).
// REQUIRES: t > 0 (so at most one compare holds). Branch-free to vectorise.
SHARDPS_HD uint32_t TwoBitCode(float v, float t) {
  return static_cast<uint32_t>(v >= t) | (static_cast<uint32_t>(v <= -t) << 1);
}

SHARDPS_HD float TwoBitValue(uint32_t code, float t) {
  return code == 1u ? t : (code == 2u ? -t : 0.0f);
}

// Word masks: bit 2i set when slot i holds code 3 / anything.
constexpr uint32_t kLowBits = 0x55555555u;

SHARDPS_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// randomk splits [0, n) into k buckets [floor(j*n/k), floor((j+1)*n/k)) and
// picks one index per bucket with SplitMix64(seed ^ j): stratified, distinct,
// ascending, computable independently per j on any device.
// REQUIRES: 0 < k <= n <= 2^31.
SHARDPS_HD uint64_t BucketBegin(uint64_t j, uint64_t n, uint64_t k) { return j * n / k; }

SHARDPS_HD uint32_t RandomKIndex(uint64_t seed, uint64_t j, uint64_t n, uint64_t k) {
  const uint64_t begin = BucketBegin(j, n, k);
  const uint64_t size = BucketBegin(j + 1, n, k) - begin;
  return static_cast<uint32_t>(begin + SplitMix64(seed ^ (j * 0xd1b54a32d192ed03ull)) % size);
}

// Unbiased randomk scales bucket j by its size (an element is kept with
// probability 1/size).
SHARDPS_HD float RandomKScale(uint64_t j, uint64_t n, uint64_t k) {
  return static_cast<float>(BucketBegin(j + 1, n, k) - BucketBegin(j, n, k));
}

// Top-k order: larger |x| first, then lower index. The 64-bit key is unique per
// element, so "the k largest keys" is one well-defined set on every device.
SHARDPS_HD uint64_t TopKKey(float v, uint32_t index) {
  return (static_cast<uint64_t>(FloatBits(v) & 0x7fffffffu) << 32) | (0xffffffffu - index);
}

// Number of entries topk/randomk keep for n values: clamp(ceil(ratio*n), 1, n).
inline size_t SparseCount(size_t n, double ratio) {
  if (n == 0) return 0;
  double k = ratio * static_cast<double>(n);
  size_t ki = static_cast<size_t>(k);
  if (static_cast<double>(ki) < k) ++ki;
  if (ki < 1) ki = 1;
  return ki > n ? n : ki;
}

// onebit's scale is mean |x|, summed in a fixed order so that threads and the
// GPU reproduce it exactly: values are cut into blocks of kSumBlock; inside a
// block (and again over the block sums) 32 lanes sum strided elements in
// double, then the lanes fold as a warp shuffle-down tree (16, 8, 4, 2, 1).
constexpr size_t kSumLanes = 32;
constexpr size_t kSumBlock = 8192;

}  // namespace shardps::compression::math

#endif  // SHARDPS_COMPRESSION_CODEC_MATH_H_
