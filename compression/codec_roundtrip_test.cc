// Round-trip error bounds of the dense codecs.
#include <cmath>
#include <random>

#include "compression/codec.h"
#include "compression/codec_math.h"
#include "compression/codec_test_util.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

constexpr size_t kN = 10007;  // Not a multiple of any word size.

TEST(CodecRoundTripTest, NoneIsExactAndAggregatable) {
  auto codec = MustCreate("none");
  const auto x = RandomGradient(kN, 1);
  EXPECT_EQ(MustDecode(*codec, MustEncode(*codec, x), kN), x);
  EXPECT_TRUE(codec->server_can_aggregate());
}

TEST(CodecRoundTripTest, Fp16ErrorWithinHalfUlp) {
  auto codec = MustCreate("fp16");
  const auto x = RandomGradient(kN, 2);
  const auto y = MustDecode(*codec, MustEncode(*codec, x), kN);
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i]) * 0x1p-11f + 0x1p-25f) << i;
  }
}

TEST(CodecRoundTripTest, Bf16ErrorWithinHalfUlp) {
  auto codec = MustCreate("bf16");
  const auto x = RandomGradient(kN, 3, 100.0f);
  const auto y = MustDecode(*codec, MustEncode(*codec, x), kN);
  for (size_t i = 0; i < kN; ++i) EXPECT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i]) * 0x1p-8f) << i;
}

TEST(CodecRoundTripTest, HalfFormatsRoundTiesToEven) {
  EXPECT_EQ(math::FloatToHalf(1.0f + 0x1p-11f), 0x3c00);           // Tie -> even (1.0).
  EXPECT_EQ(math::FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);       // Tie -> even (up).
  EXPECT_EQ(math::FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(math::FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(math::FloatToHalf(1e6f), 0x7c00);                      // Overflow -> Inf.
  EXPECT_EQ(math::FloatToHalf(-0x1p-24f), 0x8001);                 // Smallest subnormal.
  EXPECT_TRUE(std::isnan(math::HalfToFloat(math::FloatToHalf(NAN))));
  EXPECT_TRUE(std::isnan(math::Bf16ToFloat(math::FloatToBf16(NAN))));
}

#ifdef __FLT16_MAX__
TEST(CodecRoundTripTest, Fp16MatchesCompilerConversionOnRandomBits) {
  std::mt19937 rng(4);
  for (int i = 0; i < 200000; ++i) {
    const float f = math::BitsFloat(rng());
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof(bits));
    ASSERT_EQ(math::FloatToHalf(f), bits) << f;
    ASSERT_EQ(math::FloatBits(math::HalfToFloat(bits)), math::FloatBits(static_cast<float>(h)));
  }
}
#endif

TEST(CodecRoundTripTest, TwoBitKeepsSignAboveThreshold) {
  auto codec = MustCreate("2bit:threshold=0.5");
  const auto x = RandomGradient(kN, 5);
  const auto y = MustDecode(*codec, MustEncode(*codec, x), kN);
  for (size_t i = 0; i < kN; ++i) {
    const float want = x[i] >= 0.5f ? 0.5f : (x[i] <= -0.5f ? -0.5f : 0.0f);
    ASSERT_EQ(y[i], want) << i;
  }
  EXPECT_EQ(codec->EncodedBytes(kN), 4 + (kN + 15) / 16 * 4);
}

TEST(CodecRoundTripTest, OneBitKeepsSignWithMeanAbsScale) {
  auto codec = MustCreate("onebit");
  const auto x = RandomGradient(kN, 6);
  const auto y = MustDecode(*codec, MustEncode(*codec, x), kN);
  double mean = 0;
  for (float v : x) mean += std::fabs(v);
  mean /= kN;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(std::fabs(y[i]), mean, mean * 1e-6) << i;
    ASSERT_EQ(y[i] < 0, x[i] < 0) << i;
  }
  EXPECT_EQ(codec->EncodedBytes(kN), 4 + (kN + 31) / 32 * 4);
}

TEST(CodecRoundTripTest, DecodeAddAccumulates) {
  const auto x = RandomGradient(kN, 7);
  for (const std::string& name : CodecNames()) {
    auto codec = MustCreate(name);
    const auto payload = MustEncode(*codec, x);
    const auto once = MustDecode(*codec, payload, kN);
    std::vector<float> sum(kN, 1.0f);
    ASSERT_TRUE(codec->DecodeAdd(payload, 7, absl::MakeSpan(sum)).ok());
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(sum[i], 1.0f + once[i]) << name << " " << i;
  }
}

TEST(CodecRoundTripTest, EmptyInputEncodesAndDecodes) {
  for (const std::string& name : CodecNames()) {
    auto codec = MustCreate(name);
    const auto payload = MustEncode(*codec, {});
    EXPECT_TRUE(MustDecode(*codec, payload, 0).empty()) << name;
  }
}

TEST(CodecRoundTripTest, EncodeRejectsShortOutput) {
  for (const std::string& name : CodecNames()) {
    auto codec = MustCreate(name);
    std::vector<float> x(100, 1.0f);
    std::vector<uint8_t> out(codec->EncodedBytes(100) - 1);
    EXPECT_EQ(codec->Encode(x, 1, absl::MakeSpan(out)).status().code(),
              absl::StatusCode::kInvalidArgument) << name;
  }
}

}  // namespace
}  // namespace shardps::compression
