// Factories of the concrete codecs, one per codec file. Internal: callers use
// CreateCodec(). REQUIRES (all): ValidateCodecParams(params).ok() and
// params.name naming the codec the factory builds.
#ifndef SHARDPS_COMPRESSION_CODEC_FACTORIES_H_
#define SHARDPS_COMPRESSION_CODEC_FACTORIES_H_

#include <memory>

#include "compression/codec.h"

namespace shardps::compression {

std::unique_ptr<Codec> NewRawCodec(const CodecParams& params);        // none
std::unique_ptr<Codec> NewHalfCodec(const CodecParams& params);       // fp16, bf16
std::unique_ptr<Codec> NewTwoBitCodec(const CodecParams& params);     // 2bit
std::unique_ptr<Codec> NewOneBitCodec(const CodecParams& params);     // onebit
std::unique_ptr<Codec> NewTopKCodec(const CodecParams& params);       // topk
std::unique_ptr<Codec> NewRandomKCodec(const CodecParams& params);    // randomk

// Helpers for DecodeInto implementations.
absl::Status PayloadSizeError(std::string_view codec, size_t got, size_t want, size_t n);

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_FACTORIES_H_
