#include "scheduler/cluster_state.h"

#include <cmath>

#include <algorithm>
#include <map>
#include <random>

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/peer_seal.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/endpoint.h"
#include "common/names.h"
#include "common/protocol.h"
#include "common/scheduler_refusal.h"
#include "common/status_macros.h"
#include "compression/codec_policy.h"
#include "scheduler/copy_moves.h"
#include "scheduler/model_limits.h"
#include "scheduler/node_rates.h"
#include "scheduler/shard_assignment.h"

namespace shardps {
namespace {

absl::Status CheckCurveKey(const RegisterRequest& r) {
  if (r.curve_public_key().empty()) return absl::OkStatus();
  auto key = DecodeZ85Key(r.curve_public_key());
  if (key.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(r.role() == SERVER ? "server " + r.data_address()
                                                                     : absl::StrCat("worker rank ", r.rank()),
                                                 " registered a bad data-plane public key: ", key.status().message()));
}

// The host and address a node registers are shown in status, logs and
// errors and kept in the state: a node may not make them megabytes long
// (1 MB hosts made every Status answer 1 MB, and each error echoing one
// exceeded the client's metadata limit, hiding the reason).
absl::Status CheckRegisteredStrings(const RegisterRequest& r) {
  if (absl::Status s = CheckName("host", r.host()); !s.ok()) return s;
  return CheckName("server data address", r.data_address());
}

// Servers tell nodes apart by their data-plane keys (server/sender_roles.h),
// which every node and `shardps status` can read in the map. A node that
// registered another's public key (it cannot seal with it: the secret half
// never leaves its process) had the servers take that node's requests for its
// own, and refuse them all ("a request naming worker 0 from worker 1's key").
// Keys are made fresh per process: the same key again is the same node.
absl::Status CheckKeyNotAnothers(const RegisterRequest& r, const ShardMap& map) {
  if (r.curve_public_key().empty()) return absl::OkStatus();
  const std::string who =
      r.role() == SERVER ? absl::StrCat("server at ", r.data_address()) : absl::StrCat("worker rank ", r.rank());
  for (int rank = 0; rank < map.worker_curve_keys_size(); ++rank) {
    if (map.worker_curve_keys(rank) != r.curve_public_key() ||
        (r.role() == WORKER && static_cast<uint32_t>(rank) == r.rank())) {
      continue;
    }
    return absl::AlreadyExistsError(
        absl::StrCat(who, " registered the data-plane key of worker rank ", rank, ": a key speaks for one node"));
  }
  for (const ServerInfo& s : map.servers()) {
    if (s.curve_public_key() != r.curve_public_key() || (r.role() == SERVER && s.data_address() == r.data_address())) {
      continue;
    }
    return absl::AlreadyExistsError(absl::StrCat(who, " registered the data-plane key of server ", s.index(), " (",
                                                 s.data_address(), "): a key speaks for one node"));
  }
  return absl::OkStatus();
}

absl::Status CheckVersion(const RegisterRequest& r) {
  if (r.protocol_version() == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("protocol version ", r.protocol_version(), " of ",
                                                    r.host(), " is not supported (scheduler speaks ",
                                                    kProtocolVersion, ")"));
}

// A codec a job declares for a tensor must be one the servers and workers
// accept in this config, as if it were the config's tensor_codecs entry.
absl::Status ValidateDeclaredCodecs(const std::vector<TensorSpec>& tensors, const ClusterConfig& config) {
  for (const TensorSpec& t : tensors) {
    if (t.codec().empty()) continue;
    ClusterConfig wanted = config;
    (*wanted.mutable_compression()->mutable_tensor_codecs())[t.name()] = t.codec();
    absl::Status s = compression::ValidateCompressionConfig(wanted);
    if (s.ok()) s = ValidateConfig(wanted);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "' declares codec '", t.codec(), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string DescribeTensor(const TensorSpec& t) {
  return absl::StrCat("'", t.name(), "' [", absl::StrJoin(t.shape(), "x"), "]",
                      t.codec().empty() ? "" : absl::StrCat(" codec '", t.codec(), "'"));
}

}  // namespace

namespace {

// `config` with a job id: the one it has (a restored state's), else a new
// random one (ClusterConfig.job_id).
ClusterConfig WithJobId(ClusterConfig config) {
  if (config.job_id() != 0) return config;
  std::random_device entropy;
  std::mt19937_64 random((static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^
                         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  uint64_t id = 0;
  while (id == 0) id = random();
  config.set_job_id(id);
  return config;
}

// How long a gRPC server's connection keeps data its peer has not
// acknowledged before its kernel drops it (TCP_USER_TIMEOUT, on by default
// on servers; this one sets no keepalive that would change it).
constexpr absl::Duration kServerTransportTimeout = absl::Seconds(20);

// Why a server that stopped once the job was over is out of the map
// (ServerLeaves): every other removal says why (RemoveServer).
constexpr char kLeftAfterTheWorkers[] = "it stopped after every worker had left the job";

}  // namespace

ClusterState::ClusterState(ClusterConfig config, Clock clock, Persist persist)
    : config_(WithJobId(std::move(config))), clock_(std::move(clock)), persist_(std::move(persist)) {}

std::unique_ptr<ClusterState> ClusterState::Restore(const SchedulerState& state, Clock clock, Persist persist) {
  auto cs = std::make_unique<ClusterState>(state.config(), std::move(clock), std::move(persist));
  absl::MutexLock lock(&cs->mu_);
  const absl::Time now = cs->clock_();
  cs->next_node_id_ = state.next_node_id();
  for (const SchedulerState::Node& n : state.nodes()) {
    auto& group = n.role() == SERVER ? cs->servers_ : cs->workers_;
    Node& node = group[n.rank()];
    node = Node{n.id(), n.role(), n.rank(), n.address(), n.host(), now, 0, n.dead(), /*heard=*/false};
    node.left = n.left();
    node.left_error = n.left_error();
    node.peak_rate = n.peak_round_rate();
    node.memory_bytes = n.memory_bytes();
    node.counters.set_steps(n.worker_steps());
    node.saved_steps = n.worker_steps();
    node.replaced = n.replaced();
  }
  cs->map_ = state.shard_map();
  for (ServerInfo& s : *cs->map_.mutable_servers()) {
    // Saved before such servers were given one (fix20: a worker started
    // again on this state was told "server 1 was declared dead ... ()").
    if (s.dead() && s.dead_reason().empty()) s.set_dead_reason(kLeftAfterTheWorkers);
  }
  cs->written_epoch_ = cs->map_.epoch();
  cs->tensors_.assign(state.tensors().begin(), state.tensors().end());
  for (const SchedulerState::Barrier& b : state.barriers()) {
    BarrierState& restored = cs->barriers_[b.name()];
    restored.generation = b.generation();
    restored.live_at_pass.assign(b.live_ranks().begin(), b.live_ranks().end());
  }
  // Moves and hand-offs under way were planned by the scheduler that died:
  // the lines that say they are done count them, and the time, from here.
  cs->moves_planned_ = cs->map_.moves_size();
  // (A primary move's hand-off is part of its move, not a balancing one.)
  const auto& moves = cs->map_.moves();  // read under the lock: the lambda is analysed alone
  cs->handoffs_planned_ = static_cast<int>(absl::c_count_if(cs->map_.handoffs(), [&moves](const Handoff& h) {
    return absl::c_none_of(moves, [&h](const CopyMove& m) { return IsPrimaryMoveHandoff(m, h); });
  }));
  cs->moves_since_ = cs->handoffs_since_ = now;
  cs->moves_resumed_ = cs->moves_planned_ > 0;
  for (uint32_t d : cs->DrainingServers()) cs->drain_started_[d] = now;  // the drained line's time
  cs->handoffs_resumed_ = cs->handoffs_planned_ > 0;
  // Servers report the epoch they serve with their next heartbeat.
  return cs;
}

void ClusterState::WriteUnsaved() {
  {
    // Nothing changed (most heartbeats): no wait behind a write under way.
    // A snapshot taken by another writer since is that writer's to write.
    // Nor, after a failed write, more than one try every
    // kRewriteAfterFailure (each heartbeat would try).
    absl::MutexLock lock(&mu_);
    if (!unsaved_ || absl::Now() < rewrite_after_) return;
  }
  absl::MutexLock write_lock(&write_mu_);
  std::optional<SchedulerState> state;
  uint64_t saves = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() < rewrite_after_) return;
    state.swap(unsaved_);
    saves = saves_;
  }
  if (!state) return;
  const absl::Status written = persist_(*state);
  absl::MutexLock lock(&mu_);
  last_write_ = written;
  // Tried: the map goes out (WaitForMap), a restored scheduler skips past
  // epochs the nodes hold.
  written_epoch_ = std::max(written_epoch_, state->shard_map().epoch());
  if (!absl::IsFailedPrecondition(written)) saves_published_ = std::max(saves_published_, saves);
  if (written.ok()) {
    saves_written_ = std::max(saves_written_, saves);
    rewrite_after_ = absl::InfinitePast();
    return;
  }
  // Written again later, unless a newer change replaced it meanwhile: a
  // state on disk (or in etcd) that a transient failure left behind held
  // no barrier passed since, and a successor resumed from it kept ranks
  // that had passed waiting at it again (review17).
  if (!unsaved_) unsaved_ = std::move(state);
  rewrite_after_ = absl::Now() + kRewriteAfterFailure;
}

void ClusterState::Save() {
  if (!persist_) return;
  SchedulerState state;
  *state.mutable_config() = config_;
  state.set_next_node_id(next_node_id_);
  for (auto* group : {&servers_, &workers_}) {
    for (const auto& [k, node] : *group) {
      SchedulerState::Node* n = state.add_nodes();
      n->set_id(node.id);
      n->set_role(node.role);
      n->set_rank(node.rank);
      n->set_address(node.address);
      n->set_host(node.host);
      n->set_dead(node.dead);
      n->set_left(node.left);
      n->set_left_error(node.left_error);
      n->set_peak_round_rate(node.peak_rate);
      n->set_memory_bytes(node.memory_bytes);
      if (node.role == WORKER) n->set_worker_steps(node.counters.steps());
      n->set_replaced(node.replaced);
    }
  }
  *state.mutable_shard_map() = map_;
  for (const TensorSpec& t : tensors_) *state.add_tensors() = t;
  for (const auto& [name, b] : barriers_) {
    if (b.generation == 0) continue;
    SchedulerState::Barrier* saved = state.add_barriers();
    saved->set_name(name);
    saved->set_generation(b.generation);
    saved->mutable_live_ranks()->Assign(b.live_at_pass.begin(), b.live_at_pass.end());
  }
  unsaved_ = std::move(state);
  ++saves_;
}

ServerInfo* ClusterState::MapServer(uint32_t index) {
  for (auto& s : *map_.mutable_servers()) {
    if (s.index() == index) return &s;
  }
  return nullptr;
}

bool ClusterState::Excluded(uint32_t rank) const {
  return std::find(map_.excluded_workers().begin(), map_.excluded_workers().end(), rank) !=
         map_.excluded_workers().end();
}

size_t ClusterState::LiveWorkers() const { return config_.num_workers() - map_.excluded_workers_size(); }

std::string ClusterState::Ended(const Node& old) {
  if (old.id == 0 || !old.dead) return "";
  if (!old.left) return "declared dead";
  return old.left_error.empty() ? "left" : absl::StrCat("left: ", old.left_error);
}

absl::StatusOr<RegisterResponse> ClusterState::RegisterServer(const RegisterRequest& request) {
  const WriteOnReturn write(this);  // after mu_ is released
  if (absl::Status s = CheckRegisteredStrings(request); !s.ok()) return s;
  if (absl::Status s = CheckVersion(request); !s.ok()) return s;
  if (request.data_address().empty()) return absl::InvalidArgumentError("server registered without a data address");
  if (auto e = ParseTcpEndpoint(request.data_address(), "server data address"); !e.ok()) return e.status();
  if (absl::Status s = CheckCurveKey(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckKeyNotAnothers(request, map_); !s.ok()) return s;
  std::optional<uint32_t> index;
  for (auto& [i, node] : servers_) {
    if (node.address == request.data_address()) index = i;
  }
  // At another address, a dead server's place (nothing of it is left to
  // keep) before one more.
  for (auto it = servers_.begin(); !index && it != servers_.end(); ++it) {
    if (it->second.dead) index = it->first;
  }
  const absl::Duration timeout = absl::Milliseconds(config_.heartbeat_timeout_ms());
  if (index && tensors_.empty() && !servers_[*index].dead && clock_() - servers_[*index].last_seen < timeout) {
    const Node& old = servers_[*index];
    return absl::AlreadyExistsError(absl::StrCat(
        "server ", *index, " at ", old.address, " is alive (heard ", absl::FormatDuration(clock_() - old.last_seen),
        " ago); refusing a second server at its address"));
  }
  if (index && !servers_[*index].dead) {
    if (!tensors_.empty()) {
      const Node& old = servers_[*index];
      return absl::AlreadyExistsError(absl::StrCat(
          "server ", *index, " at ", old.address, " is alive (last heartbeat ",
          absl::FormatDuration(clock_() - old.last_seen), " ago); refusing a second server at its address: ",
          "stop that one first (SIGTERM fails it over at once; one killed is declared dead after ",
          "heartbeat_timeout_ms ", config_.heartbeat_timeout_ms(), ")"));
    }
  } else if (!tensors_.empty()) {
    // The job is training: a server takes a dead one's place (its own
    // address's first), and only where no state died with it; with every
    // place alive it joins as one more server, and copies move to it.
    if (!index) {
      if (servers_.size() >= kMaxServers) {
        return absl::ResourceExhaustedError(absl::StrCat("cluster already has ", servers_.size(),
                                                         " servers, all alive, the most it takes; refusing ",
                                                         request.data_address()));
      }
      return JoinRunningJob(static_cast<uint32_t>(servers_.size()), request);
    }
    for (const PartitionInfo& p : map_.partitions()) {
      if (p.server() != *index) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", *index, " at ", servers_[*index].address, " was declared dead and its partitions' state died "
          "with it (partition ", p.id(), " had no replica; replication ", EffectiveReplication(config_),
          "); a new server there would serve empty partitions: restart the job from a checkpoint"));
    }
    return JoinRunningJob(*index, request);
  }
  if (!index) {
    if (servers_.size() >= config_.num_servers()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cluster already has its ", config_.num_servers(), " servers (config num_servers) and no tensors defined "
          "yet; refusing ", request.data_address(), ": a server started once training has begun joins the job "
          "as one more"));
    }
    index = servers_.size();
  }
  Node& node = servers_[*index];
  const std::string replaced = Ended(node);
  node = Node{next_node_id_++, SERVER, *index, request.data_address(), request.host(), clock_(), 0};
  node.memory_bytes = request.memory_bytes();
  node.replaced = replaced;
  ServerInfo* info = MapServer(*index);
  if (info == nullptr) info = map_.add_servers();
  info->set_index(*index);
  info->set_node_id(node.id);
  info->set_data_address(request.data_address());
  info->set_curve_public_key(request.curve_public_key());
  info->set_sealed_data(request.sealed_data() && !request.curve_public_key().empty());
  info->set_dead(false);
  info->clear_dead_reason();
  RegisterResponse response;
  response.set_node_id(node.id);
  response.set_server_index(*index);
  *response.mutable_config() = config_;
  Save();
  return response;
}

