// What the scheduler knows about the cluster: registered nodes, liveness,
// the versioned shard map and barriers. Transport-free, so tests drive it
// directly; the gRPC service is a thin layer on top.
//
// Thread-safe: every method may be called from any gRPC handler thread.
// Blocking methods take a deadline and say, on timeout, what was missing.
#ifndef SHARDPS_SCHEDULER_CLUSTER_STATE_H_
#define SHARDPS_SCHEDULER_CLUSTER_STATE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "scheduler/copy_moves.h"  // ServerRoom

namespace shardps {

class ClusterState {
 public:
  using Clock = std::function<absl::Time()>;
  // Called with the whole state after every change, outside the state's
  // lock (the scheduler writes it to its --state-dir or etcd). A failure is
  // logged by the hook; the change stands, a map goes out all the same, and
  // the state is written again by the next call that writes, at most every
  // kRewriteAfterFailure, until a write succeeds; a barrier's pass is answered
  // only once written. FailedPrecondition: refused for good (another
  // scheduler holds the leadership); a barrier waiting for it fails at once.
  using Persist = std::function<absl::Status(const SchedulerState&)>;
  static constexpr absl::Duration kRewriteAfterFailure = absl::Milliseconds(250);
  // REQUIRES: `config` is valid.
  explicit ClusterState(ClusterConfig config, Clock clock = absl::Now, Persist persist = nullptr);
  // Resumes from a persisted state: the same nodes (each given a fresh
  // heartbeat_timeout to reconnect), node ids, shard map and epoch.
  // REQUIRES: `state.config()` is valid.
  static std::unique_ptr<ClusterState> Restore(const SchedulerState& state, Clock clock = absl::Now,
                                               Persist persist = nullptr);

  const ClusterConfig& config() const { return config_; }

  // Servers get the next free index, or their old one when their address
  // registers again before any tensor is defined and its server has been
  // silent for heartbeat_timeout_ms (a restart). An address whose server is
  // alive is refused (no takeover), and so is, once partitions exist, one
  // whose state died with it (a new process there would serve empty
  // partitions). Refuses more servers than configured and data addresses
  // that are not tcp://host:port with a port in [1, 65535].
  absl::StatusOr<RegisterResponse> RegisterServer(const RegisterRequest& request);
  // A rank removed from the running job (declared dead) may register again:
  // it rejoins at a round past every server's (RejoinRunningJob), chosen
  // once every server not declared dead has reported within two heartbeat
  // intervals (waiting at most heartbeat_timeout_ms and one interval; a
  // call ends with Aborted, RejoinAskAgainRefusal, where it waited half the
  // time CheckLiveness counts it as heard: asked again, the wait goes on). Refuses
  // ranks outside [0, num_workers), and a rank held by a live registration: one still waiting for the
  // cluster, or, once it formed, one heard from within heartbeat_timeout_ms.
  // A rank registering again after that replaces its old entry (a restarted
  // worker gets a new node id; servers refuse its pushes that would restart
  // rounds).
  absl::StatusOr<RegisterResponse> RegisterWorker(const RegisterRequest& request);
  // Blocks until every server and worker has registered. `node_id`: the
  // worker whose Register call waits (its rank is free again once the wait
  // fails); 0 for none. `caller_gone`, when given, is asked a few times a
  // second: once it says the caller went away (its process killed while it
  // waited), the wait fails with Cancelled and the rank is unregistered: the
  // cluster waits for it again, and a process started again for it registers
  // instead of being refused until this wait's deadline.
  absl::Status WaitForCluster(absl::Time deadline, uint64_t node_id = 0,
                              const std::function<bool()>& caller_gone = nullptr);

  // NotFound for an unknown node id; FailedPrecondition for a node already
  // declared dead (it must not act as a member any more), once the state
  // that declared it is written, or its write failed without deposing this
  // scheduler (its map goes out all the same, and the servers act on it):
  // Unavailable until then (waiting at most kRewriteAfterFailure), and for
  // good where that write was refused (this scheduler was deposed, and the
  // job never stored the declaration).
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);

  // Declares dead every node silent for longer than heartbeat_timeout_ms and
  // publishes a new epoch: a dead server is marked in the map (workers fail
  // its requests at once), a dead worker is excluded (sync rounds and
  // barriers go on without it). Only while a majority of the live nodes is
  // heard from: a scheduler that hears from fewer is more likely cut off
  // itself and declares no one. Returns one line per node declared dead (or
  // one saying it is cut off).
  std::vector<std::string> CheckLiveness();

