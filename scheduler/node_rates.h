// Per-second rates of the counters nodes report in their heartbeats
// (NodeCounters), for the scheduler's status and `shardps status --watch`.
#ifndef SHARDPS_SCHEDULER_NODE_RATES_H_
#define SHARDPS_SCHEDULER_NODE_RATES_H_

#include "proto/cluster.pb.h"

namespace shardps {

// (now - before) / seconds for every counter; a counter that went back (the
// process restarted in between) gives 0. REQUIRES: seconds > 0.
NodeRates RatesBetween(const NodeCounters& before, const NodeCounters& now, double seconds);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_NODE_RATES_H_
