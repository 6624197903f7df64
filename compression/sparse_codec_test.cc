// Properties of the sparsifying codecs: topk exactness and contraction,
// randomk stratification, unbiasedness and server-side aggregation.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "compression/codec.h"
#include "compression/codec_math.h"
#include "compression/codec_test_util.h"
#include "compression/kernel_util.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

double SquaredNorm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

TEST(TopKCodecTest, KeepsExactlyTheKLargestMagnitudes) {
  const size_t n = 100003;  // Large enough for the sampled threshold path.
  auto codec = MustCreate("topk:ratio=0.01");
  const auto x = RandomGradient(n, 21);
  const auto payload = MustEncode(*codec, x);
  const size_t k = math::SparseCount(n, 0.01);
  ASSERT_EQ(LoadU32(payload.data()), k);
  const auto y = MustDecode(*codec, payload, n);
  std::vector<float> mags(n);
  for (size_t i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (y[i] != 0) {
      ++kept;
      ASSERT_EQ(y[i], x[i]);
      ASSERT_GE(std::fabs(x[i]), mags[k - 1]);
    } else {
      ASSERT_LE(std::fabs(x[i]), mags[k - 1]);
    }
  }
  EXPECT_EQ(kept, k);
}

TEST(TopKCodecTest, IsAContraction) {
  for (float ratio : {0.001f, 0.01f, 0.3f}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      const size_t n = 50000;
      auto codec = MustCreate("topk:ratio=" + std::to_string(ratio));
      auto x = RandomGradient(n, seed);
      for (size_t i = 0; i < n; i += 97) x[i] *= 50;  // Heavy tail.
      const auto y = MustDecode(*codec, MustEncode(*codec, x), n);
      std::vector<float> err(n);
      for (size_t i = 0; i < n; ++i) err[i] = x[i] - y[i];
      const double k = static_cast<double>(math::SparseCount(n, ratio));
      EXPECT_LE(SquaredNorm(err), (1.0 - k / n) * SquaredNorm(x)) << ratio << " " << seed;
    }
  }
}

TEST(TopKCodecTest, TiesGoToLowerIndices) {
  const size_t n = 80000;
  std::vector<float> x(n, 0.0f);  // All zero: every element ties.
  auto codec = MustCreate("topk:ratio=0.001");
  const auto payload = MustEncode(*codec, x);
  const size_t k = LoadU32(payload.data());
  for (size_t j = 0; j < k; ++j) ASSERT_EQ(LoadU32(payload.data() + 4 + 8 * j), j);
}

// The topk payload by its definition: the k largest TopKKeys, in index order.
std::vector<uint8_t> SortedTopKPayload(const std::vector<float>& x, size_t k) {
  std::vector<uint64_t> keys(x.size());
  for (size_t i = 0; i < x.size(); ++i) keys[i] = math::TopKKey(x[i], static_cast<uint32_t>(i));
  std::sort(keys.begin(), keys.end(), std::greater<uint64_t>());
  std::vector<uint32_t> kept(k);
  for (size_t j = 0; j < k; ++j) kept[j] = 0xffffffffu - static_cast<uint32_t>(keys[j]);
  std::sort(kept.begin(), kept.end());
  std::vector<uint8_t> payload(4 + 8 * k);
  StoreU32(payload.data(), static_cast<uint32_t>(k));
  for (size_t j = 0; j < k; ++j) {
    StoreU32(payload.data() + 4 + 8 * j, kept[j]);
    StoreF32(payload.data() + 8 + 8 * j, x[kept[j]]);
  }
  return payload;
}

// Encodes x with topk at `ratio` on one thread and on all cores; the payload
// must be SortedTopKPayload's for the k the codec derived from the ratio.
void ExpectSortedTopK(const std::vector<float>& x, const std::string& ratio,
                      const std::string& what) {
  for (const char* threads : {"1", "0"}) {
    auto codec = MustCreate("topk:ratio=" + ratio + ",threads=" + threads);
    const auto payload = MustEncode(*codec, x);
    const size_t k = payload.size() >= 4 ? LoadU32(payload.data()) : 0;
    ASSERT_TRUE(k >= 1 && k <= x.size()) << what;
    EXPECT_TRUE(payload == SortedTopKPayload(x, k)) << what << ", threads=" << threads;
  }
}

