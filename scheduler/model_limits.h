// How big a model the cluster accepts: the config's limits.max_model_bytes,
// and what each server said at registration it can hold. Checked by
// DefineTensors before a shard map exists, so no server is ever asked to
// allocate what it cannot (a 100 GB model is refused with a message, not a
// std::bad_alloc on a server). Thread-compatible free functions.
#ifndef SHARDPS_SCHEDULER_MODEL_LIMITS_H_
#define SHARDPS_SCHEDULER_MODEL_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "proto/cluster.pb.h"
#include "proto/config.pb.h"

namespace shardps {

// Refuses tensors whose weights together exceed limits.max_model_bytes
// (sizes summed without overflow). REQUIRES: ValidateTensorSpecs passed.
absl::Status CheckModelSize(const std::vector<TensorSpec>& tensors, const ClusterConfig& config);

// Bytes a server allocates per element it holds (primary or backup):
// weights, optimizer state, the round accumulator.
uint64_t ServerBytesPerElement(const ClusterConfig& config);

// The most bytes a shard map may take when the tensors are defined. Nodes
// receive it (the map watch, DefineTensors, Status) within gRPC's default
// 4 MiB per message, and it grows after (worker keys, copy moves, where each
// copy was listed; Status adds the nodes): half leaves room for that.
inline constexpr size_t kMaxShardMapBytes = size_t{2} << 20;

// Refuses `map` if it takes more than kMaxShardMapBytes serialised.
absl::Status CheckShardMapSize(const ShardMap& map);

// Refuses `map` if a server would hold more than it reported it can
// (`capacity` by server index; missing or 0: unknown, not checked).
absl::Status CheckServerCapacity(const ShardMap& map, const ClusterConfig& config,
                                 const absl::flat_hash_map<uint32_t, uint64_t>& capacity);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_MODEL_LIMITS_H_
