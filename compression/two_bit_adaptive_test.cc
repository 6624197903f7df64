// 2bit with an adaptive threshold: t = scale * mean |x| per message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compression/codec.h"
#include "compression/error_feedback.h"

namespace shardps::compression {
namespace {

std::vector<float> Gaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(TwoBitAdaptiveTest, SpecRoundTripsAndRejectsNegativeScale) {
  auto p = ParseCodecSpec("2bit:scale=1.5");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->scale, 1.5f);
  auto again = ParseCodecSpec(p->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToString(), p->ToString());
  EXPECT_FALSE(ParseCodecSpec("2bit:scale=-1").ok());
  EXPECT_FALSE(ParseCodecSpec("2bit:scale=nan").ok());
}

TEST(TwoBitAdaptiveTest, ThresholdFollowsTheMessageMagnitude) {
  auto codec = CreateCodec("2bit:scale=1");
  ASSERT_TRUE(codec.ok());
  for (float sigma : {1e-6f, 1e-3f, 10.0f}) {
    std::vector<float> x = Gaussian(8192, sigma, 7);
    double mean = 0;
    for (float v : x) mean += std::fabs(v);
    mean /= x.size();
    std::vector<uint8_t> out((*codec)->EncodedBytes(x.size()));
    ASSERT_TRUE((*codec)->Encode(x, 0, absl::MakeSpan(out)).ok());
    float t;
    std::memcpy(&t, out.data(), sizeof(t));
    EXPECT_NEAR(t, mean, mean * 1e-5) << "sigma " << sigma;
    std::vector<float> decoded(x.size());
    ASSERT_TRUE((*codec)->Decode(out, 0, absl::MakeSpan(decoded)).ok());
    size_t nonzero = 0;
    for (float v : decoded) nonzero += v != 0;
    // About 42% of a Gaussian lies beyond its mean absolute value.
    EXPECT_NEAR(static_cast<double>(nonzero) / x.size(), 0.42, 0.05) << "sigma " << sigma;
  }
}

TEST(TwoBitAdaptiveTest, AllZeroInputDecodesToZeros) {
  auto codec = CreateCodec("2bit:scale=1");
  std::vector<float> x(2048, 0.0f), decoded(2048, 5.0f);
  std::vector<uint8_t> out((*codec)->EncodedBytes(x.size()));
  ASSERT_TRUE((*codec)->Encode(x, 0, absl::MakeSpan(out)).ok());
  ASSERT_TRUE((*codec)->Decode(out, 0, absl::MakeSpan(decoded)).ok());
  EXPECT_EQ(decoded, x);
}

TEST(TwoBitAdaptiveTest, ErrorFeedbackInvariantHolds) {
  auto params = ParseCodecSpec("2bit:scale=1");
  auto feedback = ErrorFeedback::Create(*params);
  ASSERT_TRUE(feedback.ok());
  std::vector<float> g = Gaussian(4096, 0.01f, 3);
  std::vector<uint8_t> out((*feedback)->MaxEncodedBytes(g.size()));
  std::vector<float> decoded(g.size());
  for (int step = 0; step < 3; ++step) {
    std::vector<float> old_residual = (*feedback)->Residual(1);
    if (old_residual.empty()) old_residual.assign(g.size(), 0.0f);
    auto n = (*feedback)->Encode(1, g, 0, absl::MakeSpan(out));
    ASSERT_TRUE(n.ok());
    ASSERT_TRUE((*feedback)->codec().Decode(absl::MakeConstSpan(out.data(), *n), 0, absl::MakeSpan(decoded)).ok());
    std::vector<float> residual = (*feedback)->Residual(1);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(decoded[i] + residual[i], g[i] + old_residual[i], 1e-6) << i;
    }
  }
}

}  // namespace
}  // namespace shardps::compression
