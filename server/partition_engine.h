// The partitions one server owns and the rules that update them: validation
// of every request, round accumulation (sync), apply-on-arrival (async),
// pulls that wait for a round, idempotent retries.
//
// Transport-free: requests come in as (peer identity, header, payload) and
// answers leave through the ReplySink, so the engine is tested without
// sockets. Owned and driven by one thread (the server's engine thread); not
// thread-safe, and needs no lock on the hot path.
#ifndef SHARDPS_SERVER_PARTITION_ENGINE_H_
#define SHARDPS_SERVER_PARTITION_ENGINE_H_

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/optimizer.h"
#include "common/shared_buffer.h"
#include "compression/codec_policy.h"
#include "compression/error_feedback.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/data.pb.h"

namespace shardps {

struct EngineStats {
  uint64_t requests = 0;
  uint64_t errors = 0;
  uint64_t bytes_in = 0;   // payload bytes received
  uint64_t bytes_out = 0;  // payload bytes sent
  uint64_t updates = 0;    // optimizer steps applied
  uint64_t snapshots_sent = 0;  // whole partitions sent to re-created copies
  uint64_t snapshot_probes = 0;  // asked of backups whether a snapshot arrived
  // For metrics (server/server_metrics.h): requests by op (DataHeader op
  // value, 0 for unknown), error answers by absl::StatusCode, updates sent to
  // backups (one per backup copy) and their payload bytes, and promotions
  // from backup to primary.
  std::array<uint64_t, 7> requests_by_op{};
  std::array<uint64_t, 17> errors_by_code{};
  uint64_t replicated = 0;
  uint64_t replicated_bytes = 0;
  uint64_t promotions = 0;
  // Refused requests, by reason: gradients holding NaN/Inf, request ids far
  // ahead of the worker's sequence.
  uint64_t non_finite = 0;
  uint64_t bad_request_ids = 0;
  // Staleness of the gradients applied (async, ssp and sync alike), in
  // rounds: rounds of the partition applied between the weights a gradient
  // was computed on and its own update (async: pushes / W). Counted per
  // gradient that says what it was computed on (DataHeader.based_on).
  uint64_t stale_gradients = 0;
  double staleness_sum = 0;
  double staleness_max = 0;
};

// Index of `value` in a per-kind count array of `size` entries; `other` when
// out of range.
inline size_t StatSlot(int value, size_t size, size_t other) {
  return value >= 0 && static_cast<size_t>(value) < size ? static_cast<size_t>(value) : other;
}

// Requests held by the engine, read for metrics.
struct EngineQueues {
  uint64_t waiting_pulls = 0;   // pulls waiting for their round
  uint64_t parked_pushes = 0;   // pushes for a later round
  uint64_t deferred = 0;        // requests of an epoch not installed yet
  uint64_t unconfirmed = 0;     // answers waiting for the backups' confirmation
  uint64_t replication_lag = 0; // updates sent to backups and not yet confirmed by all
  uint64_t bounded = 0;         // ssp: push answers held by the staleness bound
  uint64_t handoff_held = 0;    // requests held while a primary role is handed off
  uint64_t forwarded = 0;       // backups: pushes forwarded by the primary, held until their round
};

// What one partition's primary has applied, for the accounting of lost and
// duplicate updates: sync rounds, and per worker the async pushes or the
// gradients its completed rounds summed.
struct PartitionUpdates {
  uint64_t partition = 0;
  uint64_t completed = 0;
  std::vector<uint64_t> applied_by_worker;
  std::vector<uint64_t> applied_digest_by_worker;  // async only: PushDigest of those pushes summed
};

// One partition held here, as metrics report it (PartitionEngine::Reports).
struct PartitionReport {
  uint64_t partition = 0;
  std::string tensor;
  bool primary = true;  // else a backup copy
  // Updates applied (sync, ssp: rounds; async: pushes).
  uint64_t version = 0;
  // Staleness of the gradients this copy measured (primaries: those pushed
  // to it; a backup measures none until promoted), in rounds.
  uint64_t stale_gradients = 0;
  double staleness_sum = 0;
  double staleness_max = 0;
  // Primaries: per backup server index, updates sent and not confirmed yet.
  std::vector<std::pair<uint32_t, uint64_t>> backup_lag;
};

class PartitionEngine {
 public:
  // Sends one answer to `peer`. `payload` may be null (errors, acks).
  using ReplySink = std::function<void(const zmq::message_t& peer, DataHeader& header, zmq::message_t* payload)>;
  // Sends a REPLICATE request to the server of index `server` (a backup);
  // its answer comes back through HandleReplicaAck. Requests to one backup
  // must reach it in the order sent (a probe follows its snapshot).
  using ReplicaSink = std::function<void(uint32_t server, DataHeader& header, zmq::message_t& payload)>;

  // Replication (primary-backup): the server a partition's map entry names
  // is its primary; each update the primary applies (INIT, a sync round's
  // gradient sum, an async push) is sent to the partition's backups, which
  // apply it with the same float operations, and what the update answers
  // (a push's ack, the weights that include a round) is held back until
  // every backup has confirmed it. A sync round completes only once the one
  // before it is confirmed, so at most one round per partition is in flight
  // to the backups. A sync round whose pushes are compressed, when the
  // workers' pushes together are smaller than the fp32 sum, goes to the
  // backups as those pushes instead: each is forwarded as it is counted,
  // and the round's update names them in counting order, so the backup
  // decodes and sums them with the same float operations (ForwardCounted).
  // When the map promotes this server from backup to
  // primary, it takes over with the last round it applied: a worker's retry
  // of a later push (same request id) counts it, an earlier one is answered
  // as a duplicate, and nothing is applied twice.
  static absl::StatusOr<std::unique_ptr<PartitionEngine>> Create(const ClusterConfig& config, ReplySink sink,
                                                                 ReplicaSink replicate = nullptr);
  // The largest frame an engine of `config` sends another server or a
  // worker: a snapshot of a partition, with (ssp in rounds) the open
  // rounds' pushes. A server's socket refuses larger ones from its peers.
  static int64_t MaxFrameBytes(const ClusterConfig& config);

