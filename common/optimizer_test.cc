#include "common/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace shardps {
namespace {

std::unique_ptr<Optimizer> Make(OptimizerConfig c) {
  auto o = Optimizer::Create(c);
  EXPECT_TRUE(o.ok()) << o.status();
  return *std::move(o);
}

OptimizerConfig Kind(OptimizerConfig::Kind kind, float lr) {
  OptimizerConfig c;
  c.set_kind(kind);
  c.set_learning_rate(lr);
  return c;
}

TEST(OptimizerTest, SgdWithWeightDecayAndGradScale) {
  OptimizerConfig c = Kind(OptimizerConfig::SGD, 0.1f);
  c.set_weight_decay(0.5f);
  auto opt = Make(c);
  float w[2] = {1.0f, -2.0f}, g[2] = {4.0f, 2.0f};
  opt->Apply(0, 0.5f, g, w, nullptr, 2);
  // g' = g*0.5 + 0.5*w = {2.5, 0}; w -= 0.1*g'
  EXPECT_FLOAT_EQ(w[0], 0.75f);
  EXPECT_FLOAT_EQ(w[1], -2.0f);
}

TEST(OptimizerTest, MomentumAccumulatesVelocity) {
  OptimizerConfig c = Kind(OptimizerConfig::MOMENTUM, 0.1f);
  c.set_momentum(0.9f);
  auto opt = Make(c);
  float w = 1.0f, g = 1.0f, v = 0.0f;
  opt->Apply(0, 1.0f, &g, &w, &v, 1);  // v=1, w=0.9
  opt->Apply(1, 1.0f, &g, &w, &v, 1);  // v=1.9, w=0.71
  EXPECT_FLOAT_EQ(v, 1.9f);
  EXPECT_FLOAT_EQ(w, 0.71f);
}

TEST(OptimizerTest, NesterovLooksAhead) {
  OptimizerConfig c = Kind(OptimizerConfig::MOMENTUM, 0.1f);
  c.set_momentum(0.9f);
  c.set_nesterov(true);
  auto opt = Make(c);
  float w = 1.0f, g = 1.0f, v = 0.0f;
  opt->Apply(0, 1.0f, &g, &w, &v, 1);  // v=1, w = 1 - 0.1*(1+0.9) = 0.81
  EXPECT_FLOAT_EQ(w, 0.81f);
}

TEST(OptimizerTest, AdamFirstStepMovesByLearningRate) {
  auto opt = Make(Kind(OptimizerConfig::ADAM, 0.01f));
  EXPECT_EQ(opt->state_slots(), 2);
  float w = 1.0f, g = 3.0f, state[2] = {0, 0};
  opt->Apply(0, 1.0f, &g, &w, state, 1);
  // m=0.3, v=0.009; mhat=3, vhat=9 -> step = 0.01*3/(3+1e-8)
  EXPECT_NEAR(w, 0.99f, 1e-6);
  EXPECT_FLOAT_EQ(state[0], 0.3f);
  EXPECT_NEAR(state[1], 0.009f, 1e-6);  // (1 - 0.999f) rounds in float
}

TEST(OptimizerTest, AdamFrozenVarianceStopsChangingAndZeroVarianceWeightsStay) {
  OptimizerConfig c = Kind(OptimizerConfig::ADAM, 0.01f);
  c.set_freeze_variance_after(2);
  auto opt = Make(c);
  // Slot layout for n = 2: m0 m1 v0 v1. Weight 1 never sees a gradient.
  float w[2] = {1.0f, 1.0f}, state[4] = {0, 0, 0, 0};
  float g[2] = {3.0f, 0.0f};
  opt->Apply(0, 1.0f, g, w, state, 2);
  opt->Apply(1, 1.0f, g, w, state, 2);
  const float v_frozen = state[2];
  EXPECT_GT(v_frozen, 0.0f);
  const float w_before = w[0], m_before = state[0];
  float g2[2] = {-5.0f, 7.0f};  // weight 1's first gradient comes after the freeze
  opt->Apply(2, 1.0f, g2, w, state, 2);
  EXPECT_EQ(state[2], v_frozen);
  EXPECT_EQ(state[3], 0.0f);
  const float m = 0.9f * m_before + (1.0f - 0.9f) * -5.0f;
  EXPECT_FLOAT_EQ(state[0], m);
  const float c1 = 1.0f - std::pow(0.9f, 3.0f), c2 = 1.0f - std::pow(0.999f, 2.0f);
  EXPECT_FLOAT_EQ(w[0], w_before - 0.01f * (m / c1) / (std::sqrt(v_frozen / c2) + 1e-8f));
  EXPECT_EQ(w[1], 1.0f);  // v == 0: dividing a gradient by epsilon would throw it away
}

TEST(OptimizerTest, AdamBeforeTheFreezeIsPlainAdam) {
  OptimizerConfig frozen = Kind(OptimizerConfig::ADAM, 0.01f);
  frozen.set_freeze_variance_after(5);
  auto a = Make(frozen);
  auto b = Make(Kind(OptimizerConfig::ADAM, 0.01f));
  float wa = 1.0f, wb = 1.0f, sa[2] = {0, 0}, sb[2] = {0, 0};
  for (uint64_t step = 0; step < 5; ++step) {
    float g = 1.0f + static_cast<float>(step);
    a->Apply(step, 0.5f, &g, &wa, sa, 1);
    b->Apply(step, 0.5f, &g, &wb, sb, 1);
  }
  EXPECT_EQ(wa, wb);
  EXPECT_EQ(sa[1], sb[1]);
}

TEST(OptimizerTest, AdagradScalesByAccumulatedSquares) {
  OptimizerConfig c = Kind(OptimizerConfig::ADAGRAD, 0.5f);
  c.set_epsilon(1e-10f);
  auto opt = Make(c);
  float w = 0.0f, g = 2.0f, acc = 0.0f;
  opt->Apply(0, 1.0f, &g, &w, &acc, 1);  // acc=4, w=-0.5*2/2
  EXPECT_FLOAT_EQ(acc, 4.0f);
  EXPECT_FLOAT_EQ(w, -0.5f);
  opt->Apply(1, 1.0f, &g, &w, &acc, 1);  // acc=8, w -= 0.5*2/sqrt(8)
  EXPECT_NEAR(w, -0.5f - 1.0f / std::sqrt(8.0f), 1e-6);
}

TEST(OptimizerTest, StepAndCosineSchedules) {
  OptimizerConfig c = Kind(OptimizerConfig::SGD, 1.0f);
  c.mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  c.mutable_schedule()->set_step_size(10);
  c.mutable_schedule()->set_gamma(0.5f);
  auto step = Make(c);
  EXPECT_FLOAT_EQ(step->LearningRate(9), 1.0f);
  EXPECT_FLOAT_EQ(step->LearningRate(10), 0.5f);
  EXPECT_FLOAT_EQ(step->LearningRate(25), 0.25f);
  c.mutable_schedule()->set_kind(LearningRateSchedule::COSINE);
  c.mutable_schedule()->set_total_steps(100);
  c.mutable_schedule()->set_min_lr(0.0f);
  auto cosine = Make(c);
  EXPECT_FLOAT_EQ(cosine->LearningRate(0), 1.0f);
  EXPECT_NEAR(cosine->LearningRate(50), 0.5f, 1e-6);
  EXPECT_NEAR(cosine->LearningRate(100), 0.0f, 1e-6);
  EXPECT_NEAR(cosine->LearningRate(500), 0.0f, 1e-6);
}

TEST(OptimizerTest, RejectsInvalidConfig) {
  EXPECT_FALSE(Optimizer::Create(Kind(OptimizerConfig::SGD, 0.0f)).ok());
  OptimizerConfig c = Kind(OptimizerConfig::ADAM, 0.1f);
  c.set_beta2(1.0f);
  EXPECT_FALSE(Optimizer::Create(c).ok());
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST(AllFiniteTest, FindsNanAndInfAnywhere) {
  std::vector<float> x(1027, 1.5f);
  x[5] = -std::numeric_limits<float>::max();
  x[6] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(AllFinite(x.data(), x.size()));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, size_t{513}, x.size() - 1}) {
      std::vector<float> y = x;
      y[at] = bad;
      EXPECT_FALSE(AllFinite(y.data(), y.size())) << bad << " at " << at;
      EXPECT_EQ(FirstNonFinite(y.data(), y.size()), at);
    }
  }
  EXPECT_EQ(FirstNonFinite(x.data(), x.size()), x.size());
}

