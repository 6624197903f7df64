// Test-only helpers shared by the local tier tests: fixed-seed gradients whose
// float sums depend on the order of the adds, and the serial device-order
// oracle every LocalReducer must match bitwise.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_TEST_DATA_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_TEST_DATA_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "worker/local_tier/local_reducer.h"

namespace shardps {

// The raw pointers of `buffers`, as the reducer's calls take them
// (T = const DeviceBuffer for inputs, DeviceBuffer for outputs).
template <typename T>
std::vector<T*> BufferPointers(const std::vector<std::unique_ptr<DeviceBuffer>>& buffers) {
  std::vector<T*> out;
  for (const auto& buffer : buffers) out.push_back(buffer.get());
  return out;
}

// D vectors of n floats from `seed`: mixed signs and magnitudes 2^-20..2^20,
// so reordering the adds changes the rounded result.
inline std::vector<std::vector<float>> RandomGradients(int d, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::uniform_int_distribution<int> mantissa(-(1 << 23), 1 << 23);
  std::vector<std::vector<float>> grads(d, std::vector<float>(n));
  for (auto& grad : grads) {
    for (float& x : grad) x = std::ldexp(static_cast<float>(mantissa(rng)), exponent(rng) - 23);
  }
  return grads;
}

// The documented order: acc = g[0][i]; acc = acc + g[d][i] for d = 1..D-1;
// then, for kAverage, acc = acc * (1.0f / float(D)).
inline std::vector<float> SerialMerge(const std::vector<std::vector<float>>& grads, size_t offset,
                                      size_t len, MergeOp op) {
  std::vector<float> out(len);
  const float scale = 1.0f / static_cast<float>(grads.size());
  for (size_t i = 0; i < len; ++i) {
    float acc = grads[0][offset + i];
    for (size_t d = 1; d < grads.size(); ++d) acc = acc + grads[d][offset + i];
    out[i] = op == MergeOp::kAverage ? acc * scale : acc;
  }
  return out;
}

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_TEST_DATA_H_
