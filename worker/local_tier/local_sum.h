// Element-wise kernels of the CPU local reducer. Each output element is
// computed in the documented order (see local_reducer.h): float adds in input
// order, then an optional float multiply, so the vectorised code is bitwise
// equal to a plain serial loop (the build uses -ffp-contract=off).
// Stateless and thread-safe; callers split work into disjoint ranges.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_SUM_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_SUM_H_

#include <cstddef>

namespace shardps {

// out[i] = inputs[0][i] + inputs[1][i] + ... + inputs[num_inputs-1][i]
// (left to right), for i in [begin, end). REQUIRES: num_inputs >= 1; out may
// not overlap any input.
void SumInOrder(const float* const* inputs, int num_inputs, size_t begin, size_t end, float* out);

// As SumInOrder, then out[i] = out[i] * scale (one rounding per operation).
void SumInOrderAndScale(const float* const* inputs, int num_inputs, size_t begin, size_t end,
                        float scale, float* out);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_SUM_H_
