#include "common/shard_map.h"

#include <algorithm>

namespace shardps {

bool HoldsCopy(const PartitionInfo& p, uint32_t server) {
  return p.server() == server || std::find(p.backups().begin(), p.backups().end(), server) != p.backups().end();
}

bool MarkedDraining(const ShardMap& map, uint32_t index) {
  return std::any_of(map.servers().begin(), map.servers().end(),
                     [index](const ServerInfo& s) { return s.index() == index && s.draining(); });
}

}  // namespace shardps
