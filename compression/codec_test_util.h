// Test helpers for compression/: deterministic random gradients and codec
// creation that fails the test on error. Test-only.
#ifndef SHARDPS_COMPRESSION_CODEC_TEST_UTIL_H_
#define SHARDPS_COMPRESSION_CODEC_TEST_UTIL_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "gtest/gtest.h"

namespace shardps::compression {

// n values ~ N(0, scale^2), fixed by `seed`.
inline std::vector<float> RandomGradient(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline std::unique_ptr<Codec> MustCreate(const std::string& spec) {
  auto codec = CreateCodec(spec);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? std::move(codec).value() : nullptr;
}

inline std::vector<uint8_t> MustEncode(const Codec& codec, const std::vector<float>& in,
                                       uint64_t seed = 7) {
  std::vector<uint8_t> payload(codec.EncodedBytes(in.size()));
  auto size = codec.Encode(in, seed, absl::MakeSpan(payload));
  EXPECT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size.value_or(0), payload.size());
  return payload;
}

inline std::vector<float> MustDecode(const Codec& codec, const std::vector<uint8_t>& payload,
                                     size_t n, uint64_t seed = 7) {
  std::vector<float> out(n, -123.0f);
  absl::Status status = codec.Decode(payload, seed, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_TEST_UTIL_H_