  // Adopts shard map `map` for server `server_index`: creates the partitions
  // it now owns (zero weights; on the first map with partitions and the
  // config's checkpoint.restore_dir, the checkpoint's state) and keeps those it
  // already had, and follows
  // its membership: requests of workers in `excluded_workers` are refused
  // from then on, and sync rounds complete with the workers that remain
  // (a round a removed worker was holding up completes at once, averaged
  // over the workers that contributed to it). A rank in `rejoined_workers`
  // (and no longer excluded) is counted again from its join round on.
  // Fails if the config names a codec that cannot be created, or a
  // checkpoint to restore that is corrupt or does not match the map.
  // Copies this server holds in no later map are dropped (a copy moved to
  // a server that joined).
  // Hand-offs (ShardMap.handoffs) of a partition this server is primary of:
  // from the map that lists one, requests that would start new work are
  // held (sync, ssp: pushes of a round no push has started, INIT; async:
  // every push), unanswered, in arrival order, while the rounds already
  // started complete and are confirmed; then HandoffsDone() lists it. A
  // later map that makes another server the primary drops what was held
  // without answering it (the workers re-send it there with the same
  // request ids) and this copy becomes a backup; one that still has this
  // server the primary but no longer lists the hand-off replays it all, in
  // order.
  absl::Status InstallShardMap(const ShardMap& map, uint32_t server_index);
  uint64_t epoch() const { return epoch_; }

  // This server joined a job that was already training (it replaces a dead
  // one): every copy its maps give it holds nothing valid until its primary's
  // snapshot arrives, the first map included, and no checkpoint is restored.
  void JoinRunningJob() { joined_running_job_ = true; }

  // Handles one request. `payload` is null when the message had no payload
  // frame. Every outcome, including bad input, is answered through the sink
  // or parked until it can be (a pull waiting for its round).
  void Handle(const zmq::message_t& peer, const DataHeader& header, zmq::message_t* payload);

  // Async: between BeginBatch and EndBatch, the pushes a partition receives
  // are summed and applied as one update when the batch ends (or W pushes
  // are in): one optimizer pass, one copy to the backups and one weights
  // buffer for all their answers, instead of one each. k pushes step once
  // with their mean gradient and k times the per-push learning rate
  // (lr / W), as k of a sync round's W workers would. The server brackets
  // what it drains from its socket in one go, so pushes coalesce only when
  // they queue up (the engine thread is the bottleneck); a lone push is
  // applied at once, as before. Outside a batch every push applies on
  // arrival. A shard map installed while a batch is open applies it first.
  void BeginBatch() { batching_ = true; }
  void EndBatch();

  // A backup's answer to a REPLICATE request sent by this server.
  void HandleReplicaAck(uint32_t from_server, const DataHeader& answer);
  // Call every heartbeat timeout or so: a backup that has not confirmed its
  // snapshot since the previous call is sent a probe of it (a header; again
  // at each call while it stays unconfirmed, in case a probe is lost too),
  // which it answers after the snapshot: OK if it applied that
  // snapshot, a refusal if not, which re-creates the copy as any refusal
  // does (HandleReplicaAck). A snapshot may be lost unanswered (a server that
  // just joined holds sealed messages from senders its first map does not
  // list only so far), and a round-based partition completes no round until
  // its backups confirmed the update before, so waiting for a refusal would
  // wait forever; but one merely slow (a large partition, a slow link) must
  // not be sent again behind itself: the probe tells the two apart.
  void ProbeUnconfirmedSnapshots();

  // This server's connection to backup `server` broke (no answer to a
  // heartbeat, or closed) and was made again, its queue dropped: what was
  // in flight on it is lost, and TCP would not have sent it again before
  // its backed-off retransmission anyway. Each partition with updates (or a
  // snapshot) that backup has not confirmed gets a snapshot, which covers
  // them; the updates waiting for its confirmations are answered once it
  // confirms that. Returns those partitions.
  std::vector<uint64_t> ConnectionToBackupBroke(uint32_t server);

  // A backup that confirmed no update of this server's primaries between
  // two calls of CheckReplicationStalls while updates to it waited: a link
  // between the two servers down (both still heartbeat, so the scheduler
  // declares neither dead), or the backup stalled. Every round of those
  // partitions waits for it. `resumed`: one listed stalled before confirms
  // again.
  struct ReplicationStall {
    uint32_t backup = 0;
    std::string address;               // the backup's data address
    std::vector<uint64_t> partitions;  // stalled ones (empty when resumed)
    bool resumed = false;
  };
  // Call every heartbeat timeout or so, with ProbeUnconfirmedSnapshots (a
  // snapshot on its way is its business, not a stall). Each stall is
  // returned once when found and once when it ends, one entry per backup.
  std::vector<ReplicationStall> CheckReplicationStalls();

  // A sync round of this server's primaries that took no push between two
  // calls of CheckRoundStalls with some workers' pushes in and `worker`'s
  // missing: a worker whose data link to this server is down while it
  // still reaches the scheduler (so it is not declared dead), or one
  // stuck. Every round of the job waits for it. `resumed`: a worker listed
  // before whose rounds move again (not one removed from the job since).
  struct RoundStall {
    uint32_t worker = 0;
    std::vector<uint64_t> partitions;  // waiting for it (empty when resumed)
    uint64_t round = 0;                // the earliest open round among them
    bool resumed = false;
  };
  // Call every heartbeat timeout or so. Each stall is returned once when
  // found and once when it ends, one entry per worker.
  std::vector<RoundStall> CheckRoundStalls();

