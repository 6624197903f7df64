// OneBitCodec ("onebit", signSGD with a scale): v < 0 becomes -s, anything else
// +s, where s = mean |v| over the message (summed in the fixed order of
// math::kSumBlock so threads and the GPU agree bitwise). Payload: float32 s,
// then ceil(n/32) uint32 words; bit i%32 of word i/32 set means negative.
// Encode refuses NaN/Inf values (their s is not finite); Decode rejects a
// NaN/Inf/negative s and non-zero padding bits.
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "compression/codec_factories.h"
#include "compression/codec_math.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

constexpr size_t kPerWord = 32;

// 32 strided lanes summed in double, then folded like a warp shuffle-down.
template <typename T>
double LaneAbsSum(const T* x, size_t len) {
  double lanes[math::kSumLanes] = {};
  size_t i = 0;
  for (; i + math::kSumLanes <= len; i += math::kSumLanes) {
    for (size_t l = 0; l < math::kSumLanes; ++l) lanes[l] += std::fabs(static_cast<double>(x[i + l]));
  }
  for (size_t l = 0; i + l < len; ++l) lanes[l] += std::fabs(static_cast<double>(x[i + l]));
  for (size_t off = math::kSumLanes / 2; off > 0; off /= 2) {
    for (size_t l = 0; l < off; ++l) lanes[l] += lanes[l + off];
  }
  return lanes[0];
}

void UnpackSigns(const uint8_t* words, size_t n, float s, float* out, bool accumulate);

#if defined(__x86_64__)
// LaneAbsSum with AVX2: the 32 lanes live in 8 vectors of 4 doubles, each lane
// accumulating the same values in the same order, so the sum is bitwise the
// scalar one.
__attribute__((target("avx2"))) double LaneAbsSumAvx2(const float* x, size_t len) {
  const __m256d sign = _mm256_set1_pd(-0.0);
  __m256d acc[math::kSumLanes / 4];
  for (auto& a : acc) a = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + math::kSumLanes <= len; i += math::kSumLanes) {
    for (size_t v = 0; v < math::kSumLanes / 4; ++v) {
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * v));
      acc[v] = _mm256_add_pd(acc[v], _mm256_andnot_pd(sign, d));
    }
  }
  alignas(32) double lanes[math::kSumLanes];
  for (size_t v = 0; v < math::kSumLanes / 4; ++v) _mm256_store_pd(lanes + 4 * v, acc[v]);
  for (size_t l = 0; i + l < len; ++l) lanes[l] += std::fabs(static_cast<double>(x[i + l]));
  for (size_t off = math::kSumLanes / 2; off > 0; off /= 2) {
    for (size_t l = 0; l < off; ++l) lanes[l] += lanes[l + off];
  }
  return lanes[0];
}

// PackSigns with AVX2: bit i of a word is `in[i] < 0` (ordered compare: NaN
// and -0 give 0, as the scalar `<`).
__attribute__((target("avx2"))) void PackSignsAvx2(const float* in, size_t n, uint8_t* words) {
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + kPerWord <= n; i += kPerWord) {
    uint32_t word = 0;
    for (int q = 0; q < 4; ++q) {
      const __m256 x = _mm256_loadu_ps(in + i + 8 * q);
      word |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ))) << (8 * q);
    }
    StoreU32(words + i / kPerWord * 4, word);
  }
  if (i < n) {
    uint32_t word = 0;
    for (size_t j = 0; i + j < n; ++j) word |= static_cast<uint32_t>(in[i + j] < 0.0f) << j;
    StoreU32(words + i / kPerWord * 4, word);
  }
}

// UnpackSigns with AVX2: -s where the bit is set, else +s, as the scalar.
__attribute__((target("avx2"))) void UnpackSignsAvx2(const uint8_t* words, size_t n, float s, float* out,
                                                     bool accumulate) {
  const __m256 pos_s = _mm256_set1_ps(s), neg_s = _mm256_set1_ps(-s);
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  size_t i = 0;
  for (; i + kPerWord <= n; i += kPerWord) {
    const uint32_t word = LoadU32(words + i / kPerWord * 4);
    for (int q = 0; q < 4; ++q) {
      const __m256i bits = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>((word >> (8 * q)) & 0xffu)), lane_bits);
      const __m256 negative = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bits, lane_bits));
      __m256 v = _mm256_blendv_ps(pos_s, neg_s, negative);
      float* o = out + i + 8 * q;
      if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(o), v);
      _mm256_storeu_ps(o, v);
    }
  }
  if (i < n) UnpackSigns(words + i / kPerWord * 4, n - i, s, out + i, accumulate);
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}
#else
void UnpackSignsAvx2(const uint8_t*, size_t, float, float*, bool) {}
double LaneAbsSumAvx2(const float*, size_t) { return 0; }
void PackSignsAvx2(const float*, size_t, uint8_t*) {}
bool HaveAvx2() { return false; }
#endif

