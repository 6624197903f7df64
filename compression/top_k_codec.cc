// TopKCodec ("topk"): keeps EXACTLY k = clamp(ceil(ratio*n), 1, n) entries, the
// k largest |x| with ties going to the lower index (math::TopKKey), so the set
// is unique and CPU/GPU agree bitwise. Selection never sorts the input: a
// threshold is estimated from 4096 hashed samples, one filtering pass gathers
// the candidates at or above it (per chunk, in index order), and a radix select
// on the candidates' |x| bits narrows the k-th key down to one small bucket,
// whose keys nth_element orders exactly. Payload: uint32 count, then count
// (uint32 index, float32 value) pairs with strictly ascending indices. Decode
// accepts any count <= n (error-feedback warm-up sends more than k).
#include <algorithm>
#include <array>
#include <bit>
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
// A chunk's candidate buffers grow (if they must) before each block of this
// many elements, so the gather loop itself never checks for room.
constexpr size_t kGatherBlock = 512;
// Radix select digit: 2^11 bucket counters (8 KiB) per pass over the candidates.
constexpr int kDigitBits = 11;
// A bucket this small is ordered by nth_element rather than by another digit.
constexpr size_t kResolveMax = 4096;

uint32_t AbsBits(float v) { return math::FloatBits(v) & 0x7fffffffu; }

// The candidates of one input chunk, in index order: entries [0, count) of
// index/value. The vectors' size is their capacity (the gather kernels store
// past `count`), kept across calls so that steady state does not allocate.
struct ChunkCandidates {
  std::vector<uint32_t> index;
  std::vector<float> value;
  size_t count = 0;
  uint32_t max_bits = 0;  // Largest |x| bits in the chunk, candidate or not.

  // Makes room to gather `block` more elements.
  void Reserve(size_t block) {
    if (index.size() >= count + block) return;
    const size_t capacity = std::max(2 * index.size(), count + block);
    index.resize(capacity);
    value.resize(capacity);
  }
};

// Per-thread buffers reused across calls (no allocation in steady state).
struct TopKScratch {
  std::vector<uint32_t> samples;
  std::vector<ChunkCandidates> chunks;
  std::vector<uint64_t> keys;  // Of the bucket that holds the k-th key.
};

// A gather kernel appends the indices and values of in[b, e) with |x| bits >=
// threshold to index/value, in index order, raises *max_bits to the largest
// |x| bits in in[b, e) and returns the number appended. It may write any of
// the e - b slots, so index and value need room for that many.
using GatherBlockFn = size_t (*)(const float* in, size_t b, size_t e, uint32_t threshold,
                                 uint32_t* index, float* value, uint32_t* max_bits);

// Branch-free: every element is stored in the next free slot, which only
// advances when the element passes (a few percent do, at random places).
size_t GatherBlock(const float* in, size_t b, size_t e, uint32_t threshold, uint32_t* index,
                   float* value, uint32_t* max_bits) {
  uint32_t top = *max_bits;
  size_t w = 0;
  for (size_t i = b; i < e; ++i) {
    const uint32_t bits = AbsBits(in[i]);
    index[w] = static_cast<uint32_t>(i);
    value[w] = in[i];
    w += bits >= threshold;
    top = std::max(top, bits);
  }
  *max_bits = top;
  return w;
}

#if defined(__x86_64__)
// Entry m lists, one per byte from the low end, the lanes set in the 8-bit
// mask m: the permutation that packs those lanes to the front of a vector.
constexpr std::array<uint64_t, 256> MakeLeftPackTable() {
  std::array<uint64_t, 256> table{};
  for (uint32_t mask = 0; mask < 256; ++mask) {
    int packed = 0;
    for (uint64_t lane = 0; lane < 8; ++lane) {
      if (mask >> lane & 1) table[mask] |= lane << (8 * packed++);
    }
  }
  return table;
}
alignas(64) constexpr std::array<uint64_t, 256> kLeftPack = MakeLeftPackTable();

// GatherBlock 8 lanes at a time: the passing lanes of indices and values are
// packed to the front with one permutation each and stored as a whole vector;
// the next free slot advances by their count. A branch on the hits would
// mispredict on about one vector in six. The stores run up to 7 slots past
// the hits but never past slot e - b.
__attribute__((target("avx2,popcnt"))) size_t GatherBlockAvx2(const float* in, size_t b, size_t e,
                                                              uint32_t threshold, uint32_t* index,
                                                              float* value, uint32_t* max_bits) {
  // |x| bits are <= 0x7fffffff, so a signed compare against threshold - 1 is
  // |x| >= threshold (threshold 0 keeps everything).
  const __m256i below = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i lane_index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(b)),
                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i top = _mm256_setzero_si256();
  size_t w = 0, i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(x), abs_mask);
    const uint32_t hits = static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, below))));
    const __m256i pack =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kLeftPack[hits])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(index + w),
                        _mm256_permutevar8x32_epi32(lane_index, pack));
    _mm256_storeu_ps(value + w, _mm256_permutevar8x32_ps(x, pack));
    w += static_cast<size_t>(_mm_popcnt_u32(hits));
    lane_index = _mm256_add_epi32(lane_index, _mm256_set1_epi32(8));
    top = _mm256_max_epu32(top, bits);
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  for (uint32_t lane : lanes) *max_bits = std::max(*max_bits, lane);
  return w + GatherBlock(in, i, e, threshold, index + w, value + w, max_bits);
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return have;
}
#else
size_t GatherBlockAvx2(const float*, size_t, size_t, uint32_t, uint32_t*, float*, uint32_t*) {
  return 0;
}
bool HaveAvx2() { return false; }
#endif

