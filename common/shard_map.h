// Questions about a shard map (proto/cluster.proto) that the scheduler, the
// servers and the command-line tools each ask. Stateless; safe from any
// thread.
#ifndef SHARDPS_COMMON_SHARD_MAP_H_
#define SHARDPS_COMMON_SHARD_MAP_H_

#include <cstdint>

#include "proto/cluster.pb.h"

namespace shardps {

// Whether `server` holds a copy of `p` (its primary or a backup).
bool HoldsCopy(const PartitionInfo& p, uint32_t server);

// Whether `map` marks server `index` draining (`shardps drain`).
bool MarkedDraining(const ShardMap& map, uint32_t index);

}  // namespace shardps

#endif  // SHARDPS_COMMON_SHARD_MAP_H_