  // Answers every parked request with `status` (shutdown).
  void FailWaiting(const absl::Status& status);

  const EngineStats& stats() const { return stats_; }
  // Walks every partition: call at a low rate (metrics), not per request.
  EngineQueues Queues() const;
  // One entry per partition this server is the primary of.
  std::vector<PartitionUpdates> UpdateCounts() const;
  // One entry per synced backup copy held here: what it applied.
  std::vector<PartitionUpdates> BackupUpdateCounts() const;
  // The `max` partitions of lowest id held here (primaries and backups), in
  // id order; `*held` (optional) receives how many are held in all. Walks
  // every partition: call at a low rate (metrics).
  std::vector<PartitionReport> Reports(size_t max, size_t* held = nullptr) const;
  // The most rounds a partition this server is primary for has completed
  // (heartbeats report it; `shardps checkpoint` places its round after it);
  // ssp applied on arrival: the furthest round a worker pushed here.
  uint64_t completed_round() const { return max_completed_; }
  // Sync: the fewest rounds a partition this server is primary for has
  // completed; nullopt with no primary (or not round based).
  std::optional<uint64_t> fewest_completed_round() const;
  // The partitions this server holds a valid copy of (primaries, and backups
  // whose snapshot has arrived), in id order: heartbeats report them, so
  // the scheduler drops a moved copy's old server only once the new one is
  // synced. copies_generation() changes whenever the answer may have.
  std::vector<uint64_t> SyncedCopies() const;
  uint64_t copies_generation() const { return copies_generation_; }
  // The hand-offs this server has drained (see InstallShardMap), in
  // partition id order; changes bump copies_generation().
  std::vector<HandoffDone> HandoffsDone() const;
  // The last checkpoint this server could not write its part of (empty dir:
  // none); a new failure bumps copies_generation(), so heartbeats carry it.
  const CheckpointFailure& checkpoint_failure() const { return checkpoint_failure_; }
  // Current weights of a partition, for tests; null if not owned.
  const float* weights(uint64_t partition_id) const;

