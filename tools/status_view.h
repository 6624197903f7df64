// What `shardps status` prints: a table of the cluster (nodes, their state
// and heartbeat age, the shard-map epoch each server serves) or one JSON
// object per snapshot for scripts.
#ifndef SHARDPS_TOOLS_STATUS_VIEW_H_
#define SHARDPS_TOOLS_STATUS_VIEW_H_

#include <string>

#include "proto/cluster.pb.h"

namespace shardps {

// The table: one header line (consistency, servers, workers, epoch,
// partitions, nodes alive and dead), then one line per node: role, index,
// address, bytes served (servers), state (alive, SILENT, DEAD), heartbeat age,
// and for a server still on an older epoch "behind".
std::string StatusTable(const StatusResponse& status);

// `status` as one line of JSON (protobuf's JSON mapping of StatusResponse).
std::string StatusJson(const StatusResponse& status);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_STATUS_VIEW_H_
