// The scheduler's gRPC service over a ClusterState, without a gRPC server:
// SchedulerDaemon serves it, and the fuzz harness (tests/fuzz) calls its
// handlers directly. Internal to the scheduler; it includes gRPC headers, so
// include it only where gRPC is used already.
#ifndef SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_
#define SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "proto/cluster.grpc.pb.h"
#include "scheduler/cluster_state.h"

namespace shardps {

// The service owns `state` and a liveness thread (joined on destruction).
// Every blocking call (a worker's Register, DefineTensors, Barrier) returns
// by the caller's deadline less a margin, and by `max_wait` from its start.
std::unique_ptr<Scheduler::Service> NewSchedulerService(std::unique_ptr<ClusterState> state,
                                                        absl::Duration max_wait);

// A standby's service for `config` before its first campaign: answers every
// call UNAVAILABLE with StandbyRefusal(address, "") (common/scheduler_refusal.h),
// as a scheduler started with --etcd does until it learns who is active.
std::unique_ptr<Scheduler::Service> NewStandbySchedulerService(const ClusterConfig& config,
                                                               const std::string& address);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SCHEDULER_SERVICE_H_
