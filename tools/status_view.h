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
// and for a server still on an older epoch "behind"; under a node whose
// heartbeats carry counters, its rates (servers: rounds/s, updates/s,
// refused/s; workers: steps/s; both: MB/s in and out) and their age.
std::string StatusTable(const StatusResponse& status);

// `shardps status --watch`: replaces the rates of each node of `now` that is
// in `before` (same node id), a snapshot taken `seconds` earlier, with the
// rates between the two snapshots' counters, when its counters are newer;
// the others keep the scheduler's rates (between two heartbeats).
void RatesSinceSnapshot(const StatusResponse& before, double seconds, StatusResponse* now);

// `status` as one line of JSON (protobuf's JSON mapping of StatusResponse,
// counters and rates included).
std::string StatusJson(const StatusResponse& status);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_STATUS_VIEW_H_
