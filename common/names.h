// The names a job gives its tensors, codecs and barriers. They travel in
// protobuf string fields, which must be UTF-8 (protobuf drops a message that
// is not, with no word of which field), and into every shard map.
#ifndef SHARDPS_COMMON_NAMES_H_
#define SHARDPS_COMMON_NAMES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardps {

inline constexpr size_t kMaxNameBytes = 4096;

// The offset of the first byte of `s` that is not part of a well-formed
// UTF-8 sequence (overlong forms, surrogates and code points past U+10FFFF
// included), or s.size().
size_t Utf8Prefix(absl::string_view s);

// `s` as UTF-8 of at most `max_bytes` (a text that is shown, not a name):
// each byte that breaks the encoding replaced by U+FFFD, and cut after the
// last whole character that fits.
std::string ToUtf8(absl::string_view s, size_t max_bytes);

// `n` and the noun that counts it in a log line: Counted(1, "partition",
// "partitions") is "1 partition", Counted(3, ...) "3 partitions".
std::string Counted(uint64_t n, absl::string_view one, absl::string_view many);

// InvalidArgument naming `what` (e.g. "tensor name") unless `name` is UTF-8
// and at most kMaxNameBytes long.
absl::Status CheckName(absl::string_view what, absl::string_view name);

}  // namespace shardps

#endif  // SHARDPS_COMMON_NAMES_H_