 private:
  struct Waiter {
    zmq::message_t peer;
    DataHeader header;
  };
  // A primary's backup copy of a partition.
  struct Backup {
    uint32_t server = 0;
    // The data address it had when listed. A new address under the same
    // index is a server that joined in a dead one's place (the maps between
    // may have been skipped): a new copy that needs a snapshot.
    std::string address;
    // PartitionInfo.listed_at when listed: a later one is a copy dropped and
    // given back in maps this server skipped, a new copy too.
    uint64_t listed_at = 0;
    uint64_t confirmed = 0;  // the last update sequence it confirmed
    uint64_t last_sent = 0;  // the last update sent to it
    // The update number of the last snapshot sent to it (0: none), and
    // whether it refused an update since (its snapshot, its server being
    // too many epochs behind; an update after one it missed): it differs
    // from this copy and is re-created from a snapshot once its answers say
    // its server serves this one's epoch (HandleReplicaAck), at most
    // kSnapshotTries times.
    uint64_t snapshot_at = 0;
    bool needs_snapshot = false;
    int snapshots_again = 0;
    // The epoch snapshot_at was routed at (a probe names the snapshot by
    // both); snapshot_at when the last ProbeUnconfirmedSnapshots found it
    // unconfirmed (0: it did not), and the last snapshot probed (0: none;
    // the warning is said once a snapshot). The link keeps order, so a probe
    // unanswered means the snapshot is still on its way or the probe was
    // lost: the next check probes again (a header), never the snapshot.
    uint64_t snapshot_epoch = 0;
    uint64_t unconfirmed_snapshot = 0;
    uint64_t probed_snapshot = 0;
    // CheckReplicationStalls: `confirmed` and whether updates waited at the
    // last check, and whether this copy is reported stalled.
    uint64_t checked_confirmed = 0;
    bool checked_waiting = false;
    bool stalled = false;
  };
  // A snapshot as its copy knows it: the primary that sent it, the epoch it
  // was routed at and its update number there (a primary's update numbers
  // start again when it is promoted, at a later epoch).
  struct SnapshotId {
    uint32_t from = 0;
    uint64_t epoch = 0;
    uint64_t update = 0;  // 0: none
    bool operator==(const SnapshotId&) const = default;
  };
  struct ParkedPush {
    zmq::message_t peer;
    DataHeader header;
    zmq::message_t payload;
    // Answered before its round was counted (ssp), or replayed from the
    // pushes a replaced primary forwarded: not answered again when counted.
    bool answered = false;
  };
  // A request kept to be handled later: routed with an epoch this server
  // does not serve yet (a worker that learned of a failover first), or held
  // by a hand-off.
  struct Deferred {
    zmq::message_t peer;
    DataHeader header;
    zmq::message_t payload;
    bool has_payload = false;
  };
  struct Partition {
    uint64_t id = 0;
    size_t n = 0;
    std::string tensor;   // name, and the first element's offset in it
    uint64_t offset = 0;
    compression::PartitionCodecs codecs;  // null codec: raw fp32
    SharedBufferPtr weights;
    // Sum only: the last completed round's gradient sum, and its encoding.
    SharedBufferPtr aggregate;
    // Cached encoded answer (compressed pull) and the round it encodes.
    SharedBufferPtr encoded;
    size_t encoded_bytes = 0;
    int64_t encoded_round = -1;
    std::vector<float> acc_encoded;            // sync, summable codecs: sum of payloads
    std::vector<std::vector<float>> decoded;   // deterministic + codec: per-rank gradients
    std::vector<float> scratch;                // async + codec: one decoded gradient
    // Compressed weight deltas (compression::PullsWeightDeltas): the weights
    // as the workers hold them, and the delta being encoded.
    bool delta_pulls = false;
    std::vector<float> mirror;
    std::vector<float> delta;
    std::vector<float> state;
    uint64_t completed = 0;  // sync: rounds applied; async: pushes applied
    // Sync: of `completed`, the rounds completed with no gradient (every push
    // DataHeader.no_gradient): the optimizer's own step count is completed -
    // skipped. And whether the last completed round was one (its answers say
    // so: sum-only workers apply no step).
    uint64_t skipped = 0;
    bool last_skipped = false;
    bool initialized = false;
    // Sync: this round's sum; shared with the replica updates that carry it
    // (no copy), so a round's first write takes a fresh one if still sent.
    SharedBufferPtr acc;
    // The first raw gradient of the open sync round (not deterministic) or
    // of the async batch, held as received (checked, not copied) until a
    // second one is summed with it (into acc or batch_sum), or the round or
    // batch is applied from it.
    zmq::message_t first;
    uint32_t arrivals = 0;                 // sync: pushes in for this round
    uint32_t gradients = 0;                // sync: of those, the ones that carry a gradient
    // CheckRoundStalls: the open round and its arrivals at the last check
    // (no round checked: the round is past any).
    uint64_t stall_check_round = UINT64_MAX;
    uint32_t stall_check_arrivals = 0;
    std::vector<uint64_t> next_round;      // sync: per worker, next round it owes
    std::vector<bool> contributed;         // sync: per worker, counted in the open round
    std::vector<bool> no_gradient;         // sync: per worker, counted in it without a gradient
    std::vector<uint64_t> incarnation;     // per worker: registration of its pushes
    uint32_t contributors = 0;             // sync: gradients in the last completed round
    double round_staleness = 0;            // sync/ssp: staleness summed over the open round's gradients
    // Every gradient's staleness measured here (EngineStats has the sums
    // over all partitions).
    uint64_t stale_gradients = 0;
    double staleness_sum = 0;
    double staleness_max = 0;
    float lr_scale = 1.0f;                 // sync/ssp: learning-rate factor of the round being applied
    std::vector<zmq::message_t> held;      // deterministic: per-rank gradients
    std::vector<uint64_t> last_request;    // async: per worker, last applied request id
    // Per worker since it (re)joined, pushes applied (async) or rounds
    // completed with its gradient (in rounds).
    std::vector<uint64_t> applied_by;
    std::vector<uint64_t> applied_digest;  // async: per worker, PushDigest of those pushes summed
    // SSP applied on arrival: per worker, 1 + the last round of its pushes
    // applied here (0: not known here yet; see WithinBound).
    std::vector<uint64_t> clock;
    std::vector<Waiter> bounded;           // push answers held by the staleness bound
    std::vector<Waiter> waiting;           // pulls waiting for `completed`
    std::vector<ParkedPush> ahead;         // pushes for a later round
    // Replication: whether this server is the primary (else a backup), the
    // backups' indices, and per backup the last update sequence it confirmed.
    bool primary = true;
    // A primary told by a backup at a later epoch that another server
    // replaced it (HandleReplicaAck): said once in the log.
    bool deposed_said = false;
    // False on a backup added after the partition existed, until its
    // primary's snapshot arrived: it holds no valid copy before that.
    bool synced = true;
    // A backup: the last snapshot it applied, which a probe must name to be
    // answered OK (a copy synced without one has none).
    SnapshotId applied_snapshot;
    // PartitionInfo.listed_at of this server's copy in the map that made it.
    uint64_t listed_at = 0;
    // The server the map names its primary, and the lowest epoch at which
    // that server may have become it: replica updates routed before it come
    // from a primary the map replaced (one that died with some still in
    // flight) and are refused.
    uint32_t primary_server = 0;
    uint64_t primary_since = 0;
    // Primary: its backups, in the map's order.
    std::vector<Backup> backups;
    uint64_t sent = 0;                     // updates sent to the backups
    std::vector<Waiter> unconfirmed;       // answers waiting for `sent` (header.round() = sequence)
    // Async batch (BeginBatch): the sum of the pushes not applied yet, their
    // count, staleness, workers and request ids, and the answers they owe.
    std::vector<float> batch_sum;
    uint32_t batch_count = 0;
    double batch_staleness = 0;
    std::vector<std::pair<uint32_t, uint64_t>> batch_ids;
    std::vector<Waiter> batch_answers;
    // Backup, ssp and compressed sync rounds: the pushes of rounds not
    // complete yet, as the primary forwarded them; a promoted copy counts
    // them again.
    std::vector<ParkedPush> forwarded;
    // Primary, sync: whether the open round's pushes are forwarded to the
    // backups as they are counted (decided at its first), and their workers
    // in counting order.
    bool forwarding_round = false;
    std::vector<uint32_t> counted_order;
    // Primary, ssp in rounds: the open round's pushes as counted here (their
    // payloads shared, not copied). A copy re-created while rounds are open
    // gets them, and the parked ones (`ahead`), in its snapshot: some were
    // answered, and the copy is synced (may be promoted) only with them.
    std::vector<ParkedPush> open_pushes;
    // Hand-off of the primary role (ShardMap.handoffs): the epoch that
    // listed it (0: none), whether the drain is done, the server taking
    // over, and the requests held meanwhile, in arrival order. Once handed
    // off, the epoch that did it: requests routed before it are the
    // workers' to re-send to the new primary, not answered here.
    uint64_t handoff_epoch = 0;
    bool handoff_done = false;
    uint32_t handoff_to = 0;
    std::vector<Deferred> handoff_held;
    uint64_t handed_off_at = 0;
  };

