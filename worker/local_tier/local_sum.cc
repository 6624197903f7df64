#include "worker/local_tier/local_sum.h"

#include <cstring>

namespace shardps {
namespace {

// 4 floats: one SSE register (the x86-64 baseline). Loads and stores go
// through memcpy, so no alignment is assumed.
typedef float Vec4 __attribute__((vector_size(16)));
constexpr size_t kLanes = 4;
constexpr int kAccumulators = 8;  // Independent adds in flight per block.
constexpr size_t kBlock = kAccumulators * kLanes;

inline Vec4 Load(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void Store(float* p, Vec4 v) { std::memcpy(p, &v, sizeof(v)); }

// Sums the kBlock floats at `i`, adding inputs in order; kScale adds the
// final multiply. Each lane is an independent element, so this is the serial
// per-element order.
template <bool kScale>
inline void SumBlock(const float* const* in, int n, size_t i, float scale, float* out) {
  Vec4 acc[kAccumulators];
  for (int k = 0; k < kAccumulators; ++k) acc[k] = Load(in[0] + i + k * kLanes);
  for (int d = 1; d < n; ++d) {
    const float* p = in[d] + i;
    for (int k = 0; k < kAccumulators; ++k) acc[k] += Load(p + k * kLanes);
  }
  for (int k = 0; k < kAccumulators; ++k)
    Store(out + i + k * kLanes, kScale ? acc[k] * scale : acc[k]);
}

template <bool kScale>
void Sum(const float* const* in, int n, size_t begin, size_t end, float scale, float* out) {
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) SumBlock<kScale>(in, n, i, scale, out);
  for (; i < end; ++i) {
    float acc = in[0][i];
    for (int d = 1; d < n; ++d) acc += in[d][i];
    out[i] = kScale ? acc * scale : acc;
  }
}

}  // namespace

void SumInOrder(const float* const* inputs, int num_inputs, size_t begin, size_t end, float* out) {
  Sum<false>(inputs, num_inputs, begin, end, 1.0f, out);
}

void SumInOrderAndScale(const float* const* inputs, int num_inputs, size_t begin, size_t end,
                        float scale, float* out) {
  Sum<true>(inputs, num_inputs, begin, end, scale, out);
}

}  // namespace shardps
