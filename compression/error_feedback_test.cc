#include "compression/error_feedback.h"

#include <cmath>

#include "compression/codec_test_util.h"
#include "compression/kernel_util.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

std::unique_ptr<ErrorFeedback> MustCreateEf(const std::string& spec,
                                            const ErrorFeedbackOptions& options = {}) {
  auto params = ParseCodecSpec(spec);
  EXPECT_TRUE(params.ok());
  auto ef = ErrorFeedback::Create(*params, options);
  EXPECT_TRUE(ef.ok()) << ef.status();
  return ef.ok() ? std::move(ef).value() : nullptr;
}

TEST(ErrorFeedbackTest, DecodedPlusResidualEqualsGradientPlusOldResidual) {
  const size_t n = 3001;
  for (const std::string& spec : CodecNames()) {
    auto ef = MustCreateEf(spec == "randomk" ? "randomk:unbiased=0" : spec);
    std::vector<uint8_t> out(ef->MaxEncodedBytes(n));
    std::vector<float> old_residual(n, 0.0f);
    for (int step = 0; step < 4; ++step) {
      const auto g = RandomGradient(n, 50 + step);
      auto bytes = ef->Encode(/*key=*/9, g, /*seed=*/step, absl::MakeSpan(out));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      const auto decoded = MustDecode(ef->codec(), {out.begin(), out.begin() + *bytes}, n, step);
      const auto residual = ef->Residual(9);
      for (size_t i = 0; i < n; ++i) {
        const float want = g[i] + old_residual[i];
        ASSERT_NEAR(decoded[i] + residual[i], want, 1e-5f * (1 + std::fabs(want)))
            << spec << " step " << step << " i " << i;
      }
      old_residual = residual;
    }
  }
}

TEST(ErrorFeedbackTest, KeysHaveSeparateResiduals) {
  auto ef = MustCreateEf("2bit:threshold=1");
  std::vector<uint8_t> out(ef->MaxEncodedBytes(4));
  const std::vector<float> g = {0.5f, -0.25f, 2.0f, 0.0f};
  ASSERT_TRUE(ef->Encode(1, g, 0, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(ef->Encode(2, g, 0, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(ef->Encode(2, g, 0, absl::MakeSpan(out)).ok());
  EXPECT_EQ(ef->Residual(1), (std::vector<float>{0.5f, -0.25f, 1.0f, 0.0f}));
  EXPECT_EQ(ef->Residual(2), (std::vector<float>{0.0f, -0.5f, 2.0f, 0.0f}));
  EXPECT_EQ(ef->num_keys(), 2u);
  ef->Reset(1);
  EXPECT_TRUE(ef->Residual(1).empty());
  EXPECT_EQ(ef->num_keys(), 1u);
}

TEST(ErrorFeedbackTest, LengthChangeForAKeyIsRejected) {
  auto ef = MustCreateEf("fp16");
  std::vector<uint8_t> out(1024);
  ASSERT_TRUE(ef->Encode(1, std::vector<float>(10, 1.0f), 0, absl::MakeSpan(out)).ok());
  EXPECT_EQ(ef->Encode(1, std::vector<float>(11, 1.0f), 0, absl::MakeSpan(out)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ef->Residual(1).size(), 10u);
}

TEST(ErrorFeedbackTest, MomentumClearsSentEntries) {
  const size_t n = 20000;
  auto ef = MustCreateEf("topk:ratio=0.01", {.momentum = 0.9f});
  std::vector<uint8_t> out(ef->MaxEncodedBytes(n));
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(ef->Encode(3, RandomGradient(n, 60 + step), step, absl::MakeSpan(out)).ok());
    const auto residual = ef->Residual(3);
    const size_t count = LoadU32(out.data());
    ASSERT_EQ(count, 200u);
    for (size_t j = 0; j < count; ++j) ASSERT_EQ(residual[LoadU32(out.data() + 4 + 8 * j)], 0.0f);
  }
}

TEST(ErrorFeedbackTest, WarmUpAnnealsTheRatio) {
  const size_t n = 10000;
  auto ef = MustCreateEf("topk:ratio=0.01", {.warmup_calls = 4, .warmup_start_ratio = 0.16f});
  std::vector<uint8_t> out(ef->MaxEncodedBytes(n));
  EXPECT_NEAR(static_cast<double>(out.size()), 4 + 8 * 1600.0, 8.0);
  std::vector<size_t> counts;
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(ef->Encode(4, RandomGradient(n, 70 + step), step, absl::MakeSpan(out)).ok());
    counts.push_back(LoadU32(out.data()));
  }
  const std::vector<double> want = {1600, 800, 400, 200, 100, 100};  // Halves per call.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(counts[i], want[i], 1.0) << i;
}

TEST(ErrorFeedbackTest, ARestoredKeyEncodesBitwiseAsTheOneItWasSavedFrom) {
  // Momentum and warm-up: every part of a key's state must travel.
  const size_t n = 5000;
  const ErrorFeedbackOptions options{.momentum = 0.5f, .warmup_calls = 4, .warmup_start_ratio = 0.16f};
  auto original = MustCreateEf("topk:ratio=0.01", options);
  auto copy = MustCreateEf("topk:ratio=0.01", options);
  std::vector<uint8_t> a(original->MaxEncodedBytes(n)), b(a.size());
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(original->Encode(7, RandomGradient(n, 80 + step), step, absl::MakeSpan(a)).ok());
  }
  copy->Restore(7, original->Save(7));
  for (int step = 2; step < 6; ++step) {
    const auto g = RandomGradient(n, 80 + step);
    auto x = original->Encode(7, g, step, absl::MakeSpan(a));
    auto y = copy->Encode(7, g, step, absl::MakeSpan(b));
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(std::vector<uint8_t>(a.begin(), a.begin() + *x), std::vector<uint8_t>(b.begin(), b.begin() + *y))
        << "step " << step;
  }
  copy->Restore(7, original->Save(99));  // an unknown key: nothing to carry
  EXPECT_TRUE(copy->Residual(7).empty());
  EXPECT_EQ(copy->num_keys(), 0u);
}

TEST(ErrorFeedbackTest, RejectsMomentumForDenseCodecs) {
  auto params = ParseCodecSpec("2bit");
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(ErrorFeedback::Create(*params, {.momentum = 0.9f}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto topk = ParseCodecSpec("topk");
  EXPECT_EQ(ErrorFeedback::Create(*topk, {.momentum = 1.5f}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardps::compression