  PartitionEngine(const ClusterConfig& config, std::unique_ptr<Optimizer> optimizer, ReplySink sink,
                  ReplicaSink replicate);
  // Replication (partition_replication.cc).
  // `created`: the partition was just created here (no snapshot needed for
  // the backups the map lists from the start). `since`: the lowest epoch a
  // primary this map newly names may have taken over at (the epoch installed
  // before it, plus one).
  void UpdateRole(Partition& p, const PartitionInfo& info, bool created, uint64_t since);
  // Sends backup `server` this partition's whole state (a re-created copy).
  void SendSnapshot(Partition& p, uint32_t server);
  // Sends backup b a probe of its last snapshot (SNAPSHOT_PROBE): that
  // snapshot's header without its state, answered in order after it.
  void ProbeSnapshot(const Partition& p, Backup& b);
  // A backup's answer to probe `h` of p: OK if p applied the snapshot it
  // names, else a refusal; a synced copy that lacks it holds a state its
  // primary replaced, and is synced no more.
  absl::Status AnswerProbe(Partition& p, const DataHeader& h);
  // The refusal of a copy whose snapshot has not arrived.
  static absl::Status AwaitingSnapshot(const Partition& p);
  void ApplySnapshot(Partition& p, const DataHeader& h, const zmq::message_t& payload);
  // A snapshot's size before the encoded answer it carries (if any).
  size_t SnapshotBytes(const Partition& p) const;
  // The size of the state in snapshot `payload` of p: SnapshotBytes plus
  // the encoded answer's length it states. The open rounds' pushes follow.
  size_t SnapshotStateBytes(const Partition& p, const zmq::message_t& payload) const;
  // A worker's push that snapshot `h` of p carries, viewed in its payload.
  struct SnapshotPush {
    DataHeader header;  // as ForwardedHeader makes it
    const char* data;
    size_t bytes;
  };
  // The pushes snapshot `h` carries after its state, each checked as a
  // forwarded push is; an error if the payload is not laid out as
  // SendSnapshot lays it out.
  absl::StatusOr<std::vector<SnapshotPush>> SnapshotPushes(const Partition& p, const DataHeader& h,
                                                           const zmq::message_t& payload) const;
  // The error feedback of p's compressed sum-only aggregates (null if none).
  compression::ErrorFeedback* PullFeedback(const Partition& p) const;
  // Whether p's snapshots carry its last round's encoded answer: sync with a
  // pull codec, whose encoder state (error feedback, weight-delta mirror) has
  // moved past that round, so the answer could not be encoded again.
  bool CarriesEncodedAnswer(const Partition& p) const;
  bool Settled(const Partition& p) const;
  // UpdateCounts and BackupUpdateCounts: the counts of the partitions `which` takes.
  std::vector<PartitionUpdates> CountsOf(absl::FunctionRef<bool(const Partition&)> which) const;
  // Sends update `h` (op REPLICATE, replica_of and round set) to every backup;
  // returns its sequence number, or 0 if the partition has no backup.
  uint64_t Replicate(Partition& p, DataHeader h, const void* data, size_t bytes,
                     std::optional<uint32_t> only = std::nullopt);
  // The same with `sum` as the payload, sent without a copy.
  uint64_t Replicate(Partition& p, DataHeader h, SharedBuffer& sum);
  // The same with p.first, the received message a round or batch of one
  // gradient is applied from, shared without a copy.
  uint64_t ReplicateFirst(Partition& p, DataHeader h);
  // Both: each backup's payload made by `payload_for_one`.
  uint64_t Replicate(Partition& p, DataHeader h, size_t bytes, std::optional<uint32_t> only,
                     absl::FunctionRef<zmq::message_t()> payload_for_one);
  // The last update every backup has confirmed, counting as confirmed what
  // was never sent to a backup that has confirmed all it was sent.
  static uint64_t ConfirmedBy(const Partition& p);
  // p's backup on `server`, or null when the map lists none there.
  static Backup* BackupOn(Partition& p, uint32_t server);
  // PartitionInfo.listed_at of `server`'s copy (0: listed from the start).
  static uint64_t ListedAt(const PartitionInfo& info, uint32_t server);
  // Answers what waited for confirmations, and lets the next round complete.
  void OnConfirmed(Partition& p);
  void HandleReplica(const zmq::message_t& peer, const DataHeader& h, const zmq::message_t* payload);
  // Validates replica update `h`: true when it is new, false when this copy
  // has applied it already; an error for a gap or a malformed update.
  absl::StatusOr<bool> ReplicaIsNew(const Partition& p, const DataHeader& h) const;
  // REQUIRES: ReplicaIsNew(p, h) returned true; `payload` holds n floats
  // (a round that names summed workers: none, and SumForwarded succeeded).
  void ApplyReplica(Partition& p, const DataHeader& h, const zmq::message_t& payload);
  // Holds an answer until the backups confirm update `sequence`.
  void AnswerWhenConfirmed(Partition& p, const zmq::message_t& peer, const DataHeader& request, uint64_t sequence);
  // p.acc, writable for a round's first gradient (a new buffer while the
  // last round's sum is still being sent to the backups).
  static float* StartSum(Partition& p);
  // Whether p.first is the open raw round's first gradient (read only while
  // p.gradients is 1: a round's first gradient replaces it, and a completed round
  // releases it).
  bool HoldsFirstGradient(const Partition& p) const;
  // Async: whether the open batch is one raw push, held in p.first (a
  // batch's first push sets or clears p.first, and applying the batch or
  // summing its second push releases it).
  static bool BatchStartsWithHeldPush(const Partition& p);
  // Applies the round's sum (p.contributors gradients): `sum`, or p.acc if
  // null; then encodes its pull answer at once when replicated, so every
  // copy's encoder state agrees.
  void ApplyRound(Partition& p, const float* sum = nullptr);
  // Completes a round that no push carried a gradient to, without an
  // optimizer step (DataHeader.no_gradient).
  void SkipRound(Partition& p);
  // What ApplyRound and SkipRound share: the round is complete here.
  void EndRound(Partition& p);
  // Answers the pulls a completed, confirmed round satisfies; replays pushes.
  void FinishRound(Partition& p);
  void RunDeferred();
  // Handle, after the counting and the deferral of later epochs.
  void Dispatch(const zmq::message_t& peer, const DataHeader& h, zmq::message_t* payload);
  // Hand-offs (partition_handoff.cc). Follows the map's hand-off of p
  // (`info`: p's entry): starts one, or ends one, dropping what was held
  // (another server is the primary now) or, still primary, queueing it in
  // `resume` to be replayed once the map is installed.
  void FollowHandoff(Partition& p, const ShardMap& map, const PartitionInfo& info, std::vector<Deferred>& resume);
  // Whether request `h` would start new work on p while p is handed off.
  bool HoldsForHandoff(const Partition& p, const DataHeader& h) const;
  // Handles the held requests that may go on now, and marks drained hand-offs done.
  void ProgressHandoffs();
  // Checkpoints (partition_checkpoint.cc): see CheckpointConfig.
  // Loads p's state from checkpoint.restore_dir.
  absl::Status RestorePartition(Partition& p);
  // After a round of a partition this server is primary for: writes its
  // state when its completed rounds reach a multiple of every_rounds, and
  // the round's manifest once no partition it is primary of still owes it
  // (FinishCheckpoints).
  void MaybeCheckpoint(Partition& p);
  // Writes p's state into `dir`'s checkpoint of `round` (sync: its
  // completed rounds; async: the request's label, its version recorded);
  // with `manifest_when_all`, FinishCheckpoints writes this server's
  // manifest. False if it could not write (CheckpointFailed says why).
  bool WriteCheckpoint(Partition& p, const std::string& dir, uint64_t round, bool manifest_when_all = true);
  // Writes this server's manifest of `dir`'s checkpoint of `round`: the
  // entries written so far and the map's owners.
  void WriteManifest(const std::string& dir, uint64_t round);
  // Sync: writes the manifest of each round in manifests_due_ once no
  // partition this server is primary of still owes it (completed below
  // it). Primaries move with hand-offs mid-checkpoint: neither the count
  // written nor a first manifest is final, so a hand-off away can complete
  // one (checked at each map too), and a partition handed here that
  // reaches the round later has it written again with its file added.
  void FinishCheckpoints();
  // Follows the map's partition owners and checkpoint request; writes at
  // once the partitions already at the requested round. `since`: as for
  // UpdateRole (a primary whose primary_since it is was named by this map).
  void FollowCheckpoints(const ShardMap& map, uint64_t since);
  // Async: writes the partitions this server is primary of and has not
  // written for the request yet (all of them when it is `new_request`;
  // later, those it took over), then its manifest. One it took over, later
  // or in the map that brought the request (the map that asked was
  // skipped), is not written where another server's manifest lists it.
  void FollowAsyncCheckpoint(bool new_request, uint64_t since);
  // Logs that this server's part of the checkpoint of `round` into `dir` is
  // not written, and keeps it for the heartbeats.
  void CheckpointFailed(const std::string& dir, uint64_t round, const std::string& error);

