// Malformed payloads are rejected with InvalidArgument and leave `out` as it was.
#include <cmath>
#include <functional>

#include "compression/codec.h"
#include "compression/codec_test_util.h"
#include "compression/kernel_util.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

constexpr size_t kN = 1000;  // Leaves padding in the last 2bit/onebit word.

// Expects Decode and DecodeAdd to reject `payload` without touching out.
void ExpectRejected(const std::string& spec, const std::vector<uint8_t>& payload,
                    const std::string& why) {
  auto codec = MustCreate(spec);
  for (bool add : {false, true}) {
    std::vector<float> out(kN, 42.0f);
    absl::Status s = add ? codec->DecodeAdd(payload, 7, absl::MakeSpan(out))
                         : codec->Decode(payload, 7, absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec << ": " << why;
    EXPECT_EQ(out, std::vector<float>(kN, 42.0f)) << spec << ": " << why;
  }
}

std::vector<uint8_t> Valid(const std::string& spec) {
  return MustEncode(*MustCreate(spec), RandomGradient(kN, 11));
}

TEST(CodecValidationTest, WrongSizesAreRejected) {
  for (const std::string& name : CodecNames()) {
    auto payload = Valid(name);
    auto longer = payload;
    longer.push_back(0);
    ExpectRejected(name, longer, "one byte too many");
    if (!payload.empty()) {
      ExpectRejected(name, std::vector<uint8_t>(payload.begin(), payload.end() - 1), "truncated");
    }
    ExpectRejected(name, {}, "empty");
  }
}

TEST(CodecValidationTest, BadTwoBitThresholdsAreRejected) {
  for (float t : {NAN, -0.5f, 0.0f, INFINITY}) {
    auto payload = Valid("2bit");
    StoreF32(payload.data(), t);
    ExpectRejected("2bit", payload, "threshold " + std::to_string(t));
  }
}

TEST(CodecValidationTest, TwoBitCodeThreeAndPaddingAreRejected) {
  auto payload = Valid("2bit");
  StoreU32(payload.data() + 4, LoadU32(payload.data() + 4) | 0x3u);
  ExpectRejected("2bit", payload, "code 3");
  payload = Valid("2bit");
  StoreU32(payload.data() + payload.size() - 4, 0x40000000u);
  ExpectRejected("2bit", payload, "padding");
}

TEST(CodecValidationTest, BadOneBitScaleAndPaddingAreRejected) {
  for (float s : {NAN, -1.0f, INFINITY}) {
    auto payload = Valid("onebit");
    StoreF32(payload.data(), s);
    ExpectRejected("onebit", payload, "scale " + std::to_string(s));
  }
  auto payload = Valid("onebit");
  StoreU32(payload.data() + payload.size() - 4, 0x80000000u);
  ExpectRejected("onebit", payload, "padding");
}

TEST(CodecValidationTest, BadTopKIndicesAreRejected) {
  const std::string spec = "topk:ratio=0.05";
  const auto valid = Valid(spec);
  const auto with_index = [&](size_t entry, uint32_t index) {
    auto p = valid;
    StoreU32(p.data() + 4 + 8 * entry, index);
    return p;
  };
  ExpectRejected(spec, with_index(3, kN), "index == n");
  ExpectRejected(spec, with_index(3, 0xffffffffu), "index huge");
  ExpectRejected(spec, with_index(3, LoadU32(valid.data() + 4 + 8 * 2)), "duplicate index");
  ExpectRejected(spec, with_index(0, LoadU32(valid.data() + 4 + 8 * 5)), "descending");
  auto count = valid;
  StoreU32(count.data(), LoadU32(valid.data()) + 1);
  ExpectRejected(spec, count, "count larger than entries");
  StoreU32(count.data(), kN + 1);
  ExpectRejected(spec, count, "count > n");
}

// Found by tests/fuzz/codec_fuzzer.cc: onebit encoded a NaN scale that its
// own decoder refuses. Encode may refuse non-finite values, but what it
// writes must decode.
TEST(CodecValidationTest, EncodeOfNonFiniteValuesFailsOrDecodes) {
  for (const std::string& name : CodecNames()) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      auto codec = MustCreate(name);
      auto x = RandomGradient(kN, 12);
      x[kN / 2] = bad;
      std::vector<uint8_t> payload(codec->EncodedBytes(kN));
      auto size = codec->Encode(x, 7, absl::MakeSpan(payload));
      if (!size.ok()) {
        EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << name << " " << bad;
        continue;
      }
      std::vector<float> out(kN);
      EXPECT_TRUE(codec->Decode(payload, 7, absl::MakeSpan(out)).ok()) << name << " encoded " << bad
                                                                       << " into a payload it refuses";
    }
  }
}

}  // namespace
}  // namespace shardps::compression