absl::StatusOr<RegisterResponse> ClusterState::RegisterWorker(const RegisterRequest& request) {
  const WriteOnReturn write(this);  // after mu_ is released
  if (absl::Status s = CheckRegisteredStrings(request); !s.ok()) return s;
  if (absl::Status s = CheckVersion(request); !s.ok()) return s;
  if (request.rank() >= config_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", request.rank(), " is outside [0, ",
                                                   config_.num_workers(), ") (config num_workers)"));
  }
  if (absl::Status s = CheckCurveKey(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckKeyNotAnothers(request, map_); !s.ok()) return s;
  if (Excluded(request.rank()) && map_.partitions_size() > 0) {
    // The rejoin round allows for the age of every live server's report. A
    // server killed with the worker (or just before it) and not declared
    // dead yet has an old one, up to a whole timeout, whose age at the peak
    // pace puts the round that many seconds of rounds past the live servers'
    // (past the job's last round: nothing to train). And a rank restarted
    // in the job's first interval, before any server reported a round, was
    // placed at round 1, which the survivors had long completed (its pushes
    // refused, the process failed). So wait, at most one timeout and one
    // interval, until every server not declared dead has reported within
    // two intervals and, in rounds, one has reported a round and its pace
    // is known (a scheduler restarted in a job's first intervals, while
    // rounds stalled for a worker that died meanwhile, knew none: before
    // 2026-11-25 it placed the rank one past the reports, which the
    // survivors completed before the map reached them); then the state is
    // read again.
    // Where no other worker trains, the rounds stand still: the wait is for
    // a report from every server sent after this rank asked, serving the
    // newest map: one that removed the others (a removal completes a round
    // that holds a removed worker's push), or a failover meanwhile, which
    // makes a server primary of partitions its earlier report left out
    // (before 2026-11-25 such a report placed the rank past their open round,
    // which then counted nobody); the report says where they stand
    // (RejoinRunningJob).
    const absl::Time asked = clock_();
    RejoinWait& wait = rejoins_waiting_[request.rank()];
    if (wait.calls == 0 && absl::Now() > wait.asked_again_by) {
      // A new wait; a call that asks again (below) goes on with the last.
      wait.first_asked = asked;
      wait.fewest_asked = FewestRoundsReported();
      wait.until = absl::Now() + absl::Milliseconds(config_.heartbeat_timeout_ms() + config_.heartbeat_interval_ms());
    }
    wait.last_asked = asked;
    const uint64_t fewest_asked = wait.fewest_asked;
    const absl::Time first_asked = wait.first_asked, until = wait.until;
    // Async servers count no rounds (its old process's steps place it);
    // ssp servers report the furthest round pushed, which stands still too.
    const bool alone = config_.consistency() != ASYNC && !AnotherWorkerTrains(request.rank(), fewest_asked);
    const absl::Duration fresh = absl::Milliseconds(2 * config_.heartbeat_interval_ms());
    auto reported = [this, fresh, alone, first_asked]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const absl::Time now = clock_();
      for (const auto& [index, node] : servers_) {
        if (node.dead) continue;
        if (now - node.last_seen > fresh) return false;
        if (alone && (node.last_seen <= first_asked || node.applied_epoch < map_.epoch())) return false;
      }
      return alone || !RoundBased(config_) || (AnyServerReportedARound() && AnyServerPaceKnown());
    };
    // Its process reaches this scheduler: a node heard, for the majority
    // that declares the servers it waits for dead (CheckLiveness), but only
    // while its ask is recent, as a heartbeat would be: a scheduler cut off
    // after the calls came counted them heard for their whole wait, and
    // with every rank waiting so declared every server dead (fix20). So a
    // call ends once its ask is half that window old, and the process asks
    // again at once (Worker::Create), which only a scheduler it reaches hears.
    const absl::Duration ask_fresh = HeardWithin() / 2;
    auto done = [this, &reported, asked, ask_fresh]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reported() || clock_() - asked > ask_fresh;
    };
    ++wait.calls;
    mu_.AwaitWithDeadline(absl::Condition(&done), std::min(until, absl::Now() + ask_fresh));
    --wait.calls;
    const bool heard = reported();
    if (Excluded(request.rank())) {
      if (!heard && absl::Now() < until) {
        wait.asked_again_by = absl::Now() + kRejoinAskedAgainWithin;
        return absl::AbortedError(RejoinAskAgainRefusal(request.rank()));
      }
      return RejoinRunningJob(request, alone && heard, fewest_asked);
    }
  }
  if (Excluded(request.rank()) && map_.partitions_size() > 0) return RejoinRunningJob(request, false, 0);
  if (Excluded(request.rank())) ReadmitBeforeTensors(request.rank());
  if (auto it = workers_.find(request.rank()); it != workers_.end() && !it->second.dead) {
    Node& old = it->second;
    const absl::Duration silent = clock_() - old.last_seen;
    const absl::Duration timeout = absl::Milliseconds(config_.heartbeat_timeout_ms());
    // Once the job trains, a rank's old process is a member until declared
    // dead: a new one registered in between (silent past the timeout, the
    // liveness check not run yet, or not heard since this scheduler was
    // restarted) would take the rank as if the job were starting, with no
    // rejoin round, and wait on barriers it passed (before 2026-11-25 a
    // restarted scheduler let every new process do so: their INIT and
    // round-0 pushes were refused, and they exited).
    const bool training = map_.partitions_size() > 0;
    const bool live = old.rendezvous || (ClusterComplete() && (training || (old.heard && silent < timeout)));
    if (live) {
      // A new process asks again (Worker::Create) on this refusal: the old
      // one will be declared dead, or before the tensors fall silent past
      // the timeout (before 2026-11-25 one started before the job defined
      // them gave up at once).
      if (!old.rendezvous) old.successor_seen = clock_();
      return absl::AlreadyExistsError(absl::StrCat(
          "worker rank ", request.rank(), " is already registered (node ", old.id, " from '", old.host, "', ",
          old.rendezvous ? "waiting for the cluster" : absl::StrCat("heard ", absl::FormatDuration(silent), " ago"),
          "); refusing a second registration of rank ", request.rank(), " from '", request.host(), "'",
          old.rendezvous ? ""
                         : absl::StrCat(": ", RankStillHeldRefusal(request.rank(), config_.heartbeat_timeout_ms()))));
    }
  }
  Node& node = workers_[request.rank()];
  node = Node{next_node_id_++, WORKER, request.rank(), "", request.host(), clock_(), 0};
  node.rendezvous = true;
  while (map_.worker_curve_keys_size() < static_cast<int>(config_.num_workers())) map_.add_worker_curve_keys();
  if (map_.worker_curve_keys(request.rank()) != request.curve_public_key()) {
    map_.set_worker_curve_keys(request.rank(), request.curve_public_key());
    // Servers admit data clients by key: a new key (a restarted worker) must reach them.
    if (!tensors_.empty()) map_.set_epoch(map_.epoch() + 1);
  }
  RegisterResponse response;
  response.set_node_id(node.id);
  *response.mutable_config() = config_;
  Save();
  return response;
}