  // `*staged`: whether the raw gradient was summed with the held first one
  // into its accumulator while being checked (CheckRawGradient).
  absl::Status Validate(const DataHeader& h, const zmq::message_t* payload, Partition** out, bool* staged);
  // The codec of `round`'s pushes to p (compression::RoundCodec).
  compression::WireCodec PushCodec(const Partition& p, uint64_t round) const {
    return compression::RoundCodec(config_, p.codecs, compression::Direction::kPush, round);
  }
  // Refuses a raw gradient or INIT holding NaN or Inf (config
  // reject_non_finite), counting and logging it.
  // `x`: the payload's floats, or a compressed payload once decoded.
  absl::Status CheckFinite(const Partition& p, const DataHeader& h, const float* x);
  // The same for fp16/bf16 payloads, before decoding (others: no-op).
  absl::Status CheckFinite16(const Partition& p, const DataHeader& h, const zmq::message_t& payload);
  // CheckFinite for a raw fp32 payload `g`, fused where it can be. The open
  // sync round's first gradient (not deterministic), or the async batch's
  // first push, is only checked: it is held uncopied (p.first). The second
  // is summed with it (into p.acc, or p.batch_sum) by the pass that checks
  // it, and `*staged` is set: Accumulate and PushAsync skip their own pass.
  // Both sums are scratch until the push is counted, so a refused or
  // uncounted push (a retry, one parked for a later round) leaves no trace.
  // Not fused: adding into a sum that holds two already (it cannot be undone
  // bitwise once a NaN is met halfway; summing into a second buffer measured
  // slower than two passes), deterministic rounds (the message is held, not
  // copied, until the round's rank-order sum), INIT and codecs.
  absl::Status CheckRawGradient(Partition& p, const DataHeader& h, const float* g, bool* staged);
  // The error, count and log line of a refused non-finite payload `x`.
  absl::Status RefuseNonFinite(const Partition& p, const DataHeader& h, const float* x);
  // Async pushes are told from retries by request id, so an id far ahead of
  // the worker's sequence (forged or corrupt) would make every later push
  // look like a retry: such ids are refused. Records accepted ids.
  absl::Status CheckRequestId(const Partition& p, const DataHeader& h);
  // Refuses a push from a restarted worker process (new registration) that
  // would restart the rounds the old process had reached.
  absl::Status CheckIncarnation(Partition& p, const DataHeader& h) const;
  // The answer to every request for a partition whose copy here was
  // promoted before it was complete (primary, not synced).
  absl::Status LostCopy(const Partition& p) const;
  void ApplyMembership(const ShardMap& map);
  // Sets who is excluded (`now_excluded`, by rank); `removed` gets the ranks
  // newly excluded, each logged (as left where `map` lists it so). Returns
  // whether there is any.
  bool MarkExcluded(const std::vector<bool>& now_excluded, const ShardMap& map, std::vector<bool>* removed);
  // Answers the parked requests of the `removed` ranks, drops what was
  // forwarded of them, and completes each round that waited only for them.
  void DropRemoved(const std::vector<bool>& removed);
  // SSP applied on arrival (Ho et al. 2013): worker w's push of its round r
  // is answered once every live worker whose pace is known here has pushed
  // round r - staleness. The slowest worker is never held, so the job always
  // moves; a worker is known from its first push to this copy (a promoted
  // copy learns every pace within one push from each; a rejoined worker from
  // its first push at the scheduler's rejoin round).
  void RecordClock(Partition& p, const DataHeader& h);
  bool WithinBound(const Partition& p, const DataHeader& h) const;
  // Answers `h` once it is within the bound and `sequence` is confirmed.
  void AnswerBounded(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t sequence);
  void ReleaseBounded(Partition& p);
  // Worker `r.rank()` rejoined the job (a new registration): sync rounds
  // count it from r.round() on, its pushes of an earlier round that a
  // partition has completed are refused, and async counts its request ids
  // and pushes afresh.
  void Rejoin(const WorkerRejoin& r);
  uint64_t JoinRound(uint32_t w) const { return w < join_round_.size() ? join_round_[w] : 0; }
  // The map that first listed worker w's rejoin (0: none known): async
  // replica updates routed before it carry its previous process's pushes.
  uint64_t JoinEpoch(uint32_t w) const { return w < join_epoch_.size() ? join_epoch_[w] : 0; }
  // Sync: whether worker `w` must push p's open round for it to complete.
  bool Counted(const Partition& p, uint32_t w) const;
  // Whether push `h` (a worker's, or forwarded) is of a removed worker and a
  // round past p's open one: its primary refused it on the removal.
  bool RemovedPush(const Partition& p, const DataHeader& h) const;
  // Sync: every worker counted in the open round has pushed it.
  bool RoundComplete(const Partition& p) const;
  // Whether worker `w`'s push of the open round is counted (a push parked
  // for a later round is not, until it is replayed).
  static bool Contributed(const Partition& p, uint32_t w) { return p.contributed[w]; }
  void Init(Partition& p, const zmq::message_t& peer, const DataHeader& h, const zmq::message_t& payload);
  // Counts a push toward its round (or parks it for a later one). `answer`
  // false: a replayed push whose answer went out already (ssp).
  // `staged`: the payload is summed into p.acc already (CheckRawGradient).
  void PushSync(Partition& p, const zmq::message_t& peer, const DataHeader& h, zmq::message_t* payload,
                bool answer = true, bool staged = false);
  // SSP with backups: sends a worker's push to the backups (kept there until
  // its round is applied).
  void ForwardPush(Partition& p, const DataHeader& h, const zmq::message_t& payload);
  // The replica header of worker push `h` forwarded (replica_of PUSH_PULL).
  static DataHeader ForwardedHeader(const DataHeader& h);
  // Whether forwarded push `h` (a replica header) may be held by p at
  // `completed` rounds: the error, else OK. Its bytes: ForwardedPushFits.
  absl::Status CheckForwarded(const Partition& p, const DataHeader& h, uint64_t completed) const;
  bool ForwardedPushFits(const Partition& p, const DataHeader& h, size_t bytes) const;
  // Backup: keeps forwarded push `h` (a replica header) until its round is
  // applied here, in place of one it held for the same round.
  void HoldForwarded(Partition& p, const DataHeader& h, const void* data, size_t bytes);
  // A promoted copy counts the forwarded pushes of the rounds still open.
  void ReplayForwarded(Partition& p);
  // Backup: the forwarded push of worker `w`'s `round` it holds, or null.
  static ParkedPush* FindForwarded(Partition& p, uint32_t w, uint64_t round);
  static const ParkedPush* FindForwarded(const Partition& p, uint32_t w, uint64_t round) {
    return FindForwarded(const_cast<Partition&>(p), w, round);
  }
  // Sync: called as worker `h`'s push (`payload`, of `bytes` before it was
  // counted) is counted into the open round; forwards it to the backups if
  // the round's pushes go there (decided at the round's first push: a
  // compressing codec and pushes from the live workers smaller than the
  // fp32 sum).
  void ForwardCounted(Partition& p, const DataHeader& h, const zmq::message_t& payload, size_t bytes);
  // Backup: sums the forwarded pushes the round update `h` names into p.acc,
  // in its order, as the primary did; fails (leaving only scratch changed)
  // if one does not decode, or if `h` says it carries no gradient and its
  // pushes do (or the other way round). REQUIRES: ReplicaIsNew(p, h) returned true.
  absl::Status SumForwarded(Partition& p, const DataHeader& h);
  // Answers a counted or parked push of `round` once the weights it may use
  // are there: round + 1 - staleness complete (sync: its own round).
  void AnswerPush(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t round);
  // Records a gradient's staleness in rounds; returns it (0 when the push
  // does not say what it was computed on).
  double MeasureStaleness(Partition& p, const DataHeader& h, uint64_t applied, double updates_per_round);
  // The learning-rate factor of an update of staleness `tau` rounds.
  float StalenessLrScale(double tau) const;
  // `staged`: the payload is summed into p.batch_sum already (CheckRawGradient).
  void PushAsync(Partition& p, const zmq::message_t& peer, const DataHeader& h, zmq::message_t& payload,
                 bool staged = false);
  // Applies p's async batch as one update and answers its pushes.
  void ApplyAsyncBatch(Partition& p);
  void PullOrWait(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t round);
  void CompleteRound(Partition& p);
  // `staged`: CheckRawGradient summed the payload with p.first into p.acc in
  // this Handle call, and nothing has written p.acc since.
  absl::Status Accumulate(Partition& p, uint32_t worker, uint64_t round, zmq::message_t* payload,
                          bool staged = false);
  void SumRound(Partition& p);
  // The answer payload for a pull: weights (raw or fp16/bf16) or, in sum-only
  // mode after a round, the aggregate (raw or compressed with error feedback).
  // Fails if the data cannot be encoded (e.g. non-finite weight deltas).
  absl::StatusOr<zmq::message_t> AnswerPayload(Partition& p, DataHeader* reply);
  float* WritableWeights(Partition& p);
  void Answer(const zmq::message_t& peer, const DataHeader& request, const absl::Status& status);
  void AnswerWeights(Partition& p, const zmq::message_t& peer, const DataHeader& request);

