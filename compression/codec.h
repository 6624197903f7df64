// Codec: compresses one fp32 gradient message into a byte payload and back.
// Created by name from a CodecParams (see codec_params.h for the spec syntax);
// the wire formats are described in DESIGN_NOTES.md.
//
// Contract shared by all codecs:
//  * n (the element count) is never on the wire: the receiver knows it from
//    out.size(). Payloads are little-endian, unaligned access is fine.
//  * EncodedBytes(n) is the EXACT payload size; Encode returns that value.
//  * `seed` comes from the caller (derived from partition and round) and must
//    be equal on encoder and decoder; only randomk uses it.
//  * Decode/DecodeAdd validate the whole payload (size, header values,
//    codes, indices) before writing anything; on error `out` is unchanged and
//    the status is InvalidArgument saying what is wrong.
// Thread safety: all methods are const and may be called concurrently; large
// inputs are split over an internal thread pool (params().num_threads).
#ifndef SHARDPS_COMPRESSION_CODEC_H_
#define SHARDPS_COMPRESSION_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "compression/codec_params.h"

namespace shardps::compression {

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  std::string_view name() const { return params_.name; }
  const CodecParams& params() const { return params_; }

  // Exact payload size in bytes for n values.
  virtual size_t EncodedBytes(size_t n) const = 0;
  // True when payloads of the same n and seed can be summed as fp32 arrays
  // without decoding (none, randomk): the server may aggregate them directly.
  virtual bool server_can_aggregate() const { return false; }
  // Below this many values callers should send with codec "none" instead.
  virtual size_t min_elements() const = 0;

  // Writes the payload for `in` to the front of `out`; returns its size.
  // InvalidArgument when out.size() < EncodedBytes(in.size()) or
  // in.size() > kMaxElements.
  virtual absl::StatusOr<size_t> Encode(absl::Span<const float> in, uint64_t seed,
                                        absl::Span<uint8_t> out) const = 0;
  // out = decoded payload; n = out.size().
  absl::Status Decode(absl::Span<const uint8_t> in, uint64_t seed, absl::Span<float> out) const {
    return DecodeInto(in, seed, out, /*accumulate=*/false);
  }
  // out += decoded payload (the server accumulates with this).
  absl::Status DecodeAdd(absl::Span<const uint8_t> in, uint64_t seed,
                         absl::Span<float> out) const {
    return DecodeInto(in, seed, out, /*accumulate=*/true);
  }

  static constexpr size_t kMaxElements = size_t{1} << 31;

 protected:
  explicit Codec(CodecParams params) : params_(std::move(params)) {}
  virtual absl::Status DecodeInto(absl::Span<const uint8_t> in, uint64_t seed,
                                  absl::Span<float> out, bool accumulate) const = 0;
  // Shared argument check for Encode implementations.
  absl::Status CheckEncodeArgs(size_t n, size_t out_bytes) const;

 private:
  const CodecParams params_;
};

// Creates the codec named by params.name (InvalidArgument if unknown or out of
// range).
absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecParams& params);
// Convenience: ParseCodecSpec + CreateCodec.
absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view spec);

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_H_