void ClusterState::ReadmitBeforeTensors(uint32_t rank) {
  // Nothing has trained before the tensors are defined: the rank's new
  // process takes its place as at the start. Before 2026-11-25 it was
  // refused for good ("a rank can rejoin only a job that is training"), and
  // a job whose every worker died between the rendezvous and DefineTensors
  // could never go on.
  for (auto* list : {map_.mutable_excluded_workers(), map_.mutable_left_workers()}) {
    list->erase(std::remove(list->begin(), list->end(), rank), list->end());
  }
  map_.set_epoch(map_.epoch() + 1);
  LOG(WARNING) << "worker rank " << rank << " was removed before the job defined its tensors; a new process takes "
               << "its place at the start (shard map epoch " << map_.epoch() << ")";
}

bool ClusterState::ClusterComplete() const {
  return servers_.size() >= config_.num_servers() && workers_.size() == config_.num_workers();
}

std::string ClusterState::MissingNodes() const {
  std::vector<uint32_t> missing_ranks;
  for (uint32_t r = 0; r < config_.num_workers(); ++r) {
    if (!workers_.contains(r)) missing_ranks.push_back(r);
  }
  std::string out = absl::StrCat("servers registered ", servers_.size(), "/", config_.num_servers(),
                                 ", workers registered ", workers_.size(), "/", config_.num_workers());
  if (!missing_ranks.empty()) absl::StrAppend(&out, "; missing worker ranks: ", absl::StrJoin(missing_ranks, ","));
  for (const auto& [i, node] : servers_) {
    if (node.dead) {
      absl::StrAppend(&out, "; server ", i, " (", node.address, ") ", node.left ? "stopped" : "was declared dead",
                      ": start a server in its place");
    }
  }
  return out;
}

absl::Status ClusterState::WaitForCluster(absl::Time deadline, uint64_t node_id,
                                          const std::function<bool()>& caller_gone) {
  const WriteOnReturn write(this);  // after mu_ is released
  absl::MutexLock lock(&mu_);
  const absl::Time start = clock_();
  auto complete = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ClusterComplete(); };
  // Nothing wakes the wait when the caller goes away: it looks every 100 ms.
  const absl::Duration look = caller_gone ? absl::Milliseconds(100) : absl::InfiniteDuration();
  bool formed = false, gone = false;
  while (!(formed = mu_.AwaitWithDeadline(absl::Condition(&complete), std::min(deadline, absl::Now() + look))) &&
         absl::Now() < deadline && !(gone = caller_gone && caller_gone())) {
  }
  Node* node = node_id != 0 ? FindNode(node_id) : nullptr;
  if (node != nullptr) node->rendezvous = false;
  if (gone) {
    // It never became a member: the cluster waits for its rank again, as if
    // it had not registered, rather than form with a process that is gone.
    if (node != nullptr && node->role == WORKER) {
      workers_.erase(node->rank);
      Save();
    }
    return absl::CancelledError(absl::StrCat("rendezvous: the registering process went away after ",
                                             absl::FormatDuration(clock_() - start), "; its rank is free again"));
  }
  if (!formed) {
    return absl::DeadlineExceededError(absl::StrCat("rendezvous: waited ",
                                                    absl::FormatDuration(clock_() - start),
                                                    " for the cluster; ", MissingNodes()));
  }
  return absl::OkStatus();
}

int ClusterState::RejoinCallsWaiting(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  const auto it = rejoins_waiting_.find(rank);
  return it == rejoins_waiting_.end() ? 0 : it->second.calls;
}

void ClusterState::WatchOpened(uint64_t node_id) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(node_id);
  if (node == nullptr) return;
  ++node->watches;
  node->watch_closed = false;
}

void ClusterState::WatchEnded(uint64_t node_id, bool peer_gone) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(node_id);
  if (node == nullptr || node->watches == 0) return;
  if (--node->watches > 0 || !peer_gone) return;
  // Only while it is still heard: a killed process's kernel closes its
  // connection at once, within an interval of its last heartbeat. A stream
  // ends cancelled too when this scheduler's own transport gives up on a
  // node it cannot reach, kServerTransportTimeout after writing to it (a
  // map, an answer): a scheduler cut off saw such nodes "heard", a
  // majority, and declared every node dead (review18).
  const absl::Duration since = clock_() - node->last_seen;
  if (since <= std::min(HeardWithin(), kServerTransportTimeout / 2)) node->watch_closed = true;
}

absl::Duration ClusterState::HeardWithin() const {
  const absl::Duration timeout = absl::Milliseconds(config_.heartbeat_timeout_ms());
  const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
  return std::max(timeout - 2 * interval, timeout / 2);
}

ClusterState::Node* ClusterState::FindNode(uint64_t id) {
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      if (node.id == id) return &node;
    }
  }
  return nullptr;
}

absl::StatusOr<HeartbeatResponse> ClusterState::Heartbeat(const HeartbeatRequest& request) {
  const WriteOnReturn write(this);  // after mu_ is released
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_id());
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("node ", request.node_id(),
                                            " is not registered (scheduler restarted without its --state-dir?)"));
  }
  if (node->dead) {
    if (node->left && request.leaving()) return HeartbeatResponse();  // said twice
    const std::string who = absl::StrCat(node->role == SERVER ? "server " : "worker rank ", node->rank);
    if (node->left) return absl::FailedPreconditionError(absl::StrCat(who, " left the job and is no longer a member of it"));
    SHARDPS_RETURN_IF_ERROR(DeclarationStored(*node, who));
    return absl::FailedPreconditionError(DeclaredDeadRefusal(who));
  }
  node->last_seen = clock_();
  if (request.leaving()) {
    if (node->role == WORKER) {
      Leave(*node, request.leaving_error());
    } else {
      ServerLeaves(*node);
    }
    HeartbeatResponse response;
    response.set_epoch(map_.epoch());
    return response;
  }
  node->heard = true;
  node->applied_epoch = request.applied_epoch();
  if (request.applied_epoch() > map_.epoch()) {
    // Restarted from a state written before the last maps it published (a
    // write that failed; maps go out once written): the nodes hold those epochs and ignore any
    // not above theirs, so the epochs this scheduler would issue next, with
    // other contents, must skip past them.
    LOG(WARNING) << "scheduler: " << (node->role == SERVER ? "server " : "worker rank ") << node->rank
                 << " serves shard map epoch " << request.applied_epoch() << ", past this scheduler's "
                 << map_.epoch() << " (published before a restart, never saved); its map is epoch "
                 << request.applied_epoch() + 1 << " now";
    map_.set_epoch(request.applied_epoch() + 1);
    Save();
  }
  if (node->role == SERVER) {
    // Every report: copy moves wait for them, and a failover promotes a copy
    // that was reported synced.
    node->synced_copies.assign(request.synced_copies().begin(), request.synced_copies().end());
    // Every heartbeat carries the server's current failure; none: it is past.
    node->checkpoint_failure = request.checkpoint_failure();
    if (!absl::c_is_sorted(node->synced_copies)) absl::c_sort(node->synced_copies);  // servers send them sorted
  }
  // The rate between the last two reports that differ (from the last one at
  // round 0 for the first), over at least half an interval as for the
  // counters: a heartbeat sent early (a new epoch, a drained hand-off) comes
  // milliseconds after the last, and a round or two in a few milliseconds
  // is no pace. Nor is a joined server's first round: it starts at the
  // job's, not at 0 (one measured 3461 rounds a second where the job did
  // 60). The peak of these rates places a rejoin round: such spikes put one
  // at round 424 of a 312-round job.
  if (request.completed_round() > node->completed_round) {
    const double seconds = absl::ToDoubleSeconds(node->last_seen - node->round_seen);
    if (seconds >= config_.heartbeat_interval_ms() / 2000.0) {
      node->round_rate = static_cast<double>(request.completed_round() - node->rate_round) / seconds;
      // Persisted when it rises (by a tenth: a few writes a job): a scheduler
      // restarted while rounds stall for a dead worker hears no pace from
      // the reports after its start, and a rejoin round placed at none is
      // completed by the survivors before the map reaches them.
      if (node->round_rate > node->peak_rate) {
        const bool persist = node->round_rate > 1.1 * node->peak_rate;
        node->peak_rate = node->round_rate;
        if (persist) Save();
      }
      node->rate_round = request.completed_round();
      node->round_seen = node->last_seen;
    }
    node->completed_round = request.completed_round();
  } else if (node->completed_round == 0 && !node->joined_running_job) {
    node->round_seen = node->last_seen;
  }
  node->fewest_round = request.has_fewest_completed_round()
                           ? std::optional<uint64_t>(request.fewest_completed_round())
                           : std::nullopt;
  if (request.has_counters()) RecordCounters(*node, request.counters());
  FinishCopyMoves(*node, request);
  FinishHandoffs(*node, request);
  MaybeStartCopyMoves();
  HeartbeatResponse response;
  response.set_epoch(map_.epoch());
  return response;
}

