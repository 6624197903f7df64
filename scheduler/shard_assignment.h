// Cutting tensors into partitions and placing them on servers.
#ifndef SHARDPS_SCHEDULER_SHARD_ASSIGNMENT_H_
#define SHARDPS_SCHEDULER_SHARD_ASSIGNMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"

namespace shardps {

// Checks names (non-empty, unique), shapes (positive dims) and dtypes.
absl::Status ValidateTensorSpecs(const std::vector<TensorSpec>& tensors);

// Number of elements of a tensor (product of its shape).
uint64_t ElementCount(const TensorSpec& tensor);

// Builds the shard map of `epoch`: each tensor is cut into the fewest
// near-equal partitions of at most `partition_bytes`, then partitions are
// placed largest first on the server with the fewest primary bytes so far
// (ties to the lower index), so the primaries' load of any two servers differs
// by at most the largest partition. With `replication` r > 1 each partition
// then gets r - 1 backups on other servers, each on the server holding the
// fewest bytes in all (primaries and backups). Deterministic.
absl::StatusOr<ShardMap> BuildShardMap(const std::vector<TensorSpec>& tensors,
                                       const std::vector<ServerInfo>& servers,
                                       uint64_t partition_bytes, uint64_t epoch, uint32_t replication = 1);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SHARD_ASSIGNMENT_H_
