// Helpers shared by the CPU codec kernels: unaligned little-endian payload
// access and chunked parallel loops whose chunk boundaries do not depend on the
// thread count (so results are bit-identical for any parallelism). Internal.
#ifndef SHARDPS_COMPRESSION_KERNEL_UTIL_H_
#define SHARDPS_COMPRESSION_KERNEL_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "compression/kernel_thread_pool.h"

namespace shardps::compression {

// Chunk length in elements: a multiple of 32 (one onebit word) and of the
// onebit summation block, 256 KiB of fp32.
inline constexpr size_t kChunkElements = 65536;
// Inputs below this many elements (1 MiB of fp32) run on the calling thread.
inline constexpr size_t kParallelMinElements = 262144;

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }
inline void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof(v)); }

// Calls fn(begin, end) once per chunk of `chunk` elements of [0, n), in parallel
// on up to `threads` threads (0 = all) when n >= kParallelMinElements.
inline void ForEachChunk(size_t n, size_t chunk, int threads,
                         absl::FunctionRef<void(size_t, size_t)> fn) {
  const size_t num_chunks = (n + chunk - 1) / chunk;
  if (n < kParallelMinElements || threads == 1 || num_chunks <= 1) {
    for (size_t begin = 0; begin < n; begin += chunk) fn(begin, begin + chunk < n ? begin + chunk : n);
    return;
  }
  KernelThreadPool::Default().ParallelFor(num_chunks, threads, [&](size_t c) {
    const size_t begin = c * chunk;
    fn(begin, begin + chunk < n ? begin + chunk : n);
  });
}

// Packs the kBits-bit code(in[i]) of in[0, n) into 32-bit little-endian
// words: value i at bit kBits * (i % (32 / kBits)) of word i / (32 / kBits),
// unused bits of the last word 0. Codes are shifted into place in an aligned
// tile and OR-ed per word: this shape vectorises (a per-word loop does not),
// ~4x faster. The scalar definition of the 2bit and onebit encoders.
template <int kBits, typename CodeFn>
void PackCodes(const float* in, size_t n, CodeFn code, uint8_t* words) {
  constexpr size_t kPerWord = 32 / kBits;
  constexpr size_t kTile = 256;
  alignas(64) uint32_t shifted[kTile];
  alignas(64) uint32_t tile_words[kTile / kPerWord];
  for (size_t base = 0; base < n; base += kTile) {
    const size_t len = n - base < kTile ? n - base : kTile;
    for (size_t i = 0; i < len; ++i) {
      shifted[i] = static_cast<uint32_t>(code(in[base + i])) << (kBits * (i % kPerWord));
    }
    for (size_t i = len; i < kTile; ++i) shifted[i] = 0;
    for (size_t w = 0; w < kTile / kPerWord; ++w) {
      uint32_t word = 0;
      for (size_t i = 0; i < kPerWord; ++i) word |= shifted[w * kPerWord + i];
      tile_words[w] = word;
    }
    std::memcpy(words + base / kPerWord * 4, tile_words, (len + kPerWord - 1) / kPerWord * 4);
  }
}

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_KERNEL_UTIL_H_