void ClusterState::RecordCounters(Node& node, const NodeCounters& counters) {
  node.counters = counters;
  node.counters_seen = node.last_seen;
  // Written when they rise by a tenth (about 25 writes for each tenfold of
  // steps, a write per heartbeat only in the first ten): an async rank
  // rejoins after them, also with a scheduler restarted meanwhile (before
  // 2026-11-25 the standby that took over placed it at 1, and it trained its
  // share of the job again).
  if (node.role == WORKER && config_.consistency() == ASYNC &&
      counters.steps() > node.saved_steps + node.saved_steps / 10) {
    node.saved_steps = counters.steps();
    Save();
  }
  // Heartbeats sent early (a new epoch) come close together: measure over
  // at least half an interval so that one early report does not make a
  // rate of a few milliseconds.
  const double seconds = absl::ToDoubleSeconds(node.last_seen - node.base_seen);
  if (seconds < config_.heartbeat_interval_ms() / 2000.0) return;
  if (node.base_seen != absl::InfinitePast()) node.rates = RatesBetween(node.base, counters, seconds);
  node.base = counters;
  node.base_seen = node.last_seen;
}

bool ClusterState::ServersServe(uint64_t epoch) const {
  if (servers_.size() < config_.num_servers()) return false;
  for (const auto& [i, node] : servers_) {
    if (!node.dead && node.applied_epoch < epoch) return false;
  }
  return true;
}

std::string ClusterState::DeclareDead(Node& node, absl::Duration silent) {
  node.dead = true;
  const std::string reason = absl::StrCat("no heartbeat for ", absl::FormatDuration(silent), " (heartbeat_timeout_ms ",
                                          config_.heartbeat_timeout_ms(), ")");
  map_.set_epoch(map_.epoch() + 1);
  const ServerInfo* info = node.role == SERVER ? MapServer(node.rank) : nullptr;
  if (info != nullptr && info->draining() &&
      absl::c_none_of(map_.partitions(), [&node](const PartitionInfo& p) { return HoldsCopy(p, node.rank); })) {
    // Drained: it stopped by itself, and its leave found no scheduler (this
    // one restarting, or not elected yet). Nothing fails over.
    node.left = true;
    return absl::StrCat("server ", node.rank, " (", node.address, ", host ", node.host, ") drained and stopped: ",
                        reason, " while it held nothing (its leave did not reach this scheduler); shard map epoch ",
                        map_.epoch(), RemoveServer(node.rank, "it was drained and left the job"));
  }
  ++declared_dead_total_;
  if (node.role == SERVER) {
    return absl::StrCat("server ", node.rank, " (", node.address, ", host ", node.host, ") declared dead: ", reason,
                        "; shard map epoch ", map_.epoch(), RemoveServer(node.rank, reason));
  }
  ExcludeWorker(node);
  return absl::StrCat("worker rank ", node.rank, " (host ", node.host, ") declared dead: ", reason,
                      "; removed from the job at shard map epoch ", map_.epoch(), ", ", WorkersGoOn());
}

std::string ClusterState::WorkersGoOn() const {
  const size_t live = LiveWorkers();
  return live == 1 ? "1 worker goes on" : absl::StrCat(live, " workers go on");
}

void ClusterState::ExcludeWorker(Node& node) {
  node.dead = true;
  map_.add_excluded_workers(node.rank);
  PassCompleteBarriers();
  // Rounds stalled for this worker resume now: a server whose last report
  // showed no round since its pace was last measured measures it from here.
  // Measured across the stall instead, the pace of a scheduler restarted
  // during it (no peak heard before) was a fraction of the survivors' and
  // placed a rejoin round they had completed when the map reached them
  // (`shardps local --kill scheduler@20 --restart-after 1 --kill worker:1@22
  // --replace`: rank 1 placed at 55, the survivor at 66, its pushes refused).
  for (auto& [index, server] : servers_) {
    if (server.dead || server.round_seen == absl::InfinitePast()) continue;
    if (server.completed_round == server.rate_round && server.last_seen > server.round_seen) {
      server.round_seen = clock_();
    }
  }
}

std::string ClusterState::RemoveServer(uint32_t index, const std::string& reason) {
  if (ServerInfo* info = MapServer(index)) {
    info->set_dead(true);
    info->set_dead_reason(reason);
    info->clear_draining();  // a server taking its place starts afresh
  }
  drain_started_.erase(index);
  std::string ended = EndDrainsLeftShort();  // first: Rereplicate may use those servers again
  return ended + FailOver(index);
}

std::string ClusterState::EndDrainsLeftShort() {
  const uint32_t copies = EffectiveReplication(config_);
  std::vector<uint32_t> ended;
  for (uint32_t d : DrainingServers()) {
    if (StayingServers().size() >= copies) break;
    if (!LiveServers().contains(d)) continue;
    MapServer(d)->clear_draining();
    drain_started_.erase(d);
    ended.push_back(d);
  }
  if (ended.empty()) return "";
  return absl::StrCat("; the drain of server ", absl::StrJoin(ended, ", "), " ends: too few servers would be left for ",
                      copies, " copies of each partition (it serves on, and takes copies again)");
}

void ClusterState::ServerLeaves(Node& node) {
  node.dead = true;
  node.left = true;
  map_.set_epoch(map_.epoch() + 1);
  if (tensors_.empty()) {
    // Before the job has partitions nothing fails over: the place is free
    // at once, for the same server started again or another.
    RemoveServer(node.rank, "it was stopped before the job defined its tensors");
    Save();
    LOG(WARNING) << "server " << node.rank << " (" << node.address << ") stopped before the job defined its "
                 << "tensors; a server may take its place";
    return;
  }
  if (static_cast<size_t>(map_.left_workers_size()) >= config_.num_workers()) {
    // The job is over (every worker left): the servers stop together, and
    // failing each over to the others, which are stopping too, helps no one.
    // (Workers declared dead may be started again: they need the backups.)
    if (ServerInfo* info = MapServer(node.rank)) {
      info->set_dead(true);
      info->set_dead_reason(kLeftAfterTheWorkers);  // what a rank started again is told (before: "()")
      info->clear_draining();  // a rank started again must not have moves planned from it
    }
    drain_started_.erase(node.rank);
    Save();
    LOG(INFO) << "server " << node.rank << " (" << node.address << ") left after the job's workers";
    return;
  }
  const ServerInfo* info = MapServer(node.rank);
  const auto still_held = absl::c_count_if(map_.partitions(), [&node](const PartitionInfo& p) { return HoldsCopy(p, node.rank); });
  if (info != nullptr && info->draining() && still_held > 0) {
    // Stopped before the map took its last copy (SIGTERMed, or its
    // --drain-on-stop ran out): what it held fails over, or is lost without
    // backups. `shardps drain` and status must not take it for drained.
    node.left_error = absl::StrCat("it stopped before its drain finished: ", still_held,
                                   " copies were still on it, and fail over to their backups (lost where none)");
    LOG(WARNING) << "server " << node.rank << " (" << node.address << ", host " << node.host << ") left the job "
                 << "while it drained, " << still_held << " copies still on it; shard map epoch " << map_.epoch()
                 << RemoveServer(node.rank, "it stopped before its drain finished");
    Save();
    return;
  }
  if (info != nullptr && info->draining()) {
    const auto started = drain_started_.find(node.rank);
    LOG(WARNING) << "server " << node.rank << " (" << node.address << ", host " << node.host
                 << ") drained: its copies moved to the other servers"
                 << (started != drain_started_.end() ? absl::StrCat(" in ", absl::FormatDuration(clock_() - started->second))
                                                     : std::string())
                 << ", and it stopped and left the job; shard map epoch " << map_.epoch()
                 << RemoveServer(node.rank, "it was drained and left the job");
    Save();
    return;
  }
  LOG(WARNING) << "server " << node.rank << " (" << node.address << ", host " << node.host
               << ") left the job (stopped, drained); shard map epoch " << map_.epoch()
               << RemoveServer(node.rank, "it was stopped and left the job");
  Save();
}

