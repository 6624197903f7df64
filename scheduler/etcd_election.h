// The scheduler's etcd backend: elects the active scheduler among those
// sharing an etcd key prefix P, and holds the active one's state there.
//
//   P/leader  the active scheduler's address, attached to its lease: it
//             vanishes when that lease expires (the scheduler died) or is
//             revoked (it shut down), and a standby's Campaign then wins.
//   P/state   the sealed SchedulerState (the bytes of a --state-dir file).
//
// Every state write is a transaction guarded by P/leader still having the
// create revision this scheduler's win gave it, so a deposed scheduler can
// never overwrite its successor's state. Owns its lease and an EtcdClient.
// Thread-safe.
#ifndef SHARDPS_SCHEDULER_ETCD_ELECTION_H_
#define SHARDPS_SCHEDULER_ETCD_ELECTION_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/etcd_tls.h"

namespace shardps {

class EtcdClient;

class EtcdElection {
 public:
  struct Options {
    std::string endpoints;  // "http://HOST:PORT[,...]" or "https://HOST:PORT[,...]"
    EtcdTlsFiles tls{};     // for https:// endpoints (scheduler/etcd_tls.h)
    std::string prefix;     // the keys are prefix + "/leader" and prefix + "/state"
    std::string address;    // this scheduler's advertised host:port (P/leader's value)
    // Lease TTL: how long after a SIGKILL P/leader vanishes. Default 10 s
    // (the default heartbeat timeout); etcd rounds up to whole seconds and
    // to its minimum (2 s with its default timings).
    absl::Duration ttl = absl::Seconds(10);
  };
  // Connects and grants this scheduler's lease; Unavailable, naming the
  // endpoints, when etcd does not answer.
  static absl::StatusOr<std::unique_ptr<EtcdElection>> Create(const Options& options);
  // Revokes the lease: P/leader goes at once if it was ours.
  ~EtcdElection();

  const std::string& leader_key() const { return leader_key_; }
  const std::string& state_key() const { return state_key_; }
  // How often a standby campaigns and the leader renews its lease.
  absl::Duration poll_period() const;

  // Tries once to become the active scheduler (creates P/leader unless it
  // exists). True once this scheduler holds it; false with `*active` set to
  // the holder's address.
  absl::StatusOr<bool> Campaign(std::string* active);
  // A standby, after a lost Campaign: watches P/leader (an etcd watch, not
  // polling) until it is deleted, so the next Campaign can win at once.
  // True then; false after `timeout` or once CancelWaits() was called.
  absl::StatusOr<bool> AwaitLeaderGone(absl::Duration timeout);
  // Ends AwaitLeaderGone, in progress or to come (the election is stopping).
  void CancelWaits();
  // How long until KeepAlive next renews the lease (zero: due now).
  absl::Duration UntilRenewal();
  // Renews the lease when a third of its TTL has passed since the last
  // renewal. The active scheduler gets FailedPrecondition once its lease is
  // lost (etcd says it expired and a linearizable read finds P/leader gone
  // with it, or no renewal succeeded for a whole TTL): it must stop serving.
  // A standby whose lease expired takes a new one.
  absl::Status KeepAlive();
  // REQUIRES: Campaign returned true. P/state's bytes; nullopt if absent.
  absl::StatusOr<std::optional<std::string>> LoadState();
  // REQUIRES: Campaign returned true. FailedPrecondition, naming P/leader,
  // once another scheduler holds it (this one was deposed).
  absl::Status StoreState(const std::string& bytes);

 private:
  EtcdElection(const Options& options, std::unique_ptr<EtcdClient> client);
  absl::Status Grant() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::string leader_key_, state_key_;
  const std::unique_ptr<EtcdClient> client_;
  absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration ttl_ ABSL_GUARDED_BY(mu_);                 // as granted
  absl::Time renewed_ ABSL_GUARDED_BY(mu_);                 // when the last renewal was sent
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_);             // the lease surely lives until then
  // Written once, by the Campaign that wins; read by StoreState without mu_
  // (a state write never waits behind a lease renewal).
  std::atomic<int64_t> leader_revision_{0};        // P/leader's create revision once won; 0 before
  // The store's revision when the last lost Campaign saw P/leader held.
  int64_t seen_revision_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_ETCD_ELECTION_H_
