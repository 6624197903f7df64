// Fault injection for `shardps local`: SIGKILL a scheduler, server or worker
// when worker rank 0 reaches a step, restart a killed scheduler, and measure
// from the scheduler's own status how long the cluster took to notice
// (detected) and to train on (recovered).
//
// Not thread-safe: driven by the launcher's one loop.
#ifndef SHARDPS_TOOLS_FAULT_INJECTION_H_
#define SHARDPS_TOOLS_FAULT_INJECTION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tools/process.h"

namespace shardps {

class SchedulerClient;

struct FaultSpec {
  enum class Role { kScheduler, kServer, kWorker };
  Role role = Role::kServer;
  int index = 0;      // server index or worker rank (0 for the scheduler)
  int64_t step = 0;   // worker rank 0's step at which to kill
  // When the kill comes. kAtStep: at rank 0's `step`. kWhileMoving
  // ("@moving"): as soon as the scheduler has started moving copies to a
  // server that joined (ShardMap.moves under way, or
  // StatusResponse.copy_moves_planned; a move may finish within a few
  // milliseconds, so the kill lands in it or just after). kWhileHandingOff
  // ("@handoff"): the same, once the scheduler has started handing primary
  // roles off (ShardMap.handoffs under way, or
  // StatusResponse.handoffs_planned). For both, the record's step is rank
  // 0's at the kill.
  enum class When { kAtStep, kWhileMoving, kWhileHandingOff };
  When when = When::kAtStep;
};

// "server:1@600", "worker:2@600", "scheduler@600", "server:0@moving",
// "server:0@handoff".
// Refuses unknown roles, indices outside the cluster, and worker 0 (its
// steps are the clock).
absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view spec, int servers, int workers);
std::string RoleName(FaultSpec::Role role);
// `spec` as --kill takes it ("server:1@600", "server:0@moving").
std::string FaultSpecName(const FaultSpec& spec);

struct FaultRecord {
  FaultSpec spec;
  // Seconds from the kill; negative while not (yet) seen. Server or worker:
  // detected = the scheduler declared it dead, recovered = rank 0 took a step
  // after that. Scheduler: detected = a restarted scheduler answers,
  // recovered = every live node has reconnected to it.
  double detected_seconds = -1;
  double recovered_seconds = -1;
};

// The launcher's processes: scheduler at daemons[0], servers after it,
// worker r at workers[r]. `server_slot(i)` is the position in `daemons` of
// the server the scheduler gave index i (servers register in any order).
struct ClusterProcesses {
  std::vector<ChildProcess>& daemons;
  std::vector<ChildProcess>& workers;
  std::function<absl::StatusOr<size_t>(int index)> server_slot;
};

class FaultInjector {
 public:
  // `restart_scheduler` starts a scheduler at the old address from its state
  // directory; it is called `restart_after` after a scheduler kill.
  FaultInjector(std::vector<FaultSpec> plan, std::shared_ptr<SchedulerClient> scheduler,
                absl::Duration restart_after, std::function<absl::StatusOr<ChildProcess>()> restart_scheduler);
  ~FaultInjector();

  // Kills what is due at rank 0's `step`, restarts a killed scheduler when
  // due, and updates the measurements. Fails if a restart fails.
  absl::Status Tick(int64_t step, ClusterProcesses processes);

  bool WorkerKilled(int rank) const;
  bool ServerKilled(int index) const;
  const std::vector<FaultRecord>& records() const { return records_; }
  // The faults not injected yet (all of them once the job ended: ones that
  // never happened).
  const std::vector<FaultSpec>& pending() const { return plan_; }

 private:
  struct Injected {
    size_t record;
    absl::Time killed_at;
    int64_t step_at_detection = -1;
  };
  void Measure(int64_t step);
  // Whether the scheduler has started copy moves, and hand-offs (polled
  // only while an "@moving" or "@handoff" fault waits).
  struct Balancing {
    bool moving = false;
    bool handing_off = false;
  };
  Balancing BalancingUnderWay();

  std::vector<FaultSpec> plan_;  // not yet injected, in step order
  std::shared_ptr<SchedulerClient> scheduler_;
  const absl::Duration restart_after_;
  std::function<absl::StatusOr<ChildProcess>()> restart_scheduler_;
  std::vector<FaultRecord> records_;
  std::vector<Injected> injected_;
  absl::Time restart_due_ = absl::InfiniteFuture();
  absl::Time restarted_at_ = absl::InfiniteFuture();
  absl::Time next_poll_ = absl::InfinitePast();
};

// `"faults": [...]`-ready JSON array of the records.
std::string FaultsJson(const std::vector<FaultRecord>& records);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_FAULT_INJECTION_H_
