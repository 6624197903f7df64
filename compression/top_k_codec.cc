// TopKCodec ("topk"): keeps EXACTLY k = clamp(ceil(ratio*n), 1, n) entries, the
// k largest |x| with ties going to the lower index (math::TopKKey), so the set
// is unique and CPU/GPU agree bitwise. Selection never sorts the input: a
// threshold is estimated from 4096 hashed samples, one filtering pass gathers
// the candidates above it (in index order), and nth_element over the
// candidates finds the exact k-th key. Payload: uint32 count, then count
// (uint32 index, float32 value) pairs with strictly ascending indices. Decode
// accepts any count <= n (error-feedback warm-up sends more than k).
#include <algorithm>
#include <functional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "compression/codec_factories.h"
#include "compression/codec_math.h"
#include "compression/kernel_util.h"
#include "glog/logging.h"

namespace shardps::compression {
namespace {

constexpr size_t kSamples = 4096;

uint32_t AbsBits(float v) { return math::FloatBits(v) & 0x7fffffffu; }

// Per-thread buffers reused across calls (no allocation in steady state).
struct TopKScratch {
  std::vector<uint32_t> index;
  std::vector<float> value;
  std::vector<uint64_t> keys;
  std::vector<size_t> chunk_offset;
  // Single-pass gather: each chunk's candidates, concatenated afterwards.
  std::vector<std::vector<uint32_t>> chunk_index;
  std::vector<std::vector<float>> chunk_value;
};

#if defined(__x86_64__)
// Appends the indices and values of in[b, e) with |x| bits >= threshold, in
// index order: 8 lanes compared at once, the few hits extracted by bit scan.
__attribute__((target("avx2,bmi"))) void GatherChunkAvx2(const float* in, size_t b, size_t e,
                                                         uint32_t threshold, std::vector<uint32_t>& index,
                                                         std::vector<float>& value) {
  // |x| bits are <= 0x7fffffff, so a signed compare against threshold - 1 is
  // |x| >= threshold (threshold 0 keeps everything).
  const __m256i below = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), abs_mask);
    uint32_t hits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, below))));
    while (hits != 0) {
      const uint32_t lane = _tzcnt_u32(hits);
      index.push_back(static_cast<uint32_t>(i + lane));
      value.push_back(in[i + lane]);
      hits &= hits - 1;
    }
  }
  for (; i < e; ++i) {
    if (AbsBits(in[i]) >= threshold) {
      index.push_back(static_cast<uint32_t>(i));
      value.push_back(in[i]);
    }
  }
}

bool HaveAvx2Bmi() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  return have;
}

// GatherCandidates in one pass over the input (the two-pass version reads it
// twice); same candidates in the same order.
size_t GatherCandidatesOnePass(absl::Span<const float> in, uint32_t threshold, int threads, TopKScratch& s) {
  const size_t num_chunks = (in.size() + kChunkElements - 1) / kChunkElements;
  s.chunk_index.resize(num_chunks);
  s.chunk_value.resize(num_chunks);
  auto* chunk_index = s.chunk_index.data();
  auto* chunk_value = s.chunk_value.data();
  ForEachChunk(in.size(), kChunkElements, threads, [&](size_t b, size_t e) {
    const size_t c = b / kChunkElements;
    chunk_index[c].clear();
    chunk_value[c].clear();
    GatherChunkAvx2(in.data(), b, e, threshold, chunk_index[c], chunk_value[c]);
  });
  size_t total = 0;
  for (size_t c = 0; c < num_chunks; ++c) total += s.chunk_index[c].size();
  s.index.resize(total);
  s.value.resize(total);
  size_t w = 0;
  for (size_t c = 0; c < num_chunks; ++c) {
    std::copy(s.chunk_index[c].begin(), s.chunk_index[c].end(), s.index.begin() + w);
    std::copy(s.chunk_value[c].begin(), s.chunk_value[c].end(), s.value.begin() + w);
    w += s.chunk_index[c].size();
  }
  return total;
}
#else
bool HaveAvx2Bmi() { return false; }
size_t GatherCandidatesOnePass(absl::Span<const float>, uint32_t, int, TopKScratch&) { return 0; }
#endif

// |x| bits of a sampled element ranked so that about 2x k elements pass; 0
// (everything passes) for small inputs.
uint32_t EstimateThreshold(absl::Span<const float> in, size_t k, std::vector<uint64_t>& buf) {
  const size_t n = in.size();
  if (n <= 4 * kSamples) return 0;
  buf.resize(kSamples);
  for (size_t j = 0; j < kSamples; ++j) buf[j] = AbsBits(in[math::SplitMix64(j) % n]);
  const double expected = static_cast<double>(kSamples) * static_cast<double>(k) / n;
  const size_t rank = std::min(kSamples - 1, static_cast<size_t>(expected * 1.5) + 32);
  std::nth_element(buf.begin(), buf.begin() + rank, buf.end(), std::greater<uint64_t>());
  return static_cast<uint32_t>(buf[rank]);
}

