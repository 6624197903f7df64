// The worker client library: what a training job embeds to push gradients to
// and pull weights from the parameter servers.
//
//   WorkerOptions options{.scheduler_address = "10.0.0.1:7000", .rank = 0};
//   auto worker = Worker::Create(options);           // registers, waits for the cluster
//   (*worker)->DefineTensors({...});                   // same list on every worker
//   if (rank == 0) (*worker)->InitTensor("fc1.weight", initial, absl::Seconds(30));
//   (*worker)->Barrier("init");
//   auto h = (*worker)->PushPull("fc1.weight", grad, weights);
//   absl::Status s = (*worker)->Wait(*h, absl::Seconds(30));
//
// Tensors are split by the scheduler's shard map; the partitions of one call
// go to their servers concurrently and are reassembled. Buffers passed to
// Push/Pull/PushPull are borrowed, not copied: they must stay valid and
// unmodified until Wait() (or the WaitAny that completes the handle) returns,
// whatever it returns; after that nothing reads or writes them, a timed-out
// request included. Every handle must be waited on once, by one thread. Thread-safe: any thread may call
// any method; requests for one tensor go out in the order they were made.
#ifndef SHARDPS_WORKER_WORKER_H_
#define SHARDPS_WORKER_WORKER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security.h"
#include "proto/cluster.pb.h"

namespace shardps {

class SchedulerClient;

struct WorkerOptions {
  std::string scheduler_address{};  // host:port, or host:port,host:port,... (schedulers on etcd)
  uint32_t rank = 0;              // in [0, num_workers)
  std::string host{};             // shown in status and errors; empty: this machine's host name
  // How long Create() waits for the scheduler and the whole cluster.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Deadline of control-plane calls after registration (define, barrier).
  // Zero (default): the config's rendezvous_timeout_ms, since both wait for
  // the other workers. A scheduler that restarts meanwhile is waited for.
  absl::Duration control_timeout = absl::ZeroDuration();
  // The scheduler to talk to; null (default): a gRPC client of
  // `scheduler_address`. Tests pass one that dies, stalls or publishes maps.
  std::shared_ptr<SchedulerClient> scheduler_client = nullptr;
  // Default: off. On: the scheduler is reached over TLS with the token. The
  // data plane follows the servers: a server that published a CURVE key in
  // the shard map is always reached with CURVE (whatever this setting).
  SecurityCredentials security{};
};

struct WorkerStats {
  uint64_t bytes_pushed = 0;  // payload bytes sent (gradients and INIT)
  uint64_t bytes_pulled = 0;  // payload bytes received (weights)
  uint64_t requests = 0;      // data-plane requests sent
  // Data connections that broke after their handshake, and the requests
  // waiting on them that were sent again on the next.
  uint64_t connection_breaks = 0;
  uint64_t requests_resent = 0;
  // Training steps: the most rounds pushed to one partition (a restored or
  // rejoined worker counts from the round it started at).
  uint64_t steps = 0;
  std::map<uint64_t, uint64_t> acked_pushes;  // partition id -> pushes answered OK
  // partition id -> those pushes' request ids, each through PushDigest
  // (common/protocol.h), summed: which pushes, where a count says how many.
  std::map<uint64_t, uint64_t> acked_push_digests;
};

class Worker {
 public:
  using Handle = uint64_t;

  // Registers with the scheduler and returns once the whole cluster has
  // registered; fails naming the scheduler and who is missing otherwise.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const WorkerOptions& options);
  virtual ~Worker() = default;

  // The cluster configuration handed out by the scheduler.
  virtual const ClusterConfig& config() const = 0;
  virtual uint32_t rank() const = 0;
  // The servers in the job as this worker last saw it: those the newest
  // shard map it received lists as live (not declared dead, not left). A
  // server that joined the running job as one more counts once a map listing
  // it reached this worker, whether it holds partitions yet or not; one in a
  // dead one's place counts instead of it. Before DefineTensors (no map
  // yet): config().num_servers(), the count the first map waits for.
  virtual uint32_t num_servers() const = 0;
  // The deadline data waits should use: the config's request_timeout_ms.
  virtual absl::Duration request_timeout() const = 0;

  // Declares the job's tensors (float32). Every worker declares the same
  // list; returns once the servers serve the resulting shard map. `timeout`
  // zero: the options' control_timeout.
  virtual absl::Status DefineTensors(const std::vector<TensorSpec>& tensors,
                                     absl::Duration timeout = absl::ZeroDuration()) = 0;

  // Sets a tensor's initial weights. The first INIT of a partition wins; the
  // same values again (a retry) are answered OK, and anything else once a
  // partition is initialised or has taken an update, a cluster restored from
  // a checkpoint included, fails with ALREADY_EXISTS and changes nothing. A
  // restored cluster's rounds start at config().checkpoint().restore_round(),
  // the step the job resumes at.
  virtual absl::Status InitTensor(const std::string& name, absl::Span<const float> values,
                                  absl::Duration timeout) = 0;

  // Returns once every worker still in the job has entered the barrier
  // `name`. `live_ranks` (optional) receives the ranks in the job when it
  // passed: the same list for every worker, so they can agree on how to
  // split the data once a worker was removed.
  // `timeout` zero: the options' control_timeout.
  virtual absl::Status Barrier(const std::string& name, std::vector<uint32_t>* live_ranks = nullptr,
                               absl::Duration timeout = absl::ZeroDuration()) = 0;

