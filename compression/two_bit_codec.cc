// TwoBitCodec ("2bit", as in MXNet): with threshold t, a value v >= t becomes
// +t, v <= -t becomes -t, anything else 0. Payload: float32 t, then
// ceil(n/16) uint32 words; value i sits in bits [2*(i%16), 2*(i%16)+2) of
// word i/16 with codes 0 = zero, 1 = +t, 2 = -t (3 and non-zero padding are
// rejected).
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "compression/codec_factories.h"
#include "compression/codec_math.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

constexpr size_t kPerWord = 16;

void EncodeWords(const float* in, size_t n, float t, uint8_t* words) {
  PackCodes<2>(in, n, [t](float v) { return math::TwoBitCode(v, t); }, words);
}

void DecodeWords(const uint8_t* words, size_t n, float t, float* out, bool accumulate);

#if defined(__x86_64__)
// The same codes 16 values at a time where the CPU has AVX2 and BMI2 (checked
// at run time): two compares give the +t and -t lanes as bit masks, and pdep
// interleaves them into the word's 2-bit codes. NaN compares false, as in
// TwoBitCode, so the bytes are identical.
__attribute__((target("avx2,bmi2"))) void EncodeWordsAvx2(const float* in, size_t n, float t, uint8_t* words) {
  const __m256 pos_t = _mm256_set1_ps(t), neg_t = _mm256_set1_ps(-t);
  size_t i = 0;
  for (; i + kPerWord <= n; i += kPerWord) {
    const __m256 a = _mm256_loadu_ps(in + i), b = _mm256_loadu_ps(in + i + 8);
    const uint32_t pos = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, pos_t, _CMP_GE_OQ))) |
                         static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(b, pos_t, _CMP_GE_OQ))) << 8;
    const uint32_t neg = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, neg_t, _CMP_LE_OQ))) |
                         static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(b, neg_t, _CMP_LE_OQ))) << 8;
    StoreU32(words + i / kPerWord * 4, _pdep_u32(pos, 0x55555555u) | _pdep_u32(neg, 0xAAAAAAAAu));
  }
  if (i < n) {
    uint32_t word = 0;
    for (size_t j = 0; i + j < n; ++j) word |= math::TwoBitCode(in[i + j], t) << (2 * j);
    StoreU32(words + i / kPerWord * 4, word);
  }
}

// All-ones in lane l where bit l of `mask8` is set.
__attribute__((target("avx2"))) inline __m256 LaneMask(uint32_t mask8) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i m = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(mask8)), lane_bits);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, lane_bits));
}

// DecodeWords 16 values at a time: pext splits a word's codes into the +t
// and -t lane masks, which select t, -t or +0 per lane exactly as
// TwoBitValue (codes are validated before decoding).
__attribute__((target("avx2,bmi2"))) void DecodeWordsAvx2(const uint8_t* words, size_t n, float t, float* out,
                                                          bool accumulate) {
  const __m256 pos_t = _mm256_set1_ps(t), neg_t = _mm256_set1_ps(-t);
  size_t i = 0;
  for (; i + kPerWord <= n; i += kPerWord) {
    const uint32_t word = LoadU32(words + i / kPerWord * 4);
    const uint32_t pos = _pext_u32(word, 0x55555555u), neg = _pext_u32(word, 0xAAAAAAAAu);
    for (int half = 0; half < 2; ++half) {
      __m256 v = _mm256_or_ps(_mm256_and_ps(LaneMask((pos >> (8 * half)) & 0xffu), pos_t),
                              _mm256_and_ps(LaneMask((neg >> (8 * half)) & 0xffu), neg_t));
      float* o = out + i + 8 * half;
      if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(o), v);
      _mm256_storeu_ps(o, v);
    }
  }
  if (i < n) DecodeWords(words + i / kPerWord * 4, n - i, t, out + i, accumulate);
}

bool HaveAvx2Bmi2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  return have;
}
#else
void EncodeWordsAvx2(const float*, size_t, float, uint8_t*) {}
void DecodeWordsAvx2(const uint8_t*, size_t, float, float*, bool) {}
bool HaveAvx2Bmi2() { return false; }
#endif

void DecodeWords(const uint8_t* words, size_t n, float t, float* out, bool accumulate) {
  for (size_t base = 0; base < n; base += kPerWord) {
    const uint32_t word = LoadU32(words + base / kPerWord * 4);
    const size_t len = n - base < kPerWord ? n - base : kPerWord;
    for (size_t i = 0; i < len; ++i) {
      const float v = math::TwoBitValue((word >> (2 * i)) & 3u, t);
      out[base + i] = accumulate ? out[base + i] + v : v;
    }
  }
}

class TwoBitCodec final : public Codec {
 public:
  explicit TwoBitCodec(const CodecParams& params) : Codec(params) {}

  // scale * mean |x|, summed in a fixed order (bit-identical whatever the
  // thread count); the smallest normal float when every value is zero, so the
  // payload stays valid and decodes to zeros.
  float AdaptiveThreshold(absl::Span<const float> in) const {
    double sum = 0;
    for (float v : in) sum += std::fabs(v);
    const float t = static_cast<float>(params().scale * (in.empty() ? 0.0 : sum / in.size()));
    return std::isfinite(t) && t > std::numeric_limits<float>::min() ? t : std::numeric_limits<float>::min();
  }

  size_t EncodedBytes(size_t n) const override { return 4 + (n + kPerWord - 1) / kPerWord * 4; }
  size_t min_elements() const override { return 1024; }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t /*seed*/,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    const float t = params().scale > 0 ? AdaptiveThreshold(in) : params().threshold;
    StoreF32(out.data(), t);
    auto encode = HaveAvx2Bmi2() ? EncodeWordsAvx2 : EncodeWords;
    ForEachChunk(in.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      encode(in.data() + b, e - b, t, out.data() + 4 + b / kPerWord * 4);
    });
    return EncodedBytes(in.size());
  }

 protected:
  absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t /*seed*/, absl::Span<float> out,
                          bool accumulate) const override {
    const size_t n = out.size();
    if (absl::Status s = Validate(in, n); !s.ok()) return s;
    const float t = LoadF32(in.data());
    auto decode = HaveAvx2Bmi2() ? DecodeWordsAvx2 : DecodeWords;
    ForEachChunk(n, kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      decode(in.data() + 4 + b / kPerWord * 4, e - b, t, out.data() + b, accumulate);
    });
    return absl::OkStatus();
  }

 private:
  absl::Status Validate(absl::Span<const uint8_t> in, size_t n) const {
    if (in.size() != EncodedBytes(n)) return PayloadSizeError(name(), in.size(), EncodedBytes(n), n);
    const float t = LoadF32(in.data());
    if (!(std::isfinite(t) && t > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("2bit payload threshold must be finite and > 0, got ", t));
    }
    const size_t num_words = (n + kPerWord - 1) / kPerWord;
    uint32_t bad = 0;
    for (size_t w = 0; w < num_words; ++w) {
      const uint32_t word = LoadU32(in.data() + 4 + w * 4);
      bad |= word & (word >> 1) & math::kLowBits;
    }
    if (bad != 0) return absl::InvalidArgumentError("2bit payload holds the invalid code 3");
    if (n % kPerWord != 0) {
      const uint32_t last = LoadU32(in.data() + 4 + (num_words - 1) * 4);
      if ((last >> (2 * (n % kPerWord))) != 0) {
        return absl::InvalidArgumentError("2bit payload has non-zero padding bits");
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> NewTwoBitCodec(const CodecParams& params) {
  return std::make_unique<TwoBitCodec>(params);
}

}  // namespace shardps::compression
