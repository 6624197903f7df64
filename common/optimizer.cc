#include "common/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "common/config.h"

namespace shardps {
namespace {

int SlotsFor(OptimizerConfig::Kind kind) {
  switch (kind) {
    case OptimizerConfig::SGD: return 0;
    case OptimizerConfig::MOMENTUM:
    case OptimizerConfig::ADAGRAD: return 1;
    case OptimizerConfig::ADAM: return 2;
    default: return 0;
  }
}

// An all-ones exponent (Inf or NaN) plus one exponent step carries into
// bit 31; every finite exponent stays below it.
inline uint32_t NonFiniteCarry(uint32_t bits) { return (bits & 0x7f800000u) + 0x00800000u; }
constexpr uint32_t kNonFiniteBit = 0x80000000u;

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config) : config_(config), state_slots_(SlotsFor(config.kind())) {}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config) {
  ClusterConfig wrapper;
  *wrapper.mutable_optimizer() = config;
  if (absl::Status s = ValidateConfig(wrapper); !s.ok()) return s;
  return std::unique_ptr<Optimizer>(new Optimizer(config));
}

float Optimizer::LearningRate(uint64_t step) const {
  const float lr = config_.learning_rate();
  const LearningRateSchedule& s = config_.schedule();
  switch (s.kind()) {
    case LearningRateSchedule::STEP:
      return lr * std::pow(s.gamma(), static_cast<float>(step / s.step_size()));
    case LearningRateSchedule::COSINE: {
      double t = static_cast<double>(std::min(step, s.total_steps())) / s.total_steps();
      return static_cast<float>(s.min_lr() + (lr - s.min_lr()) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
    }
    default:
      return lr;
  }
}

void Optimizer::Apply(uint64_t step, float grad_scale, const float* __restrict grad,
                      float* __restrict w, float* __restrict state, size_t n, float lr_scale,
                      uint64_t skipped) const {
  // lr_scale 1 leaves lr's bits unchanged (x * 1.0f == x).
  const float lr = LearningRate(step) * lr_scale;
  const float wd = config_.weight_decay();
  switch (config_.kind()) {
    case OptimizerConfig::SGD:
      for (size_t i = 0; i < n; ++i) {
        float g = grad[i] * grad_scale + wd * w[i];
        w[i] -= lr * g;
      }
      break;
    case OptimizerConfig::MOMENTUM: {
      const float mu = config_.momentum();
      float* __restrict v = state;
      if (config_.nesterov()) {
        for (size_t i = 0; i < n; ++i) {
          float g = grad[i] * grad_scale + wd * w[i];
          v[i] = mu * v[i] + g;
          w[i] -= lr * (g + mu * v[i]);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          float g = grad[i] * grad_scale + wd * w[i];
          v[i] = mu * v[i] + g;
          w[i] -= lr * v[i];
        }
      }
      break;
    }
    case OptimizerConfig::ADAGRAD: {
      const float eps = config_.epsilon();
      float* __restrict acc = state;
      for (size_t i = 0; i < n; ++i) {
        float g = grad[i] * grad_scale + wd * w[i];
        acc[i] += g * g;
        w[i] -= lr * g / (std::sqrt(acc[i]) + eps);
      }
      break;
    }
    case OptimizerConfig::ADAM: {
      const float b1 = config_.beta1(), b2 = config_.beta2(), eps = config_.epsilon();
      const uint64_t own = step - std::min(skipped, step);  // updates these weights took
      const float t = static_cast<float>(own + 1);
      const float c1 = 1.0f - std::pow(b1, t);
      float* __restrict m = state;
      float* __restrict v = state + n;
      const uint64_t freeze = config_.freeze_variance_after();
      if (freeze > 0 && own >= freeze) {
        // v as it was after `freeze` updates, with that step's bias correction.
        // A weight whose gradient was exactly zero all along (v == 0, e.g.
        // fed by an always-blank input) stays put: a sign codec would
        // otherwise hand it +-scale and divide that by epsilon.
        const float c2 = 1.0f - std::pow(b2, static_cast<float>(freeze));
        for (size_t i = 0; i < n; ++i) {
          float g = grad[i] * grad_scale + wd * w[i];
          m[i] = b1 * m[i] + (1.0f - b1) * g;
          if (v[i] > 0.0f) w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
        }
        break;
      }
      const float c2 = 1.0f - std::pow(b2, t);
      for (size_t i = 0; i < n; ++i) {
        float g = grad[i] * grad_scale + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
      break;
    }
    default:
      break;
  }
}

bool Optimizer::VarianceFrozenAt(uint64_t step) const {
  const uint64_t freeze = config_.freeze_variance_after();
  return config_.kind() == OptimizerConfig::ADAM && freeze > 0 && step >= freeze;
}

void Optimizer::FrozenDivisor(const float* state, size_t n, float* d) const {
  const float c2 = 1.0f - std::pow(config_.beta2(), static_cast<float>(config_.freeze_variance_after()));
  const float eps = config_.epsilon();
  const float* v = state + n;
  for (size_t i = 0; i < n; ++i) d[i] = v[i] > 0.0f ? std::sqrt(v[i] / c2) + eps : 0.0f;
}

void AddInto(float* __restrict acc, const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += g[i];
}

bool AllFinite(const float* x, size_t n) {
  uint32_t carry = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    carry |= NonFiniteCarry(bits);
  }
  return (carry & kNonFiniteBit) == 0;
}

bool SumAndCheckFinite(float* __restrict dst, const float* __restrict a, const float* __restrict b, size_t n) {
  uint32_t carry = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, b + i, sizeof(bits));
    carry |= NonFiniteCarry(bits);
    dst[i] = a[i] + b[i];
  }
  return (carry & kNonFiniteBit) == 0;
}

bool AllFinite16(const uint16_t* x, size_t n, uint16_t exponent_mask) {
  const uint32_t mask = exponent_mask, step = mask & (~mask + 1);  // lowest exponent bit
  uint32_t carry = 0;
  for (size_t i = 0; i < n; ++i) carry |= (x[i] & mask) + step;
  return (carry & 0x8000u) == 0;
}

size_t FirstNonFinite(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return n;
}

}  // namespace shardps