  // Sends this worker's gradient for its next round of `name`.
  virtual absl::StatusOr<Handle> Push(const std::string& name, absl::Span<const float> gradient) = 0;
  // Takes this worker's part in its next round of `name` without a gradient
  // (a frozen parameter): one push per partition with no payload, so the
  // partitions' rounds keep pace with the rest of the model's (sync
  // checkpoints wait for every partition's round; a rejoining worker starts
  // every partition at one round). A round sums the gradients other workers
  // pushed, this one counting as a zero; a round no worker pushed a gradient
  // to completes with no optimizer step: weights and optimizer state stay
  // as they are, and Adam's bias correction counts only the rounds that
  // stepped, as torch's per-parameter step count does. Wait on the handle
  // as on Push's. Freeze a tensor on every worker alike: one that skips a
  // round others pushed to gets no weights from it (weight-delta pulls and
  // sum-only copies then differ for good). FAILED_PRECONDITION where no round waits for pushes (async,
  // ssp applied on arrival: there a frozen parameter simply pushes nothing)
  // or where the rounds' count decides the update (sum-only 1-bit Adam).
  virtual absl::StatusOr<Handle> SkipRound(const std::string& name) = 0;
  // Fills `weights` once every round this worker pushed is applied (sync), or
  // with the latest weights (async).
  virtual absl::StatusOr<Handle> Pull(const std::string& name, absl::Span<float> weights) = 0;
  // Push and pull in one request per partition: the answer carries the
  // weights that include this push's round. With update_mode SUM_ONLY the
  // answer is the round's gradient sum and this worker applies the optimizer
  // to `weights`, which must hold the current weights (updated in place).
  // The same holds in sync mode with a compression.pull_codec: the answer is
  // a compressed weight delta added to `weights` in place.
  virtual absl::StatusOr<Handle> PushPull(const std::string& name, absl::Span<const float> gradient,
                                          absl::Span<float> weights) = 0;

  // Sum-only mode for a job that runs its own optimizer: pushes `gradient`
  // and fills `mean_gradient` with the round's gradients averaged over the
  // workers that contributed (sync: the same on every worker); no weights
  // are touched. FAILED_PRECONDITION unless update_mode is SUM_ONLY.
  virtual absl::StatusOr<Handle> PushPullMeanGradient(const std::string& name, absl::Span<const float> gradient,
                                                      absl::Span<float> mean_gradient) = 0;

  // Where each partition of `name` lies within the tensor, in shard-map
  // order. Lets a caller pipeline per partition (e.g. merge partition k+1
  // from local devices while partition k is on the wire).
  struct PartitionExtent {
    size_t offset = 0;
    size_t num_elements = 0;
    uint32_t server = 0;
  };
  virtual absl::StatusOr<std::vector<PartitionExtent>> Partitions(const std::string& name) const = 0;
  // PushPull of one partition: `gradient` and `weights` cover just that
  // partition. Rounds are counted per partition, so mixing whole-tensor and
  // per-partition calls stays consistent.
  virtual absl::StatusOr<Handle> PushPullPartition(const std::string& name, size_t index,
                                                   absl::Span<const float> gradient, absl::Span<float> weights) = 0;

  // Waits for a handle. On timeout the error names the tensor, the servers
  // still owing an answer and the round; the handle is then released.
  // Requests to a server the scheduler declared dead fail at once, naming it
  // (the worker follows the shard map from DefineTensors on).
  virtual absl::Status Wait(Handle handle, absl::Duration timeout) = 0;
  // Waits until one of `handles` completes and returns its index; that handle
  // is released (as by Wait) and its result stored in *status, the others stay
  // outstanding. DEADLINE_EXCEEDED when none completes within `timeout` (zero
  // polls: answers already received are taken, then it returns at once); no
  // handle is released then. INVALID_ARGUMENT for a handle that is unknown or
  // was already waited on; ABORTED for one another thread is waiting on
  // (Wait too): that thread completes it, this call consumes nothing.
  virtual absl::StatusOr<size_t> WaitAny(absl::Span<const Handle> handles, absl::Duration timeout,
                                         absl::Status* status) = 0;

  virtual WorkerStats stats() const = 0;

  // Why the training process stops, when it stops on an error: the leave
  // this worker's destructor sends then carries it (HeartbeatRequest.
  // leaving_error), and the scheduler lists the worker as failed with it
  // rather than as left. Kept as UTF-8 (a byte that is not replaced by
  // U+FFFD), at most 4096 bytes. The last call counts.
  virtual void SetLeavingError(const std::string& error) = 0;

  // A worker whose rank had been removed from the running job (declared
  // dead) and that registered again: the first round it pushes, and the
  // barriers the job passed before it came back (name -> ranks in the job
  // then), from which a training job finds its epoch and data split. Its
  // rounds start at `round`; its first pull waits for the weights of the
  // round before. Sync servers count it from `round` on; async ones simply
  // take its pushes. round 0: the worker joined at the start.
  struct Rejoin {
    uint64_t round = 0;
    std::map<std::string, std::vector<uint32_t>> passed_barriers;
  };
  virtual const Rejoin& rejoin() const;

  // The fewest completed rounds (async: pushes applied) among the weights
  // last handed back for the partitions of `name` (by the Wait or WaitAny
  // that returned their handle): how far the cluster had got in the weights
  // this worker computes on; each partition's push carries its own as
  // `based_on`. 0 before any answer; NotFound for an unknown tensor. Async
  // jobs stop on it once the cluster has applied their whole budget of pushes.
  virtual absl::StatusOr<uint64_t> WeightsVersion(const std::string& name) const = 0;
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_WORKER_H_