void ClusterState::Leave(Node& node, const std::string& error) {
  node.left = true;
  node.left_error = ToUtf8(error, kMaxLeavingError);  // not half a character: proto3 strings are UTF-8
  map_.set_epoch(map_.epoch() + 1);
  map_.add_left_workers(node.rank);
  ExcludeWorker(node);
  Save();
  if (node.left_error.empty()) {
    LOG(INFO) << "worker rank " << node.rank << " (host " << node.host << ") left the job; shard map epoch "
              << map_.epoch() << ", " << WorkersGoOn();
  } else {
    LOG(WARNING) << "worker rank " << node.rank << " (host " << node.host << ") failed and left the job: "
                 << node.left_error << "; shard map epoch " << map_.epoch() << ", " << WorkersGoOn();
  }
}

std::string ClusterState::FailOver(uint32_t dead) {
  int promoted = 0, lost = 0, unsynced = 0, incomplete = 0;
  // The last map the dead server reported serving to this scheduler (0: it
  // was not heard since a restart).
  const auto dead_node = servers_.find(dead);
  const uint64_t dead_served = dead_node != servers_.end() ? dead_node->second.applied_epoch : 0;
  for (PartitionInfo& p : *map_.mutable_partitions()) {
    auto* backups = p.mutable_backups();
    backups->erase(std::remove(backups->begin(), backups->end(), dead), backups->end());
    if (p.server() != dead) continue;
    // Copies on servers not declared dead: one declared in the same check
    // (CheckLiveness) is not out of the lists yet.
    auto live = [&](uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto server = servers_.find(b);
      return server != servers_.end() && !server->second.dead;
    };
    // The first backup its server last reported synced: one still being
    // re-created (or refusing updates) holds no valid state yet.
    auto chosen = std::find_if(backups->begin(), backups->end(), [&](uint32_t b)
                                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live(b) && ReportedSynced(b, p); });
    if (chosen == backups->end()) {
      // Else the first that may hold the state: not one listed in a map the
      // dead primary never served, which no snapshot from it reached (fix20:
      // the failover of a server killed with this one re-created backups of
      // the copies it promoted here, and this failover promoted them).
      chosen = std::find_if(backups->begin(), backups->end(), [&](uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto listed = p.listed_at().find(b);
        return live(b) && (listed == p.listed_at().end() || listed->second <= dead_served);
      });
      if (chosen == backups->end()) {
        // Stays on the dead server: workers fail its requests, naming it.
        // Copies that never got its state are dropped: they hold nothing,
        // and a copy listed unsynced would hold up the balancing for good.
        if (absl::c_any_of(*backups, live)) ++incomplete;
        backups->Clear();
        ++lost;
        continue;
      }
      ++unsynced;
    }
    p.set_server(*chosen);
    backups->erase(chosen);
    ++promoted;
  }
  const int moves_ended = EndBrokenCopyMoves(dead);
  const int handoffs_ended = EndBrokenHandoffs(dead);
  const int recreated = Rereplicate();
  std::string out;
  if (promoted > 0) {
    absl::StrAppend(&out, "; ",
                    Counted(promoted, "partition fails over to its backup", "partitions fail over to their backups"));
  }
  if (unsynced > 0) {
    absl::StrAppend(&out, "; ", unsynced, " of them to a copy its server had not reported synced (no backup ",
                    "was, or none had reported yet)");
  }
  if (lost > 0) {
    absl::StrAppend(&out, "; ",
                    Counted(lost, "partition had no live replica and is lost",
                            "partitions had no live replica and are lost"));
  }
  if (incomplete > 0) {
    absl::StrAppend(&out, " (", incomplete, " of them with only copies still being re-created, which their ",
                    "primary's snapshot never reached: dropped)");
  }
  if (recreated > 0) {
    absl::StrAppend(&out, "; ", Counted(recreated, "copy", "copies"), " re-created on the surviving servers");
  }
  if (moves_ended > 0) {
    absl::StrAppend(&out, "; ", Counted(moves_ended, "copy move", "copy moves"), " ended, their copies kept");
  }
  if (handoffs_ended > 0) {
    absl::StrAppend(&out, "; ", Counted(handoffs_ended, "primary hand-off", "primary hand-offs"), " ended");
  }
  return out;
}

std::map<uint32_t, uint64_t> ClusterState::LiveServerLoads() const {
  std::map<uint32_t, uint64_t> held;  // live server -> elements it holds
  for (const auto& [index, node] : servers_) {
    if (!node.dead) held[index] = 0;
  }
  for (const PartitionInfo& p : map_.partitions()) {
    if (held.contains(p.server())) held[p.server()] += p.num_elements();
    for (uint32_t b : p.backups()) {
      if (held.contains(b)) held[b] += p.num_elements();
    }
  }
  return held;
}

ServerRoom ClusterState::ServerRooms() const {
  const uint64_t per_element = ServerBytesPerElement(config_);
  ServerRoom room;
  for (const auto& [index, node] : servers_) {
    if (node.memory_bytes > 0) room[index] = std::max<uint64_t>(node.memory_bytes / per_element, 1);
  }
  return room;
}

int ClusterState::Rereplicate() {
  const uint32_t copies = EffectiveReplication(config_);
  std::map<uint32_t, uint64_t> held = LiveServerLoads();
  const std::set<uint32_t> draining = DrainingServers();  // given no new copy
  // A server that said what it can hold is given no copy past that: one it
  // has no memory for kills it as it arrives (std::bad_alloc, its
  // container's limit), and the copies it held with it. Before 2026-11-26
  // one server's death so took a second, and two of three lost partitions.
  // The partition keeps fewer copies until a server joins.
  const ServerRoom room = ServerRooms();
  int recreated = 0, short_of_memory = 0;
  for (PartitionInfo& p : *map_.mutable_partitions()) {
    if (!held.contains(p.server())) continue;  // lost: nothing to copy from
    while (p.backups_size() + 1 < static_cast<int>(copies)) {
      std::optional<uint32_t> best;
      bool full = false;
      for (const auto& [index, load] : held) {
        if (HoldsCopy(p, index) || draining.contains(index)) continue;
        if (p.num_elements() > RoomLeft(room, index, load)) {
          full = true;
          continue;
        }
        if (!best || load < held[*best]) best = index;
      }
      if (!best) {  // fewer live servers than copies, or none with room
        short_of_memory += full;
        break;
      }
      p.add_backups(*best);  // its primary sends it the whole state first
      (*p.mutable_listed_at())[*best] = map_.epoch();
      held[*best] += p.num_elements();
      ++recreated;
    }
  }
  LOG_IF(WARNING, short_of_memory > 0)
      << Counted(short_of_memory, "partition keeps", "partitions keep") << " fewer copies than the job's " << copies
      << " (replication): every live server without one reported too little memory for another (weights, "
         "optimizer state, accumulator); a server that joins with room takes it";
  return recreated;
}

absl::StatusOr<RegisterResponse> ClusterState::JoinRunningJob(uint32_t index, const RegisterRequest& request) {
  // It takes copies until the loads balance (missing copies at once, then
  // copy moves): one that cannot hold its share is refused before it takes
  // any, as DefineTensors refuses a model. Before 2026-11-26 it joined and
  // died of std::bad_alloc, or was killed by its cgroup, receiving them.
  if (const uint64_t memory = request.memory_bytes(); memory != 0) {
    const std::set<uint32_t> draining = DrainingServers();
    uint64_t servers = 1;  // itself
    for (const auto& [i, n] : servers_) servers += i != index && !n.dead && !draining.contains(i);
    const uint64_t copies = std::min<uint64_t>(EffectiveReplication(config_), servers);
    uint64_t elements = 0;
    for (const PartitionInfo& p : map_.partitions()) elements += p.num_elements();
    const uint64_t share = (elements * copies * ServerBytesPerElement(config_) + servers - 1) / servers;
    if (share > memory) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "server at ", request.data_address(), " (host ", request.host(), ") would hold about ", share,
          " bytes of partitions once the ", servers, " servers' loads balance (weights, optimizer state, "
          "accumulator; replicas included) but reported it can hold ", memory,
          " bytes: start it where it has more memory (a larger container limit)"));
    }
  }
  const bool grows = !servers_.contains(index);
  const std::string dead_address = grows ? std::string() : servers_[index].address;
  Node& node = servers_[index];
  const std::string replaced = grows ? std::string() : Ended(node);
  node = Node{next_node_id_++, SERVER, index, request.data_address(), request.host(), clock_(), 0};
  node.memory_bytes = request.memory_bytes();
  node.joined_running_job = true;
  node.replaced = replaced;
  ServerInfo* info = MapServer(index);
  if (info == nullptr) {
    info = map_.add_servers();
    info->set_index(index);
  }
  info->set_node_id(node.id);
  info->set_data_address(request.data_address());
  info->set_curve_public_key(request.curve_public_key());
  info->set_sealed_data(request.sealed_data() && !request.curve_public_key().empty());
  info->set_dead(false);
  info->clear_dead_reason();
  info->clear_draining();
  map_.set_epoch(map_.epoch() + 1);
  // Missing copies go to it first; once it serves this epoch and they are
  // synced, backups move to balance the loads, each as an extra copy until
  // it is synced (MaybeStartCopyMoves, FinishCopyMoves), so no partition has
  // fewer valid copies meanwhile.
  const int recreated = Rereplicate();
  joined_at_ = clock_();
  last_join_ = joined_at_;
  LOG(WARNING) << "server " << index << " (" << request.data_address() << ", host " << request.host()
               << ") joins the running job "
               << (grows ? absl::StrCat("as one more server (", servers_.size(), " now, config num_servers ",
                                        config_.num_servers(), ")")
                         : absl::StrCat("in the place of the dead server at ", dead_address))
               << "; shard map epoch " << map_.epoch() << ": " << recreated
               << " missing copies go to it (its primaries send snapshots); "
               << (EffectiveReplication(config_) > 1
                       ? "backup copies move to it once it serves this epoch and its copies are synced"
                       : "partitions move to it once it serves this epoch (replication 1: each as an extra "
                         "copy, then its primary role, then the old copy dropped)");
  RegisterResponse response;
  response.set_node_id(node.id);
  response.set_server_index(index);
  response.set_joins_running_job(true);
  *response.mutable_config() = config_;
  Save();
  return response;
}

