// What a scheduler started with --etcd does besides serving: as a standby it
// campaigns, then watches the leader key (an etcd watch) and campaigns again
// as soon as the key is deleted (falling back to campaigning every poll
// period while the watch fails); once it wins it loads the state from etcd and
// hands it to the daemon; while active it renews its lease; and when it
// loses the lease, or a state write is fenced off, it stops the daemon (it
// does not go back to standby: its memory may be stale). Transport-free: the
// daemon serves through the hooks. Owns the election and one thread.
// Internal to the scheduler.
#ifndef SHARDPS_SCHEDULER_ETCD_SCHEDULER_ROLE_H_
#define SHARDPS_SCHEDULER_ETCD_SCHEDULER_ROLE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/config.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/etcd_election.h"

namespace shardps {

class EtcdSchedulerRole {
 public:
  struct Hooks {
    // Serve `state` from now on. Called once, from the campaigning thread.
    std::function<void(std::unique_ptr<ClusterState> state)> activate;
    // Answer every call UNAVAILABLE with `why` (a standby's, or a stopped
    // scheduler's reason). Called from any thread.
    std::function<void(std::string why)> refuse;
    // Stop serving (the process then exits with failure()). Called once, from
    // the campaigning thread.
    std::function<void()> stop_serving;
  };
  // Campaigns once in the caller's thread (an error resuming a won state,
  // e.g. a corrupt one, is returned), then from its own thread. `address`:
  // this scheduler's, for messages.
  static absl::StatusOr<std::unique_ptr<EtcdSchedulerRole>> Start(std::unique_ptr<EtcdElection> election,
                                                                  const ClusterConfig& config, std::string address,
                                                                  Hooks hooks);
  // Stop(), then hands back the lease: a standby takes over at once.
  ~EtcdSchedulerRole();

  // Ends the campaigning thread. REQUIRES: not called from a hook.
  void Stop();
  // Why the scheduler stopped serving by itself; OK otherwise.
  absl::Status failure();

 private:
  EtcdSchedulerRole(std::unique_ptr<EtcdElection> election, const ClusterConfig& config, std::string address,
                    Hooks hooks);
  void Loop();
  absl::Status Step();
  bool AwaitLeaderGone();
  absl::Status TakeOver();
  // A state write was fenced off; called from a handler thread.
  void Depose(const absl::Status& why);

  const std::unique_ptr<EtcdElection> election_;
  const ClusterConfig config_;
  const std::string address_;
  const Hooks hooks_;
  // The campaigning thread's own (set before it starts, then only there):
  bool active_ = false;
  std::string last_holder_;  // the active scheduler a standby last saw
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_ETCD_SCHEDULER_ROLE_H_
