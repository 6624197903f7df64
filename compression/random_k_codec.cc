// RandomKCodec ("randomk"): keeps k = clamp(ceil(ratio*n), 1, n) values, one
// per bucket [floor(j*n/k), floor((j+1)*n/k)), at the position drawn by
// math::RandomKIndex(seed, j): no indices travel. Payload: k float32 values in
// bucket order. With unbiased=1 (default) decoding scales value j by its
// bucket size (~n/k) so E[decode] = x; with error feedback use unbiased=0.
// Payloads of the same seed and n can be summed as fp32 arrays.
#include <algorithm>

#include "compression/codec_factories.h"
#include "compression/codec_math.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

class RandomKCodec final : public Codec {
 public:
  explicit RandomKCodec(const CodecParams& params) : Codec(params) {}

  size_t EncodedBytes(size_t n) const override { return 4 * K(n); }
  bool server_can_aggregate() const override { return true; }
  size_t min_elements() const override { return std::max<size_t>(1024, 1.0 / params().ratio); }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t seed,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    const size_t n = in.size(), k = K(n);
    ForEachChunk(k, kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) StoreF32(out.data() + 4 * j, in[math::RandomKIndex(seed, j, n, k)]);
    });
    return EncodedBytes(n);
  }

 protected:
  absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t seed, absl::Span<float> out,
                          bool accumulate) const override {
    const size_t n = out.size(), k = K(n);
    if (n > kMaxElements) return absl::InvalidArgumentError("randomk: too many values");
    if (in.size() != EncodedBytes(n)) return PayloadSizeError(name(), in.size(), EncodedBytes(n), n);
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    const bool unbiased = params().unbiased;
    ForEachChunk(k, kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) {
        const float v = LoadF32(in.data() + 4 * j);
        out[math::RandomKIndex(seed, j, n, k)] += unbiased ? v * math::RandomKScale(j, n, k) : v;
      }
    });
    return absl::OkStatus();
  }

 private:
  size_t K(size_t n) const { return math::SparseCount(n, params().ratio); }
};

}  // namespace

std::unique_ptr<Codec> NewRandomKCodec(const CodecParams& params) {
  return std::make_unique<RandomKCodec>(params);
}

}  // namespace shardps::compression
