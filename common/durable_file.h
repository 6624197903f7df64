// Files that survive a crash: written whole or not at all, and read back only
// when intact. Used for the scheduler's --state-dir (and checkpoints).
//
// A sealed record is [magic "SPSREC1\n"][kind, 16 bytes padded][u64 length]
// [u64 FNV-1a 64 of the payload][payload]: a torn, truncated or foreign file
// is refused with a message naming the file and what is wrong.
#ifndef SHARDPS_COMMON_DURABLE_FILE_H_
#define SHARDPS_COMMON_DURABLE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardps {

// Writes `contents` to a temporary file beside `path` (named for this
// process), fsyncs it, renames it over `path` and fsyncs the directory, so a
// reader sees the old file or the new one.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents);

// The whole file; NotFound if it does not exist.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// FNV-1a 64 of `data`: the checksum of sealed records and checkpoint files.
uint64_t Fnv1a64(absl::string_view data);

// Frames `payload` as a record of `kind` (at most 16 characters).
std::string SealRecord(absl::string_view kind, absl::string_view payload);
// The payload of a record of `kind` read from `path` (named in errors);
// DataLoss if the file is not such a record or its checksum fails.
absl::StatusOr<std::string> UnsealRecord(absl::string_view kind, absl::string_view data, const std::string& path);

}  // namespace shardps

#endif  // SHARDPS_COMMON_DURABLE_FILE_H_
