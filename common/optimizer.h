// Optimizers applied by a server to one partition in a single fused pass.
//
// The update also defines the float operations the sync oracle reproduces:
// for each element, g = grad[i] * grad_scale (+ weight_decay * w[i]), then the
// rule of the configured kind. SumInRankOrder gives the aggregation order.
// Stateless apart from its config: thread-safe, state arrays belong to callers.
#ifndef SHARDPS_COMMON_OPTIMIZER_H_
#define SHARDPS_COMMON_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace shardps {

class Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);

  // Floats of optimizer state per weight: 0 (SGD), 1 (momentum, AdaGrad), 2 (Adam).
  int state_slots() const { return state_slots_; }

  // Learning rate at `step` (the number of updates applied before this one).
  float LearningRate(uint64_t step) const;

  // One update of `n` weights. `state` holds state_slots() * n floats laid
  // out slot by slot (slot k at state + k * n), zero before the first step.
  // `lr_scale` multiplies the step's learning rate (the staleness-aware
  // rate of async and ssp updates); 1 changes no bit. `skipped`: of the
  // `step` updates before this one, those that left these weights alone (a
  // frozen parameter's rounds): the learning rate follows `step`, Adam's
  // bias correction and variance freeze count step - skipped updates, as
  // torch's per-parameter step count does.
  void Apply(uint64_t step, float grad_scale, const float* grad, float* weights, float* state,
             size_t n, float lr_scale = 1.0f, uint64_t skipped = 0) const;

  // Adam with freeze_variance_after = N: true from update N on, when the
  // update is linear in the gradient: w -= lr * mhat / d with a fixed d.
  bool VarianceFrozenAt(uint64_t step) const;

  // The fixed divisor of a frozen Adam update, d[i] = sqrt(v[i] / c2) + eps,
  // or 0 where v[i] == 0 (weights the frozen update leaves alone). `state`
  // as in Apply, after at least freeze_variance_after updates.
  void FrozenDivisor(const float* state, size_t n, float* d) const;

 private:
  explicit Optimizer(const OptimizerConfig& config);
  const OptimizerConfig config_;
  const int state_slots_;
};

// acc[i] += g[i]. The aggregate of W gradients is g_0, then += g_1, ..., in
// worker-rank order in deterministic mode.
void AddInto(float* acc, const float* g, size_t n);

// Whether every one of the n floats is finite (no NaN, no Inf). One pass of
// integer operations on the bits, with no early exit, so the compiler
// vectorises it: a memory-bound read, cheaper than the optimizer pass after it.
bool AllFinite(const float* x, size_t n);
// dst[i] = a[i] + b[i], and returns AllFinite(b, n), in one pass: the sum of
// two gradients is started from both, and the second is checked by the same
// read. dst is written whatever the answer, so it must be scratch memory
// until the caller has seen true. REQUIRES: dst overlaps neither a nor b.
bool SumAndCheckFinite(float* dst, const float* a, const float* b, size_t n);
// The same for n 16-bit floats whose exponent bits are `exponent_mask`
// (0x7c00 for IEEE half, 0x7f80 for bfloat16).
bool AllFinite16(const uint16_t* x, size_t n, uint16_t exponent_mask);
// Index of the first NaN or Inf in x, or n if there is none (for errors).
size_t FirstNonFinite(const float* x, size_t n);

}  // namespace shardps

#endif  // SHARDPS_COMMON_OPTIMIZER_H_
