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

// The fp16 codec may convert with the CPU's F16C instructions: its bytes must
// be FloatToHalf's for every input, NaNs, infinities and subnormals included.
TEST(CodecRoundTripTest, Fp16CodecBytesEqualScalarConversionOnRandomBits) {
  std::mt19937 rng(11);
  std::vector<float> x(100003);
  for (float& v : x) v = math::BitsFloat(rng());
  x[3] = NAN;
  x[9] = -INFINITY;
  x[17] = 65520.0f;  // rounds to infinity
  x[18] = 0x1p-25f;  // halfway to the smallest subnormal: rounds to even (zero)
  auto codec = MustCreate("fp16");
  std::vector<uint8_t> out(codec->EncodedBytes(x.size()));
  ASSERT_TRUE(codec->Encode(x, 0, absl::MakeSpan(out)).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, out.data() + 2 * i, 2);
    ASSERT_EQ(got, math::FloatToHalf(x[i])) << "element " << i << " bits " << math::FloatBits(x[i]);
  }
}

// The 2bit encoder may use AVX2 compares: its words must be the scalar
// TwoBitCode's for every input, NaNs and a ragged tail included.
TEST(CodecRoundTripTest, TwoBitCodecBytesEqualScalarCodesOnRandomBits) {
  std::mt19937 rng(12);
  std::vector<float> x(100003);
  for (float& v : x) v = math::BitsFloat(rng()) * 0x1p-100f;  // spread around the threshold
  x[5] = NAN;
  x[6] = 0.5f;   // exactly +t
  x[7] = -0.5f;  // exactly -t
  auto codec = MustCreate("2bit:threshold=0.5");
  std::vector<uint8_t> out(codec->EncodedBytes(x.size()));
  ASSERT_TRUE(codec->Encode(x, 0, absl::MakeSpan(out)).ok());
  for (size_t w = 0; w * 16 < x.size(); ++w) {
    uint32_t want = 0;
    for (size_t j = 0; j < 16 && w * 16 + j < x.size(); ++j) want |= math::TwoBitCode(x[w * 16 + j], 0.5f) << (2 * j);
    uint32_t got;
    std::memcpy(&got, out.data() + 4 + 4 * w, 4);
    ASSERT_EQ(got, want) << "word " << w;
  }
}

// The scalar definition of onebit's scale: 32 lanes summed in double, folded
// by halves, per block of kSumBlock; then the block sums the same way.
template <typename T>
double LaneSum(const T* x, size_t len) {
  double lanes[math::kSumLanes] = {};
  for (size_t i = 0; i < len; ++i) lanes[i % math::kSumLanes] += std::fabs(static_cast<double>(x[i]));
  for (size_t off = math::kSumLanes / 2; off > 0; off /= 2) {
    for (size_t l = 0; l < off; ++l) lanes[l] += lanes[l + off];
  }
  return lanes[0];
}

// The onebit encoder may use AVX2 for the scale and the sign bits: its bytes
// must be the scalar definition's.
TEST(CodecRoundTripTest, OneBitCodecBytesEqualScalarDefinitionOnRandomValues) {
  std::mt19937 rng(13);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(100003);
  for (float& v : x) v = d(rng);
  x[4] = -0.0f;  // not negative: bit 0
  auto codec = MustCreate("onebit");
  std::vector<uint8_t> out(codec->EncodedBytes(x.size()));
  ASSERT_TRUE(codec->Encode(x, 0, absl::MakeSpan(out)).ok());
  std::vector<double> blocks;
  for (size_t b = 0; b < x.size(); b += math::kSumBlock) {
    blocks.push_back(LaneSum(x.data() + b, std::min(math::kSumBlock, x.size() - b)));
  }
  float scale;
  std::memcpy(&scale, out.data(), 4);
  EXPECT_EQ(scale, static_cast<float>(LaneSum(blocks.data(), blocks.size()) / static_cast<double>(x.size())));
  for (size_t w = 0; w * 32 < x.size(); ++w) {
    uint32_t want = 0;
    for (size_t j = 0; j < 32 && w * 32 + j < x.size(); ++j) want |= static_cast<uint32_t>(x[w * 32 + j] < 0.0f) << j;
    uint32_t got;
    std::memcpy(&got, out.data() + 4 + 4 * w, 4);
    ASSERT_EQ(got, want) << "word " << w;
  }
}

// Decoding (plain and accumulating) may use AVX2: values must be exactly the
// scalar TwoBitValue of every code, added to the output in the same way.
TEST(CodecRoundTripTest, TwoBitDecodeEqualsScalarValuesOnRandomCodes) {
  std::mt19937 rng(14);
  const size_t n = 100003;
  auto codec = MustCreate("2bit:threshold=0.25");
  std::vector<uint8_t> payload(codec->EncodedBytes(n), 0);
  const float t = 0.25f;
  std::memcpy(payload.data(), &t, 4);
  std::vector<uint32_t> codes(n);
  for (size_t i = 0; i < n; ++i) {
    codes[i] = rng() % 3;  // 0, 1 (+t), 2 (-t)
    payload[4 + i / 16 * 4 + (i % 16) / 4] |= static_cast<uint8_t>(codes[i] << (2 * (i % 4)));
  }
  std::vector<float> base(n), plain(n), summed(n);
  for (size_t i = 0; i < n; ++i) base[i] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
  summed = base;
  ASSERT_TRUE(codec->Decode(payload, 0, absl::MakeSpan(plain)).ok());
  ASSERT_TRUE(codec->DecodeAdd(payload, 0, absl::MakeSpan(summed)).ok());
  for (size_t i = 0; i < n; ++i) {
    const float v = math::TwoBitValue(codes[i], t);
    ASSERT_EQ(math::FloatBits(plain[i]), math::FloatBits(v)) << i;
    ASSERT_EQ(math::FloatBits(summed[i]), math::FloatBits(base[i] + v)) << i;
  }
}

// Onebit decoding may use AVX2: -s where a bit is set, else +s, added to the
// output in the same way as the scalar loop.
TEST(CodecRoundTripTest, OneBitDecodeEqualsScalarValuesOnRandomBits) {
  std::mt19937 rng(15);
  const size_t n = 100003;
  auto codec = MustCreate("onebit");
  std::vector<uint8_t> payload(codec->EncodedBytes(n), 0);
  const float s = 0.375f;
  std::memcpy(payload.data(), &s, 4);
  std::vector<bool> negative(n);
  for (size_t i = 0; i < n; ++i) {
    negative[i] = rng() & 1;
    if (negative[i]) payload[4 + i / 32 * 4 + (i % 32) / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
  std::vector<float> base(n), plain(n), summed(n);
  for (size_t i = 0; i < n; ++i) base[i] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
  summed = base;
  ASSERT_TRUE(codec->Decode(payload, 0, absl::MakeSpan(plain)).ok());
  ASSERT_TRUE(codec->DecodeAdd(payload, 0, absl::MakeSpan(summed)).ok());
  for (size_t i = 0; i < n; ++i) {
    const float v = negative[i] ? -s : s;
    ASSERT_EQ(math::FloatBits(plain[i]), math::FloatBits(v)) << i;
    ASSERT_EQ(math::FloatBits(summed[i]), math::FloatBits(base[i] + v)) << i;
  }
}

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