bool ClusterState::AnyServerReportedARound() const {
  for (const auto& [index, node] : servers_) {
    if (!node.dead && node.completed_round > 0) return true;
  }
  return false;
}

bool ClusterState::AnyServerPaceKnown() const {
  for (const auto& [index, node] : servers_) {
    if (!node.dead && node.peak_rate > 0) return true;
  }
  return false;
}

uint64_t ClusterState::FewestRoundsReported() const {
  std::optional<uint64_t> fewest;
  for (const auto& [index, node] : servers_) {
    if (!node.dead && node.fewest_round) fewest = std::min(fewest.value_or(*node.fewest_round), *node.fewest_round);
  }
  return fewest.value_or(RoundsReported());
}

uint64_t ClusterState::RoundsReported() const {
  uint64_t reported = 0;
  for (const auto& [index, node] : servers_) {
    if (!node.dead) reported = std::max(reported, node.completed_round);
  }
  return reported;
}

bool ClusterState::AnotherWorkerTrains(uint32_t rank, uint64_t fewest_asked) const {
  const uint64_t open = RoundsReported();
  for (const auto& [r, node] : workers_) {
    if (r == rank || node.dead || Excluded(r)) continue;
    const auto rejoin = absl::c_find_if(map_.rejoined_workers(), [r = r](const WorkerRejoin& j) { return j.rank() == r; });
    if (rejoin == map_.rejoined_workers().end()) return true;
    // A rank that rejoined alone where every partition still stood when this
    // one asked has not trained a round yet: ranks restarted together join
    // together (before 2026-11-25 the second was placed a pace past the
    // first, idled while it trained alone, and near the job's end was past
    // its last round).
    if (rejoin->catch_up() && rejoin->round() >= fewest_asked) continue;
    if (rejoin->round() <= open) return true;
  }
  return false;
}

uint64_t ClusterState::RoundPastServers(bool for_rejoin) const {
  const uint64_t reported = RoundsReported();
  double rate = 0;
  absl::Duration age = absl::ZeroDuration();
  for (const auto& [index, node] : servers_) {
    if (node.dead) continue;
    rate = std::max(rate, for_rejoin ? node.peak_rate : node.round_rate);
    if (for_rejoin) age = std::max(age, clock_() - node.last_seen);  // its report's age
  }
  const double lag_seconds = 2.0 * config_.heartbeat_interval_ms() / 1000.0 + absl::ToDoubleSeconds(age);
  return reported + 1 + static_cast<uint64_t>(std::ceil(rate * lag_seconds));
}

absl::StatusOr<RegisterResponse> ClusterState::RejoinRunningJob(const RegisterRequest& request, bool alone_heard,
                                                                uint64_t fewest_asked) {
  const uint32_t rank = request.rank();
  // A new process starts with no weights of its own: where the workers hold
  // the weights, it has nothing to continue from.
  const std::string& pull_codec = config_.compression().pull_codec();
  if (config_.update_mode() == SUM_ONLY) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " was removed from the job and cannot rejoin it: with update_mode sum_only the "
        "weights and optimizer state live on the workers, which a new process does not have"));
  }
  if (config_.consistency() == SYNC && !pull_codec.empty() && pull_codec != "none") {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " was removed from the job and cannot rejoin it: pull_codec '", pull_codec,
        "' sends sync workers weight deltas, and a new process lacks the weights they apply to"));
  }
  // The rule of a checkpoint's round, made safer: a rank is usually
  // removed after rounds stalled waiting for it, so the rate between the
  // last reports understates the pace the survivors resume at; a round
  // completed without the worker would refuse it (PartitionEngine::Rejoin).
  // Where no other worker trains (every rank removed, or rejoined at a
  // round past the servers'), no round completes before this rank's: one a
  // pace past the servers' was never reached (a job whose every worker was
  // restarted at once waited for it until the request timeout). It joins
  // at the round they are at (a partition's open round is the number it
  // completed), read from reports they sent after it asked: the fewest
  // any partition completed, since workers removed mid-step leave some
  // partitions a round past the others (their round held a push, and the
  // removal completed it), and a round nobody is counted in never
  // completes; those past it catch up (WorkerRejoin.catch_up).
  const bool alone = alone_heard && !AnotherWorkerTrains(rank, fewest_asked);
  uint64_t round = alone ? FewestRoundsReported() : RoundPastServers(/*for_rejoin=*/true);
  if (config_.consistency() == ASYNC) {
    // Async servers count no rounds (J was 1, and the new process trained
    // its share of every epoch again): it goes on after the steps its old
    // process last reported (WorkerStats::steps, counted from its own join
    // round), at most a heartbeat interval's steps done twice (after a
    // scheduler's restart, up to a tenth of them: worker_steps is written
    // as the steps rise by a tenth). Not before
    // the round it rejoined at last: a process that died before its first
    // report started there (before 2026-11-25 its successor went back to 1).
    if (auto old = workers_.find(rank); old != workers_.end()) {
      round = std::max<uint64_t>(round, old->second.counters.steps());
    }
    for (const WorkerRejoin& r : map_.rejoined_workers()) {
      if (r.rank() == rank) round = std::max<uint64_t>(round, r.round());
    }
  }
  for (auto* list : {map_.mutable_excluded_workers(), map_.mutable_left_workers()}) {
    list->erase(std::remove(list->begin(), list->end(), rank), list->end());
  }
  Node& node = workers_[rank];
  node = Node{next_node_id_++, WORKER, rank, "", request.host(), clock_(), 0};
  node.rendezvous = true;
  WorkerRejoin* entry = nullptr;
  for (WorkerRejoin& r : *map_.mutable_rejoined_workers()) {
    if (r.rank() == rank) entry = &r;
  }
  if (entry == nullptr) entry = map_.add_rejoined_workers();
  entry->set_rank(rank);
  entry->set_round(round);
  entry->set_catch_up(alone);
  entry->set_incarnation(node.id);
  entry->set_epoch(map_.epoch() + 1);
  while (map_.worker_curve_keys_size() < static_cast<int>(config_.num_workers())) map_.add_worker_curve_keys();
  map_.set_worker_curve_keys(rank, request.curve_public_key());
  map_.set_epoch(map_.epoch() + 1);
  LOG(WARNING) << "worker rank " << rank << " (host " << request.host() << ") rejoins the running job at round "
               << round << "; shard map epoch " << map_.epoch() << ", " << Counted(LiveWorkers(), "worker", "workers")
               << " in the job";
  RegisterResponse response;
  response.set_node_id(node.id);
  *response.mutable_config() = config_;
  response.set_rejoin_round(round);
  for (const auto& [name, b] : barriers_) {
    if (b.generation == 0) continue;
    BarrierPass* pass = response.add_passed_barriers();
    pass->set_name(name);
    pass->mutable_live_ranks()->Assign(b.live_at_pass.begin(), b.live_at_pass.end());
    pass->set_generation(b.generation);
  }
  Save();
  return response;
}