TEST(AllFiniteTest, SumAndCheckSumsAsAddIntoDoesAndChecksTheSecond) {
  std::vector<float> a(1027), b(1027);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::ldexp(static_cast<float>(i) - 500.5f, static_cast<int>(i % 200) - 100);
    b[i] = std::ldexp(static_cast<float>(i % 37) - 18.25f, static_cast<int>(i % 150) - 75);
  }
  std::vector<float> want = a;
  AddInto(want.data(), b.data(), b.size());
  std::vector<float> out(a.size(), 7.0f);
  EXPECT_TRUE(SumAndCheckFinite(out.data(), a.data(), b.data(), a.size()));
  EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, size_t{513}, b.size() - 1}) {
      std::vector<float> y = b;
      y[at] = bad;
      EXPECT_FALSE(SumAndCheckFinite(out.data(), a.data(), y.data(), y.size())) << bad << " at " << at;
    }
  }
  // Only the second is checked: the first was, when it arrived.
  std::vector<float> nan_first = a;
  nan_first[9] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(SumAndCheckFinite(out.data(), nan_first.data(), b.data(), b.size()));
}

TEST(AllFiniteTest, SixteenBitFloats) {
  // fp16: 0x3c00 = 1, 0x7bff = max finite, 0x7c00 = Inf, 0xfe00 = NaN.
  std::vector<uint16_t> half = {0x3c00, 0x7bff, 0xfbff, 0x0001, 0x3c00};
  EXPECT_TRUE(AllFinite16(half.data(), half.size(), 0x7c00));
  for (uint16_t bad : {0x7c00, 0xfc00, 0xfe00}) {
    half[4] = bad;
    EXPECT_FALSE(AllFinite16(half.data(), half.size(), 0x7c00)) << bad;
  }
  // bf16: 0x3f80 = 1, 0x7f7f = max finite, 0x7f80 = Inf, 0x7fc0 = NaN.
  std::vector<uint16_t> bf = {0x3f80, 0x7f7f, 0xff7f, 0x3f80};
  EXPECT_TRUE(AllFinite16(bf.data(), bf.size(), 0x7f80));
  for (uint16_t bad : {0x7f80, 0xff80, 0x7fc0}) {
    bf[3] = bad;
    EXPECT_FALSE(AllFinite16(bf.data(), bf.size(), 0x7f80)) << bad;
  }
}

}  // namespace
}  // namespace shardps