  const ClusterConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
  const bool sum_only_;
  // Server-side error feedback of compressed aggregates, per pull codec spec.
  absl::flat_hash_map<std::string, std::unique_ptr<compression::ErrorFeedback>> pull_feedback_;
  const ReplySink sink_;
  const ReplicaSink replicate_;
  const bool replicated_;  // the config keeps more than one copy
  std::vector<uint64_t> worker_last_id_;  // async, per worker rank: highest request id accepted
  // Rounds a worker may run ahead of the slowest (ssp; 0 for sync), the
  // staleness its push-pulls are answered with, and the farthest ahead a
  // push or pull may be before it is refused (bounds parked memory).
  const uint32_t staleness_;
  const bool bounded_;  // SSP applied on arrival: answers wait for the staleness bound
  const uint32_t answer_staleness_;
  const uint64_t max_ahead_;
  // SSP: each push is forwarded to the backups before it is answered ahead
  // of its round, so a failover loses none. With replication 1 too: a
  // primary move gives the partition a copy a failover would promote (with
  // no backup, forwarding sends nothing).
  const bool forwards_pushes_;
  // Sync with backups: compressed rounds may go to them as their pushes.
  const bool forwards_counted_;
  bool batching_ = false;  // between BeginBatch and EndBatch
  // Requests routed with a later epoch than this server's, held until it
  // installs that epoch: at most kMaxDeferred, at most kEpochsAhead ahead
  // once it has a map (further is a bad request, refused). Not 4, as it
  // was: primary moves (replication 1) make about three epochs each within
  // milliseconds, and a server 6 behind a worker refused its push.
  static constexpr size_t kMaxDeferred = 4096;
  static constexpr int kSnapshotTries = 3;
  static constexpr uint64_t kEpochsAhead = 64;
  std::vector<Deferred> deferred_;
  // Partitions handed off from here whose copy was then dropped (a primary
  // move), with the epoch that dropped it: a request routed before that
  // epoch is left unanswered, as while the copy was a backup (handed_off_at),
  // since an answer (even "wrong epoch") would settle the request its worker
  // re-sent to the new primary.
  absl::flat_hash_map<uint64_t, uint64_t> dropped_after_handoff_;
  uint64_t epoch_ = 0;
  bool joined_running_job_ = false;
  // A map with partitions was installed: copies created after it are added
  // to a running job (unsynced until their snapshot), not listed from the start.
  bool partitions_mapped_ = false;
  bool membership_applied_ = false;  // a map's membership was applied before
  uint32_t server_index_ = 0;
  std::vector<std::string> server_addresses_;  // per server index, from the latest map
  std::vector<bool> excluded_;  // per worker rank: removed from the job
  uint32_t num_excluded_ = 0;
  // Per worker rank, from the map's rejoined_workers (join_round_ stays
  // empty until a worker rejoins, so rounds take the fast path): the round
  // a rejoined worker is counted from, the registration whose rejoin was
  // applied, and the map that first listed it.
  std::vector<uint64_t> join_round_;
  std::vector<uint64_t> join_incarnation_;
  std::vector<uint64_t> join_epoch_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Partition>> partitions_;
  std::set<uint32_t> round_stalled_workers_;  // listed by the last CheckRoundStalls
  EngineStats stats_;
  // Checkpoints: every partition of the map and its primary; per round being
  // written, the manifest of the files written so far (sync: the last
  // kKeptCheckpoints written are kept, for a partition handed here later).
  google::protobuf::RepeatedPtrField<CheckpointManifest::Owner> checkpoint_owners_;
  absl::flat_hash_map<std::pair<std::string, uint64_t>, CheckpointManifest> open_checkpoints_;  // (dir, round)
  // Sync: the open checkpoints holding files their manifest (if written) lacks.
  absl::flat_hash_set<std::pair<std::string, uint64_t>> manifests_due_;
  CheckpointRequest requested_checkpoint_;  // from the map: shardps checkpoint
  absl::flat_hash_set<uint64_t> async_checkpoint_written_;  // partitions written (or listed elsewhere) for it
  CheckpointFailure checkpoint_failure_;
  uint64_t max_completed_ = 0;
  uint64_t copies_generation_ = 0;  // see SyncedCopies
  absl::flat_hash_set<uint64_t> handing_off_;  // partitions with a hand-off under way
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_PARTITION_ENGINE_H_
