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

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_KERNEL_UTIL_H_