TEST(TopKCodecTest, PayloadIsTheSortedKeyDefinition) {
  const size_t n = 5 * 65536 + 13;  // Several chunks, ragged tail.
  ExpectSortedTopK(RandomGradient(n, 51), "0.01", "gaussian");
  ExpectSortedTopK(RandomGradient(5000, 52), "0.1", "small input, no sampling");
  ExpectSortedTopK(RandomGradient(20001, 53), "0.99", "k near n");
  ExpectSortedTopK(RandomGradient(20001, 53), "1.0", "k = n");
}

TEST(TopKCodecTest, PayloadIsTheSortedKeyDefinitionWithOutliers) {
  // A few huge magnitudes widen the range the first radix digit spans.
  auto x = RandomGradient(300007, 54);
  x[17] = std::numeric_limits<float>::infinity();
  x[1000] = -std::numeric_limits<float>::infinity();
  x[2000] = std::numeric_limits<float>::quiet_NaN();  // Ranks above Inf, as in TopKKey.
  x[3000] = 1e30f;
  ExpectSortedTopK(x, "0.01", "outliers");
}

TEST(TopKCodecTest, PayloadIsTheSortedKeyDefinitionWithManyTies) {
  // Integer magnitudes: thousands tie at the k-th, so ties decide by index.
  auto x = RandomGradient(200003, 55);
  for (float& v : x) v = std::round(v);
  ExpectSortedTopK(x, "0.03", "integers");
  std::vector<float> y(100000);
  for (size_t i = 0; i < y.size(); ++i) y[i] = i % 3 == 0 ? -0.5f : 0.5f;
  ExpectSortedTopK(y, "0.01", "equal magnitudes");
}

TEST(TopKCodecTest, PayloadIsTheSortedKeyDefinitionWhenTheSampleMisleads) {
  // The elements the threshold estimate samples (4096 positions drawn as
  // SplitMix64(j) % n) are the largest, so the threshold passes fewer than k
  // elements and selection starts over from every element.
  const size_t n = 100000;
  auto x = RandomGradient(n, 56);
  for (uint64_t j = 0; j < 4096; ++j) x[math::SplitMix64(j) % n] = 100.0f + j;
  ExpectSortedTopK(x, "0.1", "misleading sample");
}

TEST(RandomKCodecTest, PicksOneDistinctIndexPerBucket) {
  const uint64_t n = 1000, k = 37;
  std::set<uint32_t> seen;
  for (uint64_t j = 0; j < k; ++j) {
    const uint32_t i = math::RandomKIndex(99, j, n, k);
    EXPECT_GE(i, math::BucketBegin(j, n, k));
    EXPECT_LT(i, math::BucketBegin(j + 1, n, k));
    seen.insert(i);
  }
  EXPECT_EQ(seen.size(), k);
}

TEST(RandomKCodecTest, IsUnbiasedOverSeeds) {
  const size_t n = 64;
  auto codec = MustCreate("randomk:ratio=0.25");
  const auto x = RandomGradient(n, 31);
  std::vector<double> mean(n, 0.0);
  const int kSeeds = 20000;
  for (int s = 0; s < kSeeds; ++s) {
    const auto y = MustDecode(*codec, MustEncode(*codec, x, s), n, s);
    for (size_t i = 0; i < n; ++i) mean[i] += y[i];
  }
  for (size_t i = 0; i < n; ++i) {
    // Per-seed std is |x|*sqrt(3) (bucket of 4); the mean's std is that / sqrt(kSeeds).
    EXPECT_NEAR(mean[i] / kSeeds, x[i], 5 * std::fabs(x[i]) * std::sqrt(3.0 / kSeeds) + 1e-6) << i;
  }
}

TEST(RandomKCodecTest, SummedPayloadsDecodeToSummedGradients) {
  const size_t n = 5000;
  auto codec = MustCreate("randomk:ratio=0.1");
  ASSERT_TRUE(codec->server_can_aggregate());
  std::vector<float> expected(n, 0.0f);
  std::vector<float> summed(codec->EncodedBytes(n) / 4, 0.0f);
  for (uint32_t worker = 0; worker < 4; ++worker) {
    const auto payload = MustEncode(*codec, RandomGradient(n, 40 + worker), /*seed=*/5);
    ASSERT_TRUE(codec->DecodeAdd(payload, 5, absl::MakeSpan(expected)).ok());
    for (size_t j = 0; j < summed.size(); ++j) summed[j] += LoadF32(payload.data() + 4 * j);
  }
  std::vector<uint8_t> bytes(summed.size() * 4);
  std::memcpy(bytes.data(), summed.data(), bytes.size());
  const auto got = MustDecode(*codec, bytes, n, 5);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], expected[i], 1e-4f * (1 + std::fabs(expected[i])));
}

}  // namespace
}  // namespace shardps::compression