  // A node's shard-map watch (WatchShardMap) opened and ended; `peer_gone`:
  // the call was cancelled from the node's side. A node whose every watch so
  // ended closed its connection: its process is gone (killed, crashed; its
  // kernel closed the socket) or it let go on purpose. Either way this
  // scheduler still reaches its host, which a partition never shows:
  // CheckLiveness counts it among the nodes heard, so that several processes
  // killed at once are declared dead rather than taken for the scheduler
  // being cut off. Only a watch that ends while its node is still heard
  // counts: one this scheduler's own transport gave up on ends so too.
  // Nodes the scheduler does not know are ignored.
  void WatchOpened(uint64_t node_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Registrations of removed rank `rank` waiting for the servers' reports
  // before it rejoins (RegisterWorker).
  int RejoinCallsWaiting(uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  void WatchEnded(uint64_t node_id, bool peer_gone) ABSL_LOCKS_EXCLUDED(mu_);

  // First call: builds the shard map (next epoch). Later calls: must declare
  // the same tensors. Returns once every server reports serving that epoch.
  absl::StatusOr<ShardMap> DefineTensors(const std::vector<TensorSpec>& tensors, absl::Time deadline);

  // Returns the map once its epoch is above `known_epoch` and the state that
  // holds it is written (the write tried: a failed one is logged); nullopt
  // at the deadline (callers loop, checking for cancellation in between).
  // A scheduler restarted from its state then never issues, with other
  // contents, an epoch that a node already holds.
  std::optional<ShardMap> WaitForMap(uint64_t known_epoch, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // Returns once every worker still in the job has entered barrier `name`
  // and the pass is written with the state; `live` (optional) receives the
  // ranks in the job when it passed. `passes_seen`: the passes of `name` the
  // worker has seen; where it passed more often, answers at once.
  absl::Status Barrier(uint64_t node_id, const std::string& name, absl::Time deadline,
                       std::vector<uint32_t>* live = nullptr, std::optional<uint64_t> passes_seen = std::nullopt);

  // Returns once every change made so far is written with the state (a
  // failed write is tried again, paced); else fails, saying `what` (e.g.
  // "worker rank 3: registered") and the write's own error: at once where
  // the write was refused for good (deposed), else DEADLINE_EXCEEDED at
  // `deadline`. OK at once without a store.
  absl::Status Written(absl::Time deadline, absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // Asks every server for a checkpoint into `dir` (a new epoch whose map
  // carries the request) at a round no partition has completed yet: past the
  // most any server reported, by the rounds the fastest one completes in two
  // heartbeat intervals (its report's age plus the map's way to it) and one
  // more. Returns that round. Refused before the map exists, and for a
  // config whose checkpoints would not be exact (ValidateConfig says why).
  absl::StatusOr<CheckpointResponse> RequestCheckpoint(const std::string& dir);

  // `shardps drain`: marks live server `index` draining in a new epoch
  // (ServerInfo.draining). Its copies then move to the other live servers,
  // primaries by hand-off, the way a join's moves do (MaybeStartCopyMoves),
  // and it gets no new ones; once the map lists none on it, the server stops
  // and leaves (ServerLeaves). Asking again for a draining server answers
  // the same. Refused before the tensors are defined (stop it instead: its
  // place is free), once every worker has left (the job is over), for a
  // dead server, and where the other live servers are
  // fewer than the copies each partition keeps or, as far as they reported
  // it, have less memory than all the copies need.
  absl::StatusOr<DrainResponse> Drain(uint32_t index);
  // `shardps drain --cancel`: ends the drain of live server `index` in a new
  // epoch; it serves on with the copies it still holds. Its moves are
  // undone (their extra copies dropped) but for those handing a primary off,
  // which finish; then the servers are balanced again (it may be given
  // copies back). Refused where it is not draining, and once the map lists
  // no copy on it: it may already be stopping.
  absl::StatusOr<DrainResponse> CancelDrain(uint32_t index);

  // Every node with its state and, once its heartbeats carry them, its
  // counters and rates (NodeStatus).
  StatusResponse Status();
  // Nodes this scheduler has declared dead since it started, one for each
  // declaration: a rank that rejoined, or a server index a replacement took,
  // counts again when it dies again (Status() says only who is dead now).
  // Workers that left are not counted, nor a drained server that fell
  // silent holding nothing (its leave missed this scheduler: it left).
  uint64_t NodesDeclaredDead();
  // Server indices handed out so far: the config's servers and those that
  // joined as one more (a replacement takes a dead one's index).
  uint32_t ServerIndices();

 private:
  struct Node {
    uint64_t id = 0;
    Role role = ROLE_UNSPECIFIED;
    uint32_t rank = 0;  // worker rank or server index
    std::string address, host;
    absl::Time last_seen;
    uint64_t applied_epoch = 0;
    bool dead = false;
    bool heard = true;  // registered or heartbeated since this scheduler started
    bool left = false;  // dead because it said it leaves (HeartbeatRequest.leaving)
    // The Save() that holds its declaration of death (CheckLiveness): it is
    // told it was declared dead only once that state is written.
    uint64_t declared_in_save = 0;
    // Why, when it left on an error (HeartbeatRequest.leaving_error), or a
    // draining server stopped before it was drained (ServerLeaves).
    std::string left_error{};
    // Servers: how the process whose place this one took ended (Ended), so
    // that `shardps drain --wait` does not take a death for the end of a
    // drain; empty where it took no one's place.
    std::string replaced{};
    // Workers: when a new process for the rank last asked to register while
    // this one still held it (CheckLiveness counts the rank as reachable).
    absl::Time successor_seen = absl::InfinitePast();
    // Servers: the rounds they report completed, the round the rate (rounds
    // per second) is measured from and when it was reported, and the rate
    // between their last two reports (Heartbeat says which count).
    uint64_t completed_round = 0;
    std::optional<uint64_t> fewest_round = std::nullopt;  // HeartbeatRequest.fewest_completed_round
    uint64_t rate_round = 0;
    absl::Time round_seen = absl::InfinitePast();
    double round_rate = 0;
    double peak_rate = 0;  // the highest round_rate seen
    bool joined_running_job = false;  // servers: in a dead one's place or as one more (JoinRunningJob)
    CheckpointFailure checkpoint_failure{};  // servers: the last they reported (HeartbeatRequest)
    // The counters of the last heartbeat that carried them and when it came;
    // the earlier report rates are measured from, and those rates.
    NodeCounters counters{};
    absl::Time counters_seen = absl::InfinitePast();
    NodeCounters base{};
    absl::Time base_seen = absl::InfinitePast();
    NodeRates rates{};
    uint64_t memory_bytes = 0;  // servers: what they said they can hold
    uint64_t saved_steps = 0;   // workers: counters.steps when it last caused a write
    bool rendezvous = false;    // workers: their Register call waits for the cluster
    // Its shard-map watches open here, and whether its last one ended from
    // its side with none open since (WatchEnded).
    int watches = 0;
    bool watch_closed = false;
    // Servers: the copies their last heartbeat (at applied_epoch) reported
    // synced, sorted.
    std::vector<uint64_t> synced_copies{};
  };
  struct BarrierState {
    uint64_t generation = 0;
    std::set<uint32_t> arrived;          // worker ranks
    std::vector<uint32_t> live_at_pass;  // ranks in the job when it last passed
  };
  // How a server process whose place another takes ended (Node::replaced).
  static std::string Ended(const Node& old);

  bool ClusterComplete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingNodes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ServersServe(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ServersBehind(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Node* FindNode(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a heartbeat's counters and updates the node's rates.
  void RecordCounters(Node& node, const NodeCounters& counters) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ServerInfo* MapServer(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Excluded(uint32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t LiveWorkers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WorkersGoOn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // "N workers go on"
  // How recent a node's last heartbeat must be for CheckLiveness to count
  // it as heard.
  absl::Duration HeardWithin() const;
  // Passes every barrier that all live workers have entered.
  void PassCompleteBarriers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes silent `node` from the job; returns the line that says so. A
  // draining server that holds nothing is taken as drained and left.
  std::string DeclareDead(Node& node, absl::Duration silent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `node` out of the job in the current (new) epoch: dead, its rank
  // excluded, and the barriers only it held up passed.
  void ExcludeWorker(Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `node` said it leaves: removed from the job as a dead one is, at
  // once, and listed as left rather than dead; with `error` (its training
  // process stops on one: at most kMaxLeavingError bytes kept) as failed.
  void Leave(Node& node, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kMaxLeavingError = 4096;
  // Server `node` said it stops (it drained on SIGTERM) once the job has
  // partitions: out of the map in a new epoch and listed as left, its
  // partitions failed over now rather than after heartbeat_timeout_ms, so a
  // rolling restart stalls no round for the timeout and a server started
  // again at its address takes its place at once. Not counted as declared
  // dead. Before the tensors are defined its place is simply free; once every
  // worker has left (the job is over; not when they were declared dead, as
  // they may be started again) nothing fails over.
  // Logs what it did.
  void ServerLeaves(Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks server `index` dead in the map with `reason` (what workers report
  // for its lost partitions) and fails it over. Says what moved.
  std::string RemoveServer(uint32_t index, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Promotes a live backup of every partition whose primary was server
  // `dead` (the first one its server last reported synced, else the first),
  // and drops `dead` from every backup list. Says what moved.
  std::string FailOver(uint32_t dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives every partition short of `replication` copies new backups on the
  // live servers holding the fewest elements that have room for them (the
  // memory they reported); returns how many.
  int Rereplicate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The elements each server can hold, from the memory it reported (none
  // listed for a server that reported none).
  ServerRoom ServerRooms() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live server index -> elements of the copies (primary or backup) it holds.
  std::map<uint32_t, uint64_t> LiveServerLoads() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::set<uint32_t> LiveServers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The servers the map marks draining (Drain), live or not.
  std::set<uint32_t> DrainingServers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live servers that are not draining: those copies and roles go to.
  std::set<uint32_t> StayingServers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a server's death: ends drains (clears ServerInfo.draining) while
  // the live servers that are not draining are fewer than the copies each
  // partition keeps, so that Rereplicate can use them again; such a drain
  // could never finish. Returns what it ended, for the death's log line.
  std::string EndDrainsLeftShort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether server `server`'s last heartbeat reported its copy of `p`
  // synced, at an epoch at least that of the map that gave it the copy.
  bool ReportedSynced(uint32_t server, const PartitionInfo& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every copy the map gives a live server was reported synced by
  // that server's last heartbeat at the current epoch.
  bool LiveCopiesSynced() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Phase 1 of balancing the loads (PlanCopyMoves), whatever unbalanced them
  // (a server that joined, a failover's re-created copies): once no move is
  // under way, every live server serves the current epoch (so the snapshots
  // reach servers ready for them) and holds every copy of it synced (a
  // failover's re-created copies come first), a new epoch in which each
  // planned move lists its new server as an extra backup (its primary sends
  // it a snapshot) and is recorded in map_.moves. Nothing when the live
  // servers are balanced or no backup can move. Needs no state of its own, so
  // a restarted scheduler plans the moves for a join it did not see.
  void MaybeStartCopyMoves() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Phase 2: the moves to server `node` whose copy its heartbeat reports
  // synced (at an epoch that lists it) drop their old copy, in one new epoch.
  // A primary move first hands the role to that copy (a Handoff, once no
  // hand-off pause is on: EndLateHandoffs), and drops the old copy on the
  // first such report at the epoch that made `node` the primary.
  void FinishCopyMoves(const Node& node, const HeartbeatRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failover of server `dead`: a move to or from it ends (its other
  // copy is a plain one now), and so does one whose partition is left with
  // no more than `replication` copies (the extra one is needed) or whose old
  // copy became the primary (a primary move: whose role went to a third
  // server). Returns how many ended.
  int EndBrokenCopyMoves(uint32_t dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Balancing the primaries, once the copies are (PlanCopyMoves has nothing
  // left to move): epoch 1 of each planned hand-off (PlanHandoffs) lists it
  // in map_.handoffs; its old primary drains the partition and says so.
  void MaybeStartHandoffs(const std::set<uint32_t>& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Epoch 2: the hand-offs from server `node` that its heartbeat reports
  // drained (at an epoch that lists them) make their `to` the primary and
  // `from` a backup in its place, in one new epoch.
  void FinishHandoffs(const Node& node, const HeartbeatRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failover of server `dead`: a hand-off from or to it ends (its
  // old primary, if alive, resumes). Returns how many ended.
  int EndBrokenHandoffs(uint32_t dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends, in a new epoch, every hand-off not reported drained within
  // heartbeat_timeout_ms of its listing. Returns how many ended.
  int EndLateHandoffs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Server `request` takes dead server `index`'s place in the running job:
  // a new epoch gives it the copies that are missing.
  absl::StatusOr<RegisterResponse> JoinRunningJob(uint32_t index, const RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A round no partition has completed yet: past the most any server
  // reported, by the rounds the fastest one completes in two heartbeat
  // intervals (its report's age plus the new map's way to it), plus one.
  // `for_rejoin`: at the highest rate any server ever reported (rounds that
  // stalled for a dead worker resume at full pace, which the last two
  // reports understate), over two intervals plus the oldest report's age.
  uint64_t RoundPastServers(bool for_rejoin) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a rank removed before the tensors were defined back into the job
  // (a new epoch), for a new process that registers as at the start.
  void ReadmitBeforeTensors(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The most rounds a live server reported completed.
  uint64_t RoundsReported() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fewest rounds a live server's primaries reported completed
  // (RoundsReported where none said).
  uint64_t FewestRoundsReported() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a live worker other than `rank` trains in the rounds the servers
  // are at: one not removed from the job and not rejoined at a round past
  // the open one (the most rounds they reported completed), nor rejoined
  // alone at `fewest_asked` or later (the fewest rounds reported when `rank`
  // asked to rejoin: it has not trained one since).
  bool AnotherWorkerTrains(uint32_t rank, uint64_t fewest_asked) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a live server has reported a completed round (a heartbeat since
  // training started, or a restored checkpoint's round).
  bool AnyServerReportedARound() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a live server's pace of rounds has been measured (peak_rate).
  bool AnyServerPaceKnown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `request` takes its excluded rank back: a new epoch drops the
  // rank from excluded_workers and records its join round J
  // (RoundPastServers) in rejoined_workers; servers count it in rounds >= J
  // only. `alone_heard`: no other worker trained when it asked, and every
  // live server has reported since; J is then the round they are at (the
  // most they reported completed), if still no other worker trains
  // (AnotherWorkerTrains with `fewest_asked`, the fewest rounds reported
  // when it asked). The answer carries J
  // and the barriers passed so far. Refused before the tensors are defined
  // (no round to join at), and where the workers hold the weights
  // (update_mode SUM_ONLY, sync pull codecs).
  absl::StatusOr<RegisterResponse> RejoinRunningJob(const RegisterRequest& request, bool alone_heard,
                                                    uint64_t fewest_asked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Snapshots the state for WriteUnsaved; the file is written outside mu_,
  // so no heartbeat waits for a disk.
  void Save() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK once the state that declared dead node `node` (named `who`) is
  // written, or its map went out after a write that failed without deposing
  // this scheduler (saves_published_), waiting at most kRewriteAfterFailure;
  // UNAVAILABLE ("ask again") until then, and for good where that write was
  // refused (the job never stored the declaration). Releases mu_ while it waits.
  absl::Status DeclarationStored(const Node& node, const std::string& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the latest snapshot, if any (writes stay in order under write_mu_).
  void WriteUnsaved() ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Written for the changes up to Save() count `saved`.
  absl::Status AwaitWritten(uint64_t saved, absl::Time deadline, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Barrier without waiting for the write; `saved` gets the Save() count
  // once it passed.
  absl::Status EnterBarrier(uint64_t node_id, const std::string& name, absl::Time deadline,
                            std::vector<uint32_t>* live, std::optional<uint64_t> passes_seen, uint64_t* saved)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Declared first in every method that may Save: writes once the method's
  // lock is released.
  struct WriteOnReturn {
    explicit WriteOnReturn(ClusterState* s) : state(s) {}
    ~WriteOnReturn() {
      if (state->persist_) state->WriteUnsaved();
    }
    ClusterState* state;
  };

  const ClusterConfig config_;
  const Clock clock_;
  const Persist persist_;
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  uint64_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint32_t, Node> servers_ ABSL_GUARDED_BY(mu_);  // by index
  std::map<uint32_t, Node> workers_ ABSL_GUARDED_BY(mu_);  // by rank
  ShardMap map_ ABSL_GUARDED_BY(mu_);                       // epoch 0: no tensors yet
  std::vector<TensorSpec> tensors_ ABSL_GUARDED_BY(mu_);
  // Liveness is judged only once every node has registered (a worker waiting
  // in rendezvous sends no heartbeat yet), and a check that comes late (the
  // scheduler was paused) first forgives the pause.
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  bool isolated_ ABSL_GUARDED_BY(mu_) = false;  // said once: hears from no majority
  // A removed rank's registrations waiting for the servers' reports before
  // it rejoins (RegisterWorker). A call ends, to be asked again, once its
  // ask is half CheckLiveness's heard window old; the calls that ask again
  // go on with one wait, bounded as one.
  struct RejoinWait {
    int calls = 0;                                  // waiting now
    absl::Time first_asked = absl::InfinitePast();  // clock_: the wait's first call
    absl::Time last_asked = absl::InfinitePast();   // clock_: its latest (CheckLiveness)
    uint64_t fewest_asked = 0;                      // FewestRoundsReported() at its first call
    absl::Time until = absl::InfinitePast();        // when the wait ends, however many calls it takes
    absl::Time asked_again_by = absl::InfinitePast();  // a call after this starts a new wait
  };
  // The time a process told to ask again (RejoinAskAgainRefusal) has to go
  // on with its wait.
  static constexpr absl::Duration kRejoinAskedAgainWithin = absl::Seconds(1);
  // By rank: for CheckLiveness, one node heard per rank however many of its
  // calls wait, while its last ask is recent.
  std::map<uint32_t, RejoinWait> rejoins_waiting_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<SchedulerState> unsaved_ ABSL_GUARDED_BY(mu_);  // changes not written yet
  uint64_t saves_ ABSL_GUARDED_BY(mu_) = 0;                     // Save() calls; unsaved_ is the last
  uint64_t saves_written_ ABSL_GUARDED_BY(mu_) = 0;             // the Save() count last written
  // The Save() count last tried and not refused for good (written, or
  // failed without deposing this scheduler): its map goes out (WaitForMap).
  uint64_t saves_published_ ABSL_GUARDED_BY(mu_) = 0;
  // The last write failed (its state is unsaved_ again, unless a newer
  // one replaced it): the next is tried no sooner than this.
  absl::Time rewrite_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status last_write_ ABSL_GUARDED_BY(mu_);  // the latest write's outcome (a barrier's error says it)
  uint64_t written_epoch_ ABSL_GUARDED_BY(mu_) = 0;            // of the last state written (WaitForMap)
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  // The epoch whose balance MaybeStartCopyMoves judged last (0: none), so a
  // heartbeat costs no load computation once the epoch's copies are synced.
  uint64_t balance_checked_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the drain under way moves nothing more, as judged then (empty: it
  // moves, or none is under way); StatusResponse.drain_waits.
  std::string drain_waits_ ABSL_GUARDED_BY(mu_);
  // When the latest server joined (InfinitePast: none since the last plan),
  // when the moves under way began to be planned (the join, else the plan),
  // and how many were planned since, for the log line that says the loads
  // are balanced. Not persisted: only that line needs them.
  absl::Time joined_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time moves_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool moves_since_join_ ABSL_GUARDED_BY(mu_) = false;
  bool moves_resumed_ ABSL_GUARDED_BY(mu_) = false;  // planned before a restart (Restore)
  int moves_planned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t moves_planned_total_ ABSL_GUARDED_BY(mu_) = 0;  // StatusResponse.copy_moves_planned
  // Hand-offs: when each under way was listed (a restarted scheduler counts
  // from its first check), when the latest server joined (InfinitePast: no
  // join since the primaries were last balanced), when the hand-offs under
  // way began to be planned, and counts for the log and StatusResponse.
  std::map<uint64_t, absl::Time> handoff_started_ ABSL_GUARDED_BY(mu_);
  absl::Time last_join_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time handoffs_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool handoffs_since_join_ ABSL_GUARDED_BY(mu_) = false;
  bool handoffs_resumed_ ABSL_GUARDED_BY(mu_) = false;  // planned before a restart (Restore)
  // After hand-offs ended undrained, none is planned before this time.
  absl::Time handoffs_retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int handoffs_planned_ ABSL_GUARDED_BY(mu_) = 0;
  int handoffs_made_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handoffs_planned_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handoffs_made_total_ ABSL_GUARDED_BY(mu_) = 0;
  // When each draining server was marked (a restarted scheduler counts from
  // its restart), for the line that says it is drained.
  std::map<uint32_t, absl::Time> drain_started_ ABSL_GUARDED_BY(mu_);
  // Every DeclareDead since this scheduler started (NodesDeclaredDead): a
  // rejoin or a replacement clears a node's `dead`, never this count.
  uint64_t declared_dead_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_CLUSTER_STATE_H_
