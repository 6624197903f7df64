// The files of a checkpoint and the rules for trusting them.
//
// Layout: DIR/round-<R>/ (R zero-padded to 12 digits) holds one file per
// partition and writer, partition-<ID>.server-<I>.job-<J>.ckpt (a
// PartitionCheckpoint; J the job id in 16 hex digits; a partition handed
// from one primary to another may be written by both, each listing its own
// file, and a job resumed from an earlier round writes files of its own),
// and one manifest
// per server that was primary for some partition at round R,
// server-<I>.manifest (a CheckpointManifest, proto/checkpoint.proto). Every
// file is a sealed record written durably (common/durable_file.h); a server
// writes its manifest only after its partition files, and a round is
// complete once its manifests cover every partition of the shard map they
// name. A torn, corrupt or missing file makes the round unusable, and the
// error names the file. A round directory written into by two jobs (one
// resumed from an earlier round writes the later ones again) is read as the
// checkpoint of the job whose manifest was written last
// (CheckpointManifest.job), never a mix: the other job's manifests name
// files this one may have rewritten. Stateless functions; safe from any
// thread.
#ifndef SHARDPS_COMMON_CHECKPOINT_STORE_H_
#define SHARDPS_COMMON_CHECKPOINT_STORE_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"

namespace shardps {

std::string CheckpointRoundDir(const std::string &dir, uint64_t round);

// Writes `state` as job `job`'s server `server`'s file of its partition in
// `round_dir` (created if needed) and returns the manifest entry describing it.
absl::StatusOr<CheckpointManifest::Entry> WritePartitionCheckpoint(const std::string &round_dir,
                                                                   const PartitionCheckpoint &state, uint32_t server,
                                                                   uint64_t job);

// Writes `manifest` as server manifest.server()'s manifest in `round_dir`.
// REQUIRES: the files its entries name are written.
absl::Status WriteCheckpointManifest(const std::string &round_dir, const CheckpointManifest &manifest);

// Checks that `round_dir` holds a complete checkpoint: every manifest
// intact, every partition of the map listed, every listed file present with
// the manifest's checksum. Returns the round. FailedPrecondition if it is
// incomplete (a manifest or an entry missing), DataLoss or NotFound if a
// file is corrupt or gone; the message names the file.
absl::StatusOr<uint64_t> VerifyCheckpointRound(const std::string &round_dir);

struct RestorePoint {
  std::string round_dir;
  uint64_t round = 0;
};

// `dir` is a round directory (used as it is) or a checkpoint directory: the
// latest complete round is taken, and a later incomplete one (a writer that
// died mid-checkpoint) is skipped with a warning. A corrupt file in the round
// taken is an error; so is a directory with no complete round.
absl::StatusOr<RestorePoint> FindRestorePoint(const std::string &dir);

// Makes `config` restore a whole cluster from FindRestorePoint(dir): sets
// checkpoint.restore_dir (absolute) and checkpoint.restore_round, which the
// scheduler hands to every node.
absl::Status SetRestorePoint(const std::string &dir, ClusterConfig *config);

// The partitions that the manifests in `round_dir` of job `job`'s servers
// other than `server` list (none where there is none, or one cannot be read).
std::set<uint64_t> PartitionsListedElsewhere(const std::string &round_dir, uint32_t server, uint64_t job);

// Partition `partition_id`'s state from a verified round: found through the
// manifests, its checksum checked again and its record unsealed.
absl::StatusOr<PartitionCheckpoint> LoadPartitionCheckpoint(const std::string &round_dir, uint64_t partition_id);

}  // namespace shardps

#endif  // SHARDPS_COMMON_CHECKPOINT_STORE_H_