// |x| bits of a sampled element ranked so that about 2x k elements pass; 0
// (everything passes) for small inputs.
uint32_t EstimateThreshold(absl::Span<const float> in, size_t k, std::vector<uint32_t>& buf) {
  const size_t n = in.size();
  if (n <= 4 * kSamples) return 0;
  buf.resize(kSamples);
  for (size_t j = 0; j < kSamples; ++j) buf[j] = AbsBits(in[math::SplitMix64(j) % n]);
  const double expected = static_cast<double>(kSamples) * static_cast<double>(k) / n;
  const size_t rank = std::min(kSamples - 1, static_cast<size_t>(expected * 1.5) + 32);
  std::nth_element(buf.begin(), buf.begin() + rank, buf.end(), std::greater<uint32_t>());
  return buf[rank];
}

// Gathers the (index, value) of every x with |x| bits >= threshold into
// s.chunks, one entry per input chunk; returns how many there are in all.
size_t GatherCandidates(absl::Span<const float> in, uint32_t threshold, int threads,
                        TopKScratch& s) {
  const GatherBlockFn gather = HaveAvx2() ? GatherBlockAvx2 : GatherBlock;
  s.chunks.resize((in.size() + kChunkElements - 1) / kChunkElements);
  ChunkCandidates* chunks = s.chunks.data();
  ForEachChunk(in.size(), kChunkElements, threads, [&](size_t b, size_t e) {
    ChunkCandidates& c = chunks[b / kChunkElements];
    c.count = 0;
    c.max_bits = 0;
    for (size_t i = b; i < e; i += kGatherBlock) {
      const size_t end = std::min(e, i + kGatherBlock);
      c.Reserve(end - i);
      c.count += gather(in.data(), i, end, threshold, c.index.data() + c.count,
                        c.value.data() + c.count, &c.max_bits);
    }
  });
  size_t total = 0;
  for (const ChunkCandidates& c : s.chunks) total += c.count;
  return total;
}

// True when bits lies in [lo, lo + 2^span). REQUIRES: span <= 31.
bool InRange(uint32_t bits, uint32_t lo, int span) { return (bits - lo) >> span == 0; }

// The k-th largest TopKKey of the candidates, all of which have |x| bits >= lo.
// Radix select on |x| bits - lo, kDigitBits at a time from the top: each pass
// counts the candidates per bucket of the remaining range and keeps only the
// bucket that holds the k-th. On gradients one pass usually leaves a bucket
// of about a thousand candidates, whose keys nth_element then orders exactly
// (ties in |x| going to the lower index).
// REQUIRES: 1 <= k <= number of candidates.
uint64_t KthLargestKey(TopKScratch& s, uint32_t lo, size_t k) {
  uint32_t top = lo;
  for (const ChunkCandidates& c : s.chunks) top = std::max(top, c.max_bits);
  int span = std::bit_width(top - lo);  // All candidates lie in [lo, lo + 2^span).
  size_t rank = k;                      // The k-th key is the rank-th largest there.
  for (;;) {
    const int shift = std::max(0, span - kDigitBits);
    std::array<uint32_t, size_t{1} << kDigitBits> count{};
    for (const ChunkCandidates& c : s.chunks) {
      const float* value = c.value.data();
      for (size_t j = 0; j < c.count; ++j) {
        const uint32_t bits = AbsBits(value[j]);
        if (InRange(bits, lo, span)) ++count[(bits - lo) >> shift];
      }
    }
    size_t bucket = (size_t{1} << (span - shift)) - 1;
    while (count[bucket] < rank) rank -= count[bucket--];
    lo += static_cast<uint32_t>(bucket) << shift;
    span = shift;
    if (span == 0 || count[bucket] <= kResolveMax) break;
  }
  s.keys.clear();
  for (const ChunkCandidates& c : s.chunks) {
    for (size_t j = 0; j < c.count; ++j) {
      if (!InRange(AbsBits(c.value[j]), lo, span)) continue;
      s.keys.push_back(math::TopKKey(c.value[j], c.index[j]));
    }
  }
  std::nth_element(s.keys.begin(), s.keys.begin() + (rank - 1), s.keys.end(),
                   std::greater<uint64_t>());
  return s.keys[rank - 1];
}

// Writes the candidates whose key is >= kth, which must be exactly k of them,
// as (index, value) pairs in index order.
void WritePairs(const TopKScratch& s, uint64_t kth, size_t k, uint8_t* pairs) {
  size_t w = 0;
  for (const ChunkCandidates& c : s.chunks) {
    const uint32_t* index = c.index.data();
    const float* value = c.value.data();
    // Branch-free like GatherBlock while a store cannot pass pair k - 1 (about
    // half the candidates are kept, unpredictably); the chunk in which the
    // output fills up checks each store.
    const size_t unchecked = std::min(c.count, w < k ? k - w : 0);
    size_t j = 0;
    for (; j < unchecked; ++j) {
      StoreU32(pairs + 8 * w, index[j]);
      StoreF32(pairs + 8 * w + 4, value[j]);
      w += math::TopKKey(value[j], index[j]) >= kth;
    }
    for (; j < c.count; ++j) {
      if (math::TopKKey(value[j], index[j]) < kth) continue;
      if (w < k) {
        StoreU32(pairs + 8 * w, index[j]);
        StoreF32(pairs + 8 * w + 4, value[j]);
      }
      ++w;
    }
  }
  CHECK_EQ(w, k) << "top-k selection kept the wrong number of entries";
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
    uint32_t threshold = EstimateThreshold(in, k, s.samples);
    if (GatherCandidates(in, threshold, params().num_threads, s) < k) {
      threshold = 0;  // Unlucky sample: every element is a candidate.
      GatherCandidates(in, threshold, params().num_threads, s);
    }
    WritePairs(s, KthLargestKey(s, threshold, k), k, pairs);
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
