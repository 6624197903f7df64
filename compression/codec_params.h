// CodecParams: a parsed codec spec such as "2bit:threshold=0.5" or
// "topk:ratio=0.01". Plain value type, copyable, thread-compatible.
//
// Spec grammar: NAME[:KEY=VALUE[,KEY=VALUE]...]. Names and the keys each accepts:
//   none, fp16, bf16, onebit          (no keys)
//   2bit     threshold=<finite > 0>   default 0.5
//            scale=<finite >= 0>      default 0 (off); > 0: adaptive, each
//                                     message's threshold scale * its mean |x|
//   topk     ratio=<(0, 1]>           default 0.01
//   randomk  ratio=<(0, 1]>           default 0.01
//            unbiased=<0|1>           default 1 (scale kept values by n/k)
// Every codec also accepts threads=<int >= 0> (CPU parallelism, 0 = all cores).
#ifndef SHARDPS_COMPRESSION_CODEC_PARAMS_H_
#define SHARDPS_COMPRESSION_CODEC_PARAMS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace shardps::compression {

struct CodecParams {
  std::string name = "none";
  float threshold = 0.5f;  // 2bit only: fixed threshold t (MXNet's 2-bit).
  // 2bit only: when > 0, each message's threshold is scale * mean |x| of that
  // message (t still travels in the payload), instead of the fixed one.
  float scale = 0.0f;
  float ratio = 0.01f;     // topk, randomk.
  bool unbiased = true;    // randomk only.
  int num_threads = 0;     // CPU threads for large inputs; 0 = all cores.

  // Canonical spec string; ParseCodecSpec(ToString()) yields an equal value.
  std::string ToString() const;
};

// Parses `spec`; the error names the offending part and lists what is allowed.
absl::StatusOr<CodecParams> ParseCodecSpec(std::string_view spec);

// Checks ranges (ParseCodecSpec calls it; use it for hand-built params).
absl::Status ValidateCodecParams(const CodecParams& params);

// Names of all registered codecs, in a stable order.
const std::vector<std::string>& CodecNames();

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_PARAMS_H_
