#include "compression/codec.h"

#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/codec_factories.h"

namespace shardps::compression {
namespace {

using Factory = std::unique_ptr<Codec> (*)(const CodecParams&);

// The registry: codec name -> factory. Names match CodecNames().
const absl::flat_hash_map<std::string, Factory>& Registry() {
  static const auto* registry = new absl::flat_hash_map<std::string, Factory>{
      {"none", &NewRawCodec},     {"fp16", &NewHalfCodec}, {"bf16", &NewHalfCodec},
      {"2bit", &NewTwoBitCodec},  {"onebit", &NewOneBitCodec},
      {"topk", &NewTopKCodec},    {"randomk", &NewRandomKCodec},
  };
  return *registry;
}

}  // namespace

absl::Status PayloadSizeError(std::string_view codec_name, size_t got, size_t want, size_t n) {
  const absl::string_view codec(codec_name.data(), codec_name.size());
  return absl::InvalidArgumentError(absl::StrCat(codec, " payload is ", got, " bytes, expected ",
                                                 want, " for ", n, " values"));
}

absl::Status Codec::CheckEncodeArgs(size_t n, size_t out_bytes) const {
  if (n > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(params().name, ": ", n, " values exceed the limit of ", kMaxElements));
  }
  if (out_bytes < EncodedBytes(n)) {
    return absl::InvalidArgumentError(absl::StrCat(params().name, ": output buffer of ", out_bytes,
                                                   " bytes, need ", EncodedBytes(n)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecParams& params) {
  SHARDPS_RETURN_IF_ERROR(ValidateCodecParams(params));
  auto it = Registry().find(params.name);
  if (it == Registry().end()) {
    return absl::InvalidArgumentError(absl::StrCat("no codec registered as ", params.name));
  }
  return it->second(params);
}

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view spec) {
  SHARDPS_ASSIGN_OR_RETURN(CodecParams params, ParseCodecSpec(spec));
  return CreateCodec(params);
}

}  // namespace shardps::compression
