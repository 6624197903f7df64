// The scheduler's gRPC service over a ClusterState, without a gRPC server:
// SchedulerDaemon serves it, and the fuzz harness (tests/fuzz) calls its
// handlers directly. Internal to the scheduler; it includes gRPC headers, so
// include it only where gRPC is used already.
#ifndef SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_
#define SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_

#include <memory>

#include "absl/time/time.h"
#include "proto/cluster.grpc.pb.h"
#include "scheduler/cluster_state.h"

namespace shardps {

// The service owns `state` and a liveness thread (joined on destruction).
// Every blocking call (a worker's Register, DefineTensors, Barrier) returns
// by the caller's deadline less a margin, and by `max_wait` from its start.
std::unique_ptr<Scheduler::Service> NewSchedulerService(std::unique_ptr<ClusterState> state,
                                                        absl::Duration max_wait);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_