void PackSigns(const float* in, size_t n, uint8_t* words) {
  PackCodes<1>(in, n, [](float v) { return static_cast<uint32_t>(v < 0.0f); }, words);
}

void UnpackSigns(const uint8_t* words, size_t n, float s, float* out, bool accumulate) {
  for (size_t base = 0; base < n; base += kPerWord) {
    const uint32_t word = LoadU32(words + base / kPerWord * 4);
    const size_t len = n - base < kPerWord ? n - base : kPerWord;
    for (size_t i = 0; i < len; ++i) {
      const float v = ((word >> i) & 1u) ? -s : s;
      out[base + i] = accumulate ? out[base + i] + v : v;
    }
  }
}

class OneBitCodec final : public Codec {
 public:
  explicit OneBitCodec(const CodecParams& params) : Codec(params) {}

  size_t EncodedBytes(size_t n) const override { return 4 + (n + kPerWord - 1) / kPerWord * 4; }
  size_t min_elements() const override { return 1024; }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t /*seed*/,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    const float scale = MeanAbs(in);
    // A NaN or infinite value makes the scale non-finite, which Decode refuses.
    if (!std::isfinite(scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("onebit cannot encode non-finite values (mean |x| of ", in.size(), " values is ", scale, ")"));
    }
    StoreF32(out.data(), scale);
    auto pack = HaveAvx2() ? PackSignsAvx2 : PackSigns;
    ForEachChunk(in.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      pack(in.data() + b, e - b, out.data() + 4 + b / kPerWord * 4);
    });
    return EncodedBytes(in.size());
  }

 protected:
  absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t /*seed*/, absl::Span<float> out,
                          bool accumulate) const override {
    const size_t n = out.size();
    if (in.size() != EncodedBytes(n)) return PayloadSizeError(name(), in.size(), EncodedBytes(n), n);
    const float s = LoadF32(in.data());
    if (!(std::isfinite(s) && s >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("onebit payload scale must be finite and >= 0, got ", s));
    }
    if (n % kPerWord != 0 && (LoadU32(in.data() + in.size() - 4) >> (n % kPerWord)) != 0) {
      return absl::InvalidArgumentError("onebit payload has non-zero padding bits");
    }
    auto unpack = HaveAvx2() ? UnpackSignsAvx2 : UnpackSigns;
    ForEachChunk(n, kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      unpack(in.data() + 4 + b / kPerWord * 4, e - b, s, out.data() + b, accumulate);
    });
    return absl::OkStatus();
  }

 private:
  float MeanAbs(absl::Span<const float> in) const {
    if (in.empty()) return 0.0f;
    thread_local std::vector<double> block_sums;
    const size_t num_blocks = (in.size() + math::kSumBlock - 1) / math::kSumBlock;
    block_sums.resize(num_blocks);
    double* sums = block_sums.data();  // Lambdas must not name the thread_local.
    auto lane_sum = HaveAvx2() ? LaneAbsSumAvx2 : LaneAbsSum<float>;
    ForEachChunk(in.size(), kChunkElements, params().num_threads, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; i += math::kSumBlock) {
        const size_t len = e - i < math::kSumBlock ? e - i : math::kSumBlock;
        sums[i / math::kSumBlock] = lane_sum(in.data() + i, len);
      }
    });
    return static_cast<float>(LaneAbsSum(sums, num_blocks) /
                              static_cast<double>(in.size()));
  }
};

}  // namespace

std::unique_ptr<Codec> NewOneBitCodec(const CodecParams& params) {
  return std::make_unique<OneBitCodec>(params);
}

}  // namespace shardps::compression