// Gathers (index, value) of all x with |x| bits >= threshold, in index order.
size_t GatherCandidates(absl::Span<const float> in, uint32_t threshold, int threads,
                        TopKScratch& s) {
  const size_t num_chunks = (in.size() + kChunkElements - 1) / kChunkElements;
  s.chunk_offset.assign(num_chunks + 1, 0);
  size_t* offset = s.chunk_offset.data();
  ForEachChunk(in.size(), kChunkElements, threads, [&](size_t b, size_t e) {
    size_t count = 0;
    for (size_t i = b; i < e; ++i) count += AbsBits(in[i]) >= threshold;
    offset[b / kChunkElements + 1] = count;
  });
  for (size_t c = 0; c < num_chunks; ++c) offset[c + 1] += offset[c];
  s.index.resize(offset[num_chunks]);
  s.value.resize(offset[num_chunks]);
  uint32_t* index = s.index.data();
  float* value = s.value.data();
  ForEachChunk(in.size(), kChunkElements, threads, [&](size_t b, size_t e) {
    size_t w = offset[b / kChunkElements];
    for (size_t i = b; i < e; ++i) {
      if (AbsBits(in[i]) >= threshold) {
        index[w] = static_cast<uint32_t>(i);
        value[w++] = in[i];
      }
    }
  });
  return offset[num_chunks];
}

class TopKCodec final : public Codec {
 public:
  explicit TopKCodec(const CodecParams& params) : Codec(params) {}

  size_t EncodedBytes(size_t n) const override { return 4 + 8 * K(n); }
  size_t min_elements() const override { return std::max<size_t>(1024, 1.0 / params().ratio); }

  absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t /*seed*/,
                                absl::Span<uint8_t> out) const override {
    if (absl::Status s = CheckEncodeArgs(in.size(), out.size()); !s.ok()) return s;
    const size_t k = K(in.size());
    StoreU32(out.data(), static_cast<uint32_t>(k));
    if (k > 0) Select(in, k, out.data() + 4);
    return EncodedBytes(in.size());
  }

 protected:
  absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t /*seed*/, absl::Span<float> out,
                          bool accumulate) const override {
    if (absl::Status s = Validate(in, out.size()); !s.ok()) return s;
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    const size_t count = LoadU32(in.data());
    for (size_t j = 0; j < count; ++j) {
      const uint8_t* pair = in.data() + 4 + 8 * j;
      out[LoadU32(pair)] += LoadF32(pair + 4);
    }
    return absl::OkStatus();
  }

 private:
  size_t K(size_t n) const { return math::SparseCount(n, params().ratio); }

  // Writes the k (index, value) pairs of the top-k set in index order.
  void Select(absl::Span<const float> in, size_t k, uint8_t* pairs) const {
    thread_local TopKScratch s;
    auto gather = HaveAvx2Bmi() ? GatherCandidatesOnePass : GatherCandidates;
    size_t c = gather(in, EstimateThreshold(in, k, s.keys), params().num_threads, s);
    if (c < k) c = gather(in, 0, params().num_threads, s);  // Unlucky sample.
    uint64_t kth = 0;
    if (c > k) {
      s.keys.resize(c);
      for (size_t j = 0; j < c; ++j) s.keys[j] = math::TopKKey(s.value[j], s.index[j]);
      std::nth_element(s.keys.begin(), s.keys.begin() + (k - 1), s.keys.end(),
                       std::greater<uint64_t>());
      kth = s.keys[k - 1];
    }
    size_t w = 0;
    for (size_t j = 0; j < c; ++j) {
      if (math::TopKKey(s.value[j], s.index[j]) < kth) continue;
      StoreU32(pairs + 8 * w, s.index[j]);
      StoreF32(pairs + 8 * w + 4, s.value[j]);
      ++w;
    }
    CHECK_EQ(w, k) << "top-k selection kept the wrong number of entries";
  }

  absl::Status Validate(absl::Span<const uint8_t> in, size_t n) const {
    if (n > kMaxElements) return absl::InvalidArgumentError("topk: too many values");
    if (in.size() < 4) return PayloadSizeError(name(), in.size(), 4, n);
    const size_t count = LoadU32(in.data());
    if (count > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("topk payload count ", count, " exceeds ", n, " values"));
    }
    if (in.size() != 4 + 8 * count) return PayloadSizeError(name(), in.size(), 4 + 8 * count, n);
    int64_t previous = -1;
    for (size_t j = 0; j < count; ++j) {
      const int64_t index = LoadU32(in.data() + 4 + 8 * j);
      if (index >= static_cast<int64_t>(n) || index <= previous) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topk payload entry ", j, " has index ", index,
            index >= static_cast<int64_t>(n) ? " out of range for " : " not above the previous in ",
            index >= static_cast<int64_t>(n) ? absl::StrCat(n, " values") : "ascending order"));
      }
      previous = index;
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> NewTopKCodec(const CodecParams& params) {
  return std::make_unique<TopKCodec>(params);
}

}  // namespace shardps::compression
