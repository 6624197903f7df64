// HalfCodec ("fp16", "bf16"): each value becomes a 16-bit float, rounded to
// nearest even. Payload: n little-endian uint16.
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
// fp16 with the CPU's F16C conversion, 8 values per instruction, where the
// CPU has it (checked at run time: the binary stays plain x86-64). Round to
// nearest even as FloatToHalf; NaN lanes are redone by FloatToHalf, whose
// canonical NaN F16C does not produce, so the bytes are identical.
__attribute__((target("avx,f16c"))) void EncodeRangeF16c(const float* in, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const int nan_lanes = _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    for (int lane = 0; nan_lanes != 0 && lane < 8; ++lane) {
      if (nan_lanes & (1 << lane)) StoreU16(out + 2 * (i + lane), math::FloatToHalf(in[i + lane]));
    }
  }
  for (; i < n; ++i) StoreU16(out + 2 * i, math::FloatToHalf(in[i]));
}

// F16C from CPUID (clang's __builtin_cpu_supports does not know "f16c").
bool HaveF16c() {
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  return have;
}
#else
void EncodeRangeF16c(const float*, size_t, uint8_t*) {}
bool HaveF16c() { return false; }
#endif

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
    auto encode = ToHalf == &math::FloatToHalf && HaveF16c() ? EncodeRangeF16c : EncodeRange<ToHalf>;
    ForEachChunk(in.size(), kChunkElements, params().num_threads,
                 [&](size_t b, size_t e) { encode(in.data() + b, e - b, out.data() + b * 2); });
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