std::vector<std::string> ClusterState::CheckLiveness() {
  const WriteOnReturn write(this);  // after mu_ is released
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  const absl::Duration timeout = absl::Milliseconds(config_.heartbeat_timeout_ms());
  const absl::Duration gap = now - last_check_;
  const bool late = last_check_ != absl::InfinitePast() && gap > timeout / 2;
  last_check_ = now;
  if (!formed_) {
    if (!ClusterComplete()) return {};
    formed_ = true;  // from now on every node heartbeats: start its clock here
    for (auto* group : {&servers_, &workers_}) {
      for (auto& [k, node] : *group) node.last_seen = std::max(node.last_seen, now);
    }
  } else if (late) {
    // This check is late (the scheduler was paused or starved): heartbeats
    // may be queued behind it. Forgive the pause rather than declare
    // everyone dead at once. Not past now: a heartbeat heard since the
    // pause (before this check) is no older than that (before 2026-11-25 it
    // was put a pause into the future, and a node that died then was
    // declared dead only after the pause and the timeout).
    for (auto* group : {&servers_, &workers_}) {
      for (auto& [k, node] : *group) node.last_seen = std::min(node.last_seen + gap, now);
    }
    for (auto& [partition, started] : handoff_started_) started = std::min(started + gap, now);
  }
  // A scheduler cut off from the cluster hears from nobody: declaring every
  // node dead would end a job that is training fine. Nodes are declared dead
  // only while a majority of the live ones is still heard from. A rank whose
  // new process asks to register reaches this scheduler: its old process is
  // silent, not cut off (before, both workers of a 2-server job killed and
  // started again were never declared dead: 2 of 4 heard). So does a removed
  // rank's new process waiting to rejoin (RegisterWorker): one live node
  // heard each (before, once every worker of a 2-server job was removed, a
  // server that died then was never declared dead, 1 of 2 heard, and the
  // ranks waiting for its report were placed past the job's last round).
  // So does a node that closed its connection while heard (WatchEnded): its host's
  // kernel answered for a process that is gone, which a scheduler cut off
  // never sees (before, 3 of 4 workers of a 2-server job killed at once were
  // never declared dead, 3 of 6 heard, and the last rank waited out its
  // request timeout). A host that vanishes whole closes nothing: more than
  // half the nodes lost that way still reads as a partition.
  // Heard means heard well within the timeout: cut off from everyone at
  // once, the nodes' last heartbeats are up to an interval apart, so when
  // the first crosses the timeout the others are just short of it. Counted
  // as heard then, they made a majority that declared the first ones dead
  // (before 2026-11-25: `tools/chaos.sh sched`, both workers of a job whose
  // scheduler was partitioned away were declared dead 10 s in).
  const absl::Duration recent = HeardWithin();
  // A rank counts once however many of its calls wait (a process asking
  // again, or started again, while its earlier calls wait: before
  // 2026-11-25 three calls of one rank made 3 of 5 nodes heard, a majority
  // that declared both servers of a scheduler cut off from them dead), only
  // while its last ask is recent (its calls ask again to stay so), and not
  // once its rejoin made it a live node again.
  size_t waiting = 0;
  for (const auto& [rank, wait] : rejoins_waiting_) {
    if (now - wait.last_asked > recent) continue;
    auto it = workers_.find(rank);
    if (it == workers_.end() || it->second.dead) ++waiting;
  }
  size_t live = waiting, heard = waiting, silent_past_timeout = 0;
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      if (node.dead) continue;
      ++live;
      if (now - std::max(node.last_seen, node.successor_seen) <= recent || node.watch_closed) ++heard;
      if (now - node.last_seen > timeout) ++silent_past_timeout;
    }
  }
  if (heard * 2 <= live && silent_past_timeout > 0) {
    if (heard < live && !isolated_) {
      isolated_ = true;
      return {absl::StrCat("hears from only ", heard, " of ", live, " live nodes within the heartbeat timeout: "
                           "more likely cut off itself, so it declares no one dead until a majority is back")};
    }
    return {};
  }
  if (heard * 2 > live && isolated_) {
    // Back from being cut off: the nodes reconnect one by one (gRPC's
    // backoff, its keepalive), and the first ones make a majority while the
    // others were silent for the whole cut. Each gets a fresh timeout from
    // now, as from a restarted scheduler, rather than being declared dead at
    // once (before 2026-11-25: `tools/chaos.sh sched`, both workers declared
    // dead 2 s after the link came back, once the three servers had
    // reconnected; chaos16).
    isolated_ = false;
    size_t late = 0;
    for (auto* group : {&servers_, &workers_}) {
      for (auto& [k, node] : *group) {
        if (node.dead || now - std::max(node.last_seen, node.successor_seen) <= recent) continue;
        node.last_seen = now;
        ++late;
      }
    }
    if (late > 0) {
      return {absl::StrCat("hears from ", heard, " of ", live, " live nodes again: the ", late, " not heard yet "
                           "have a heartbeat timeout from now to reconnect")};
    }
  }
  std::vector<Node*> now_dead;
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      if (!node.dead && now - node.last_seen > timeout) now_dead.push_back(&node);
    }
  }
  // Out together before any fails over: a server declared in this check is
  // no copy to promote and no server to re-create copies on (before, the
  // first of two servers killed at once failed over to the second's copies
  // and re-created their backups on the third, and the second's failover
  // promoted those, which no snapshot would reach: DATA_LOSS; fix20).
  for (Node* node : now_dead) node->dead = true;
  std::vector<std::string> declared;
  for (Node* node : now_dead) declared.push_back(DeclareDead(*node, now - node->last_seen));
  const int handoffs_ended = EndLateHandoffs();
  if (!declared.empty() || handoffs_ended > 0) Save();
  for (Node* node : now_dead) node->declared_in_save = saves_;
  return declared;
}

void ClusterState::PassCompleteBarriers() {
  bool passed = false;
  for (auto& [name, b] : barriers_) {
    if (b.arrived.empty()) continue;
    bool complete = true;
    for (uint32_t r = 0; r < config_.num_workers() && complete; ++r) {
      complete = b.arrived.contains(r) || Excluded(r);
    }
    if (complete) {
      b.generation++;
      b.arrived.clear();
      b.live_at_pass.clear();
      for (uint32_t r = 0; r < config_.num_workers(); ++r) {
        if (!Excluded(r)) b.live_at_pass.push_back(r);
      }
      passed = true;
    }
  }
  if (passed) Save();  // a rejoining worker is told the barriers passed, also by a restarted scheduler
}

std::string ClusterState::ServersBehind(uint64_t epoch) const {
  std::vector<std::string> behind;
  for (const auto& [i, node] : servers_) {
    if (!node.dead && node.applied_epoch < epoch) behind.push_back(absl::StrCat(i, " (", node.address, ")"));
  }
  return absl::StrCat("servers registered ", servers_.size(), "/", config_.num_servers(),
                      behind.empty() ? "" : "; not yet serving it: server ", absl::StrJoin(behind, ", "));
}

absl::StatusOr<ShardMap> ClusterState::DefineTensors(const std::vector<TensorSpec>& tensors,
                                                     absl::Time deadline) {
  const WriteOnReturn write(this);  // after mu_ is released
  if (absl::Status s = ValidateTensorSpecs(tensors); !s.ok()) return s;
  if (absl::Status s = ValidateDeclaredCodecs(tensors, config_); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  // The first definition waits for num_servers live servers (a map built
  // on a dead one would route to it with nothing to fail over); later ones
  // (a worker that rejoined, the cluster grown meanwhile) get the map.
  auto all_servers = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!tensors_.empty()) return true;
    if (servers_.size() < config_.num_servers()) return false;
    return absl::c_none_of(servers_, [](const auto& s) { return s.second.dead; });
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&all_servers), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("not all servers registered and live; ",
                                                    MissingNodes()));
  }
  if (tensors_.empty()) {
    std::vector<ServerInfo> servers(map_.servers().begin(), map_.servers().end());
    std::sort(servers.begin(), servers.end(), [](auto& a, auto& b) { return a.index() < b.index(); });
    if (absl::Status s = CheckModelSize(tensors, config_); !s.ok()) return s;
    auto map = BuildShardMap(tensors, servers, config_.partition_bytes(), map_.epoch() + 1,
                             EffectiveReplication(config_));
    if (!map.ok()) return map.status();
    absl::flat_hash_map<uint32_t, uint64_t> capacity;
    for (const auto& [i, node] : servers_) capacity[i] = node.memory_bytes;
    if (absl::Status s = CheckServerCapacity(*map, config_, capacity); !s.ok()) return s;
    *map->mutable_excluded_workers() = map_.excluded_workers();  // removed before the map existed
    *map->mutable_worker_curve_keys() = map_.worker_curve_keys();
    // With what it sends: the workers' keys take ~42 bytes each.
    if (absl::Status s = CheckShardMapSize(*map); !s.ok()) return s;
    map_ = *std::move(map);
    tensors_ = tensors;
    Save();
  } else {
    if (tensors.size() != tensors_.size()) {
      return absl::FailedPreconditionError(absl::StrCat("tensors differ from those already defined: ",
                                                        tensors.size(), " declared, ", tensors_.size(), " defined"));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!google::protobuf::util::MessageDifferencer::Equals(tensors[i], tensors_[i])) {
        return absl::FailedPreconditionError(absl::StrCat("tensor #", i, " ", DescribeTensor(tensors[i]),
                                                          " differs from the defined ", DescribeTensor(tensors_[i])));
      }
    }
  }
  const uint64_t epoch = map_.epoch();
  // A write refused for good (deposed) ends the wait, as in Barrier: the
  // servers follow the successor, and this scheduler stops serving.
  auto serving = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ServersServe(epoch) || absl::IsFailedPrecondition(last_write_);
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&serving), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("shard map epoch ", epoch, " not served in time; ",
                                                    ServersBehind(epoch)));
  }
  if (absl::IsFailedPrecondition(last_write_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard map epoch ", epoch, ": its state's write was refused: ", last_write_.message()));
  }
  return map_;
}

absl::StatusOr<CheckpointResponse> ClusterState::RequestCheckpoint(const std::string& dir) {
  const WriteOnReturn write(this);  // after mu_ is released
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint: no directory given");
  ClusterConfig wanted = config_;
  wanted.mutable_checkpoint()->set_dir(dir);
  wanted.mutable_checkpoint()->set_every_rounds(std::max<uint64_t>(1, wanted.checkpoint().every_rounds()));
  if (absl::Status s = ValidateCheckpointConfig(wanted, /*on_request=*/true); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (map_.partitions_size() == 0) {
    return absl::FailedPreconditionError("checkpoint: no tensors are defined yet, so there is nothing to save");
  }
  // Every worker left (the job is over): no round completes any more, and
  // one placed past the servers' would never come (docwalk17: `shardps
  // checkpoint` waited out --wait, then said training may have stopped).
  if (RoundBased(config_) && static_cast<size_t>(map_.left_workers_size()) >= config_.num_workers()) {
    return absl::FailedPreconditionError(
        "checkpoint: every worker has left the job, so no round will complete to save at; a sync job is "
        "checkpointed while it trains (checkpoint.every_rounds, or shardps checkpoint before its last round)");
  }
  // With no round reported, a round placed at 1 is one training has likely
  // passed already (the servers log it and the checkpoint never completes).
  if (RoundBased(config_) && !AnyServerReportedARound()) {
    return absl::FailedPreconditionError(
        "checkpoint: no server has reported a completed round yet, so where training is is unknown; ask again "
        "once it has run for a few heartbeat intervals");
  }
  // Async (and ssp applied on arrival): each primary writes at once, at its
  // partitions' versions; the round labels the checkpoint: the most steps a
  // live worker reported (where a restored job's workers resume), after any
  // label asked for before, and past the round a resumed job began at: its
  // workers may not have reported (steps 0) or stepped since, and that
  // round's directory holds the checkpoint it resumed from. With no steps
  // reported and no such round the label would be 1, and a job resumed from
  // it would train its first steps again on weights already past them.
  uint64_t steps = 0;
  for (const auto& [rank, node] : workers_) {
    if (!node.dead) steps = std::max<uint64_t>(steps, node.counters.steps());
  }
  const uint64_t resumed_at = config_.checkpoint().restore_round();
  if (!RoundBased(config_) && steps == 0 && resumed_at == 0) {
    return absl::FailedPreconditionError(
        "checkpoint: no worker has reported its steps yet, so the step a restored job would resume at is unknown; "
        "ask again once training has run for a few heartbeat intervals");
  }
  const uint64_t round = RoundBased(config_) ? RoundPastServers(/*for_rejoin=*/false)
                                             : std::max<uint64_t>({steps, map_.checkpoint().round() + 1, resumed_at + 1});
  map_.set_epoch(map_.epoch() + 1);
  map_.mutable_checkpoint()->set_dir(dir);
  map_.mutable_checkpoint()->set_round(round);
  Save();
  CheckpointResponse response;
  response.set_dir(dir);
  response.set_round(round);
  return response;
}

std::optional<ShardMap> ClusterState::WaitForMap(uint64_t known_epoch, absl::Time deadline) {
  auto newer = [this, known_epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return map_.epoch() > known_epoch; };
  auto written = [this, known_epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return map_.epoch() > known_epoch && (!persist_ || written_epoch_ >= map_.epoch());
  };
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&newer), deadline)) return std::nullopt;
    if (written()) return map_;
  }
  // Written by the method that changed it once it returns, but one may wait
  // for the servers to serve this very map first (DefineTensors): write it here.
  WriteUnsaved();
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&written), deadline)) return std::nullopt;
  return map_;
}

