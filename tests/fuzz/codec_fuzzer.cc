// Fuzzes every codec's decoder on arbitrary payloads, as a server decodes a
// pushed gradient: the decoder must refuse what is malformed without writing
// (codec.h), and Decode/DecodeAdd must agree on what they accept. The same
// bytes read as floats must encode to exactly EncodedBytes and decode again.
//
// Input: [codec][params][u16 n][u64 seed][payload...]
#include <cstring>
#include <vector>

#include "compression/codec.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

using compression::Codec;

constexpr float kRatios[] = {0.01f, 0.25f, 0.5f, 1.0f};
constexpr float kThresholds[] = {0.5f, 1e-30f, 1e30f, 3.0f};

// One codec per input; each thread count of 1 keeps runs deterministic.
std::unique_ptr<Codec> MakeCodec(FuzzInput& in) {
  const auto& names = compression::CodecNames();
  compression::CodecParams params;
  params.name = names[in.Byte() % names.size()];
  const uint8_t p = in.Byte();
  params.ratio = kRatios[p % 4];
  params.threshold = kThresholds[(p >> 2) % 4];
  params.scale = (p & 0x10) ? 1.0f : 0.0f;
  params.unbiased = (p & 0x20) != 0;
  params.num_threads = 1;
  auto codec = compression::CreateCodec(params);
  Require(codec.ok(), "a codec with valid parameters cannot be created");
  return *std::move(codec);
}

void CheckDecode(const Codec& codec, const std::string& payload, size_t n, uint64_t seed) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  const absl::Span<const uint8_t> in(bytes, payload.size());
  const std::vector<float> before(n, 42.0f);
  std::vector<float> decoded = before, added = before;
  const absl::Status d = codec.Decode(in, seed, absl::MakeSpan(decoded));
  const absl::Status a = codec.DecodeAdd(in, seed, absl::MakeSpan(added));
  Require(d.ok() == a.ok(), "Decode and DecodeAdd disagree on whether a payload is valid");
  if (!d.ok() && n > 0) {
    Require(d.code() == absl::StatusCode::kInvalidArgument, "a refused payload is not InvalidArgument");
    Require(std::memcmp(decoded.data(), before.data(), n * sizeof(float)) == 0, "Decode wrote before refusing");
    Require(std::memcmp(added.data(), before.data(), n * sizeof(float)) == 0, "DecodeAdd wrote before refusing");
  }
  // topk alone accepts any count of entries up to n (error-feedback warm-up
  // sends more than k); every other payload has exactly EncodedBytes(n).
  if (d.ok() && codec.name() != "topk") {
    Require(payload.size() == codec.EncodedBytes(n), "a payload of the wrong size was accepted");
  }
}

void CheckRoundTrip(const Codec& codec, const std::string& payload, uint64_t seed) {
  std::vector<float> values(payload.size() / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), payload.data(), values.size() * sizeof(float));
  std::vector<uint8_t> encoded(codec.EncodedBytes(values.size()));
  auto size = codec.Encode(values, seed, absl::MakeSpan(encoded));
  if (!size.ok()) return;  // e.g. non-finite values: refusing them is allowed
  Require(*size == encoded.size(), "Encode did not write EncodedBytes(n) bytes");
  std::vector<float> decoded(values.size());
  Require(codec.Decode(encoded, seed, absl::MakeSpan(decoded)).ok(), "a payload Encode wrote does not decode");
}

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardps::fuzz;
  FuzzInput in(data, size);
  auto codec = MakeCodec(in);
  const size_t n = in.Int(2);
  const uint64_t seed = in.Int(8);
  const std::string payload = in.Rest();
  CheckDecode(*codec, payload, n, seed);
  CheckRoundTrip(*codec, payload, seed);
  return 0;
}
