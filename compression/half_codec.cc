// HalfCodec ("fp16", "bf16"): each value becomes a 16-bit float, rounded to
// nearest even. Payload: n little-endian uint16.
#include <cstring>

#include "compression/codec_factories.h"
#include "compression/codec_math.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

// Values converted per step through an aligned stack buffer: the payload may be
// unaligned, and the staging keeps the conversion loops vectorisable.
constexpr size_t kTile = 1024;

template <uint16_t (*ToHalf)(float)>
void EncodeRange(const float* in, size_t n, uint8_t* out) {
  alignas(64) uint16_t tile[kTile];
  for (size_t base = 0; base < n; base += kTile) {
    const size_t len = n - base < kTile ? n - base : kTile;
    for (size_t i = 0; i < len; ++i) tile[i] = ToHalf(in[base + i]);
    std::memcpy(out + base * 2, tile, len * 2);
  }
}

template <float (*FromHalf)(uint16_t)>
void DecodeRange(const uint8_t* in, size_t n, float* out, bool accumulate) {
  alignas(64) uint16_t tile[kTile];
  for (size_t base = 0; base < n; base += kTile) {
    const size_t len = n - base < kTile ? n - base : kTile;
    std::memcpy(tile, in + base * 2, len * 2);
    float* o = out + base;
    if (accumulate) {
      for (size_t i = 0; i < len; ++i) o[i] += FromHalf(tile[i]);
    } else {
      for (size_t i = 0; i < len; ++i) o[i] = FromHalf(tile[i]);
    }
  }
}

template <uint16_t (*ToHalf)(float), float (*FromHalf)(uint16_t)>
class HalfCodec final : public Codec {
 public:
  explicit HalfCodec(const CodecParams& params) : Codec(params) {}

  size_t EncodedBytes(size_t n) const override { return n * sizeof(uint16_t); }
  size_t min_elements() const override { return 256; }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t /*seed*/,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    ForEachChunk(in.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      EncodeRange<ToHalf>(in.data() + b, e - b, out.data() + b * 2);
    });
    return EncodedBytes(in.size());
  }

 protected:
  absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t /*seed*/, absl::Span<float> out,
                          bool accumulate) const override {
    if (in.size() != EncodedBytes(out.size())) {
      return PayloadSizeError(name(), in.size(), EncodedBytes(out.size()), out.size());
    }
    ForEachChunk(out.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      DecodeRange<FromHalf>(in.data() + b * 2, e - b, out.data() + b, accumulate);
    });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> NewHalfCodec(const CodecParams& params) {
  if (params.name == "bf16") {
    return std::make_unique<HalfCodec<&math::FloatToBf16, &math::Bf16ToFloat>>(params);
  }
  return std::make_unique<HalfCodec<&math::FloatToHalf, &math::HalfToFloat>>(params);
}

}  // namespace shardps::compression
