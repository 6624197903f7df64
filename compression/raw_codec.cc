// RawCodec ("none"): the payload is the fp32 array itself. Payloads can be
// summed as they are, so the server may aggregate without decoding.
#include <cstring>

#include "compression/codec_factories.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

class RawCodec final : public Codec {
 public:
  explicit RawCodec(const CodecParams& params) : Codec(params) {}

  size_t EncodedBytes(size_t n) const override { return n * sizeof(float); }
  bool server_can_aggregate() const override { return true; }
  size_t min_elements() const override { return 0; }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t /*seed*/,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    ForEachChunk(in.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      std::memcpy(out.data() + b * sizeof(float), in.data() + b, (e - b) * sizeof(float));
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
      if (!accumulate) {
        std::memcpy(out.data() + b, in.data() + b * sizeof(float), (e - b) * sizeof(float));
        return;
      }
      for (size_t i = b; i < e; ++i) out[i] += LoadF32(in.data() + i * sizeof(float));
    });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> NewRawCodec(const CodecParams& params) {
  return std::make_unique<RawCodec>(params);
}

}  // namespace shardps::compression