absl::Status ClusterState::Barrier(uint64_t node_id, const std::string& name, absl::Time deadline,
                                   std::vector<uint32_t>* live, std::optional<uint64_t> passes_seen) {
  // A pass is saved (PassCompleteBarriers) and written before any rank is
  // answered, not with the next call that writes: a scheduler killed in
  // between forgot it, and a rank rejoining after its restart waited at a
  // barrier the others had passed (before 2026-11-25); nor before the one
  // writing it is done: the ranks that had waited were answered while the
  // write was under way, and one whose answer the scheduler's death cut
  // asked its successor, which had never seen the pass (chaos15).
  uint64_t saved = 0;
  absl::Status entered = EnterBarrier(node_id, name, deadline, live, passes_seen, &saved);
  if (!entered.ok()) return entered;
  return AwaitWritten(saved, deadline, absl::StrCat("barrier '", name, "': passed"));
}

absl::Status ClusterState::Written(absl::Time deadline, absl::string_view what) {
  uint64_t saved;
  {
    absl::MutexLock lock(&mu_);
    saved = saves_;
  }
  return AwaitWritten(saved, deadline, what);
}

absl::Status ClusterState::AwaitWritten(uint64_t saved, absl::Time deadline, absl::string_view what) {
  if (!persist_) return absl::OkStatus();
  // A failed write is tried again (WriteUnsaved paces the tries) until the
  // deadline.
  while (true) {
    WriteUnsaved();
    absl::MutexLock lock(&mu_);
    auto written = [this, saved]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return saves_written_ >= saved; };
    if (mu_.AwaitWithDeadline(absl::Condition(&written), std::min(deadline, absl::Now() + kRewriteAfterFailure))) {
      return absl::OkStatus();
    }
    // Refused for good (deposed): at once. A deposed scheduler stops
    // serving, and its gRPC server waits for this call (before, it stopped
    // only at the ranks' deadline, trying the refused write every 250 ms).
    if (absl::IsFailedPrecondition(last_write_)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ", but its state's write was refused: ", last_write_.message()));
    }
    if (absl::Now() >= deadline) {
      // The write's own error (a full disk names its path): the log that
      // says it is the scheduler's, which the ranks' owners may not read.
      return absl::DeadlineExceededError(absl::StrCat(
          what, ", but the scheduler could not write its state before the deadline: ", last_write_.ToString()));
    }
  }
}

absl::Status ClusterState::DeclarationStored(const Node& node, const std::string& who) {
  // A node told it is dead stops (a server) or fails its requests (a
  // worker): only on a declaration the job stored. Before, one heartbeat
  // handled while the declaration's etcd write was under way was told at
  // once, and a write that then deposed this scheduler left the job (its
  // successor) without the declaration, and without the server (fix20).
  // Nor, where that write failed without deposing this scheduler, is it
  // kept waiting: the map that failed it over went out all the same, and a
  // scheduler restarted on the older state found it alive and a primary
  // again, its copies missing the failover's rounds (review21).
  const uint64_t declared = node.declared_in_save;  // `node` may move while mu_ is released
  auto stored = [this, declared]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return saves_published_ >= declared || absl::IsFailedPrecondition(last_write_);
  };
  mu_.AwaitWithDeadline(absl::Condition(&stored), absl::Now() + kRewriteAfterFailure);
  if (saves_published_ >= declared) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the scheduler has not stored its declaration that ", who,
                                             " is dead (its state's write: ",
                                             last_write_.ok() ? "under way" : last_write_.ToString(), "); ask again"));
}

absl::Status ClusterState::EnterBarrier(uint64_t node_id, const std::string& name, absl::Time deadline,
                                        std::vector<uint32_t>* live, std::optional<uint64_t> passes_seen,
                                        uint64_t* saved) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(node_id);
  if (node == nullptr || node->role != WORKER) {
    return absl::FailedPreconditionError(absl::StrCat("barrier '", name, "': node ", node_id, " is not a registered worker"));
  }
  if (node->dead) {
    const uint32_t rank = node->rank;
    const bool left = node->left;
    // As a heartbeat's: said only once the declaration is stored.
    if (!left) SHARDPS_RETURN_IF_ERROR(DeclarationStored(*node, absl::StrCat("worker rank ", rank)));
    return absl::FailedPreconditionError(absl::StrCat("barrier '", name, "': worker rank ", rank,
                                                      left ? " left the job" : " was declared dead and removed from the job"));
  }
  BarrierState& b = barriers_[name];
  if (passes_seen.has_value() && b.generation > *passes_seen) {
    if (live != nullptr) *live = b.live_at_pass;
    *saved = saves_;
    return absl::OkStatus();
  }
  const uint64_t generation = b.generation;
  b.arrived.insert(node->rank);
  PassCompleteBarriers();
  if (b.generation > generation) {
    if (live != nullptr) *live = b.live_at_pass;
    *saved = saves_;
    return absl::OkStatus();
  }
  const absl::Time start = clock_();
  auto passed = [&b, generation]() { return b.generation > generation; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&passed), deadline)) {
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < config_.num_workers(); ++r) {
      if (!b.arrived.contains(r) && !Excluded(r)) missing.push_back(r);
    }
    // Only this process's arrival: a process started again for the rank
    // holds its place now (another id; `node` may be gone), and may wait
    // here too (before 2026-11-25 an old call's deadline took that arrival
    // away, and the barrier waited for a rank waiting at it until every
    // call failed).
    if (const Node* still = FindNode(node_id)) b.arrived.erase(still->rank);
    return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "': waited ",
                                                    absl::FormatDuration(clock_() - start),
                                                    "; missing worker ranks: ", absl::StrJoin(missing, ",")));
  }
  if (live != nullptr) *live = b.live_at_pass;
  *saved = saves_;
  return absl::OkStatus();
}

uint64_t ClusterState::NodesDeclaredDead() {
  absl::MutexLock lock(&mu_);
  return declared_dead_total_;
}

uint32_t ClusterState::ServerIndices() {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(servers_.size());
}

StatusResponse ClusterState::Status() {
  absl::MutexLock lock(&mu_);
  StatusResponse response;
  *response.mutable_config() = config_;
  *response.mutable_shard_map() = map_;
  response.set_copy_moves_planned(moves_planned_total_);
  response.set_handoffs_planned(handoffs_planned_total_);
  response.set_handoffs_made(handoffs_made_total_);
  // Judged for this epoch's map: a join, a death or a cancel since makes it stale.
  if (balance_checked_epoch_ == map_.epoch()) response.set_drain_waits(drain_waits_);
  const absl::Time now = clock_();
  for (auto* group : {&servers_, &workers_}) {
    for (auto& [k, node] : *group) {
      NodeStatus* s = response.add_nodes();
      s->set_node_id(node.id);
      s->set_role(node.role);
      s->set_rank(node.rank);
      s->set_address(node.address);
      s->set_host(node.host);
      const int64_t ms = absl::ToInt64Milliseconds(now - node.last_seen);
      s->set_ms_since_heartbeat(ms);
      s->set_alive(!node.dead && ms <= static_cast<int64_t>(config_.heartbeat_timeout_ms()));
      s->set_applied_epoch(node.applied_epoch);
      s->set_declared_dead(node.dead && !node.left);
      s->set_left(node.left);
      s->set_left_error(node.left_error);
      s->set_replaced(node.replaced);
      s->set_heard_since_start(node.heard);
      if (!node.checkpoint_failure.dir().empty()) *s->mutable_checkpoint_failure() = node.checkpoint_failure;
      if (node.role == SERVER && !node.dead) {
        for (const PartitionInfo& p : map_.partitions()) {
          if (!HoldsCopy(p, node.rank)) continue;
          s->set_copies(s->copies() + 1);
          s->set_copies_synced(s->copies_synced() + (ReportedSynced(node.rank, p) ? 1 : 0));
        }
      }
      if (node.counters_seen != absl::InfinitePast()) {
        *s->mutable_counters() = node.counters;
        s->set_ms_since_counters(absl::ToInt64Milliseconds(now - node.counters_seen));
        *s->mutable_rates() = node.rates;
      }
    }
  }
  return response;
}

}  // namespace shardps
