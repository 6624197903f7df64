#include "server/partition_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>

#include <glog/logging.h>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/data_message.h"
#include "common/protocol.h"

namespace shardps {
namespace {

// How many rounds a worker may run ahead of a partition's completed round
// before its pushes or pulls are refused (bounds parked memory).
constexpr uint64_t kMaxRoundsAhead = 4;

// How far ahead of the highest request id this server accepted from a worker
// (on any partition) a request id may be. A worker numbers all its requests,
// to every server, in one sequence, so a server sees gaps as large as what
// the worker sent elsewhere in between: 2^20 leaves room for a million
// requests to other servers between two of its own.
constexpr uint64_t kRequestIdWindow = uint64_t{1} << 20;

// The most async pushes one batch applies: its update names each push's
// worker and request id (at most 3 + 10 bytes) in a header a backup refuses
// over kMaxHeaderBytes; 256 leave more than 700 bytes for the rest. 1024
// workers' pushes in one header took 5 KB, refused by every backup.
constexpr uint32_t kMaxBatchPushes = 256;

bool CarriesGradient(Op op) { return op == INIT || op == PUSH || op == PUSH_PULL; }

// In async mode each push is one worker's share of what a sync round does
// with all W gradients, so it is applied with learning rate lr / W, and the
// schedule (and Adam's variance freeze) counts W pushes as one round. The
// same config then trains at the same pace in either mode.
OptimizerConfig AsyncAdjusted(const ClusterConfig& config) {
  OptimizerConfig o = config.optimizer();
  if (RoundBased(config) || config.num_workers() <= 1) return o;
  const uint32_t w = config.num_workers();
  o.set_learning_rate(o.learning_rate() / w);
  LearningRateSchedule* s = o.mutable_schedule();
  s->set_min_lr(s->min_lr() / w);
  s->set_step_size(s->step_size() * w);
  s->set_total_steps(s->total_steps() * w);
  // Counted in updates too: W pushes per round (saturating).
  const uint64_t freeze = o.freeze_variance_after();
  o.set_freeze_variance_after(freeze > UINT64_MAX / w ? UINT64_MAX : freeze * w);
  return o;
}

// Frees an AlignForFloats copy when libzmq closes its last reference: on the
// engine thread, or on ZeroMQ's I/O thread once a backup's message sharing it
// (ReplicateFirst) is sent. Named for tests/tsan/suppressions.txt: TSan cannot
// see libzmq's reference count order the engine's accesses before it.
void FreeAlignedCopy(void* data, void* /*hint*/) { std::free(data); }

// ZeroMQ does not align a frame's data: a received frame may start anywhere
// in its receive buffer. The engine reads payloads as floats, so a
// misaligned one is copied once into memory of its own (malloc aligns it).
void AlignForFloats(zmq::message_t& m) {
  if (reinterpret_cast<uintptr_t>(m.data()) % alignof(float) == 0) return;
  void* copy = std::malloc(std::max<size_t>(m.size(), 1));
  if (copy == nullptr) throw std::bad_alloc();
  std::memcpy(copy, m.data(), m.size());
  const size_t size = m.size();
  m.rebuild(copy, size, &FreeAlignedCopy, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PartitionEngine>> PartitionEngine::Create(const ClusterConfig& config,
                                                                         ReplySink sink, ReplicaSink replicate) {
  auto optimizer = Optimizer::Create(AsyncAdjusted(config));
  if (!optimizer.ok()) return optimizer.status();
  if (absl::Status s = compression::ValidateCompressionConfig(config); !s.ok()) return s;
  return std::unique_ptr<PartitionEngine>(
      new PartitionEngine(config, *std::move(optimizer), std::move(sink), std::move(replicate)));
}

int64_t PartitionEngine::MaxFrameBytes(const ClusterConfig& config) {
  // A snapshot of a partition (weights, two optimizer slots, mirror,
  // aggregate) and per-worker counters.
  const uint64_t state = 8 * config.partition_bytes() + 24 * std::max<uint32_t>(config.num_workers(), 4096) + 65536;
  // SSP in rounds, replicated: then the open rounds' pushes, at most one
  // counted and kMaxRoundsAhead + staleness parked per worker, each at most
  // n * 8 + 64 bytes (Validate's bound for a compressed push) with its
  // forwarded header and two lengths.
  const uint64_t staleness = StalenessBound(config);
  if (!RoundBased(config) || staleness == 0 || EffectiveReplication(config) <= 1) return static_cast<int64_t>(state);
  const uint64_t push = 2 * config.partition_bytes() + 64 + 256;
  return static_cast<int64_t>(state + uint64_t{config.num_workers()} * (1 + kMaxRoundsAhead + staleness) * push);
}

PartitionEngine::PartitionEngine(const ClusterConfig& config, std::unique_ptr<Optimizer> optimizer,
                                 ReplySink sink, ReplicaSink replicate)
    : config_(config),
      optimizer_(std::move(optimizer)),
      sum_only_(config.update_mode() == SUM_ONLY),
      sink_(std::move(sink)),
      replicate_(std::move(replicate)),
      replicated_(EffectiveReplication(config) > 1),
      worker_last_id_(config.num_workers(), 0),
      staleness_(StalenessBound(config)),
      bounded_(config.consistency() == SSP && !RoundBased(config)),
      answer_staleness_(staleness_),
      max_ahead_(kMaxRoundsAhead + staleness_),
      forwards_pushes_(staleness_ > 0),
      forwards_counted_(replicated_ && RoundBased(config) && staleness_ == 0) {}

absl::Status PartitionEngine::InstallShardMap(const ShardMap& map, uint32_t server_index) {
  // An async batch still open is applied under the map its pushes came
  // with: a snapshot for a copy this map re-creates must hold its gradient
  // along with its request ids (taken at arrival), or that copy would take
  // the batch's update for one it has.
  for (auto& [id, p] : partitions_) {
    if (p->batch_count > 0) ApplyAsyncBatch(*p);
  }
  server_index_ = server_index;
  for (const ServerInfo& s : map.servers()) {
    if (server_addresses_.size() <= s.index()) server_addresses_.resize(s.index() + 1);
    server_addresses_[s.index()] = s.data_address();
  }
  // The first map with partitions (DefineTensors') lists every copy from the
  // start, even after maps without any: a worker declared dead or leaving
  // before the tensors were defined moves the epoch on.
  const bool first_map = !partitions_mapped_ && !joined_running_job_;
  if (map.partitions_size() > 0) partitions_mapped_ = true;
  const uint64_t since = first_map ? 0 : epoch_ + 1;  // a primary newly named here took over no earlier
  // Before the partitions follow the map: what they send the backups now (a
  // re-created copy's snapshot) must carry the new epoch, so a backup that
  // has not installed it yet holds it until it has, instead of refusing a
  // partition it does not know yet.
  epoch_ = map.epoch();
  const uint32_t workers = config_.num_workers();
  absl::flat_hash_set<uint64_t> held;
  absl::flat_hash_map<uint64_t, uint32_t> primary_of;  // every partition's primary in this map
  std::vector<Deferred> resume;  // held by hand-offs that ended here
  for (const PartitionInfo& info : map.partitions()) {
    primary_of[info.id()] = info.server();
    const bool holds = info.server() == server_index ||
                       std::find(info.backups().begin(), info.backups().end(), server_index) != info.backups().end();
    if (!holds) continue;
    held.insert(info.id());
    if (auto it = partitions_.find(info.id()); it != partitions_.end()) {
      if (it->second->primary || ListedAt(info, server_index) <= it->second->listed_at) {
        FollowHandoff(*it->second, map, info, resume);
        UpdateRole(*it->second, info, /*created=*/false, since);
        continue;
      }
      // This backup copy was dropped and given back in maps this server
      // skipped: it missed the updates in between, so it is made anew and
      // waits for its primary's snapshot (or, promoted, answers DATA_LOSS).
      LOG(WARNING) << "server " << server_index << ": copy of partition " << info.id() << " was given back at shard "
                   << "map epoch " << ListedAt(info, server_index) << " after maps this server skipped dropped it: "
                   << "it holds stale state and waits for a snapshot";
      partitions_.erase(it);
    }
    dropped_after_handoff_.erase(info.id());
    auto p = std::make_unique<Partition>();
    p->id = info.id();
    p->n = info.num_elements();
    const TensorSpec& spec = map.tensors(info.tensor());
    const std::string& tensor = spec.name();
    p->tensor = tensor;
    p->offset = info.offset();
    auto codecs = compression::CodecsForPartition(config_, tensor, p->n, spec.codec());
    if (!codecs.ok()) return codecs.status();
    p->codecs = *std::move(codecs);
    if (p->codecs.pull != nullptr && sum_only_ && !pull_feedback_.contains(p->codecs.pull_spec)) {
      auto params = compression::ParseCodecSpec(p->codecs.pull_spec);
      if (!params.ok()) return params.status();
      auto feedback = compression::ErrorFeedback::Create(*params);
      if (!feedback.ok()) return feedback.status();
      pull_feedback_[p->codecs.pull_spec] = *std::move(feedback);
    }
    p->weights.reset(SharedBuffer::Create(p->n));
    if (sum_only_) p->aggregate.reset(SharedBuffer::Create(p->n));
    p->delta_pulls = compression::PullsWeightDeltas(config_, p->codecs);
    if (p->delta_pulls) {
      p->mirror.assign(p->n, 0.0f);
      p->delta.assign(p->n, 0.0f);
    }
    p->state.assign(static_cast<size_t>(optimizer_->state_slots()) * p->n, 0.0f);
    p->next_round.assign(workers, 0);
    p->contributed.assign(workers, false);
    p->no_gradient.assign(workers, false);
    p->incarnation.assign(workers, 0);
    // A rank that rejoined before this copy was made: its pushes name that
    // registration (Rejoin gave it to the copies held then only).
    for (uint32_t w = 0; w < workers && w < join_incarnation_.size(); ++w) p->incarnation[w] = join_incarnation_[w];
    p->last_request.assign(workers, 0);
    p->applied_by.assign(workers, 0);
    p->applied_digest.assign(workers, 0);
    p->clock.assign(workers, 0);
    const compression::Codec* push = p->codecs.push.get();
    if (RoundBased(config_)) {
      p->acc.reset(SharedBuffer::Create(p->n));
      if (config_.deterministic()) {
        p->held.resize(workers);
        if (push != nullptr) p->decoded.assign(workers, std::vector<float>(p->n));
      } else if (push != nullptr && push->server_can_aggregate()) {
        p->acc_encoded.assign(push->EncodedBytes(p->n) / sizeof(float), 0.0f);
      }
    } else if (push != nullptr) {
      p->scratch.assign(p->n, 0.0f);
    }
    if (first_map && !config_.checkpoint().restore_dir().empty()) {
      if (absl::Status s = RestorePartition(*p); !s.ok()) return s;
    }
    // A copy added to a running job holds nothing valid until its primary's
    // snapshot arrives; one listed from the start begins equal. (Named the
    // primary of a copy it never held, this server missed the maps that
    // gave it the copy and then promoted it: it answers DATA_LOSS.)
    p->synced = first_map;
    p->listed_at = ListedAt(info, server_index);
    LOG_IF(ERROR, !first_map && info.server() == server_index)
        << "server " << server_index << ": named the primary of partition " << info.id() << " at shard map epoch "
        << map.epoch() << " without holding a copy of it (maps skipped): " << LostCopy(*p).message();
    UpdateRole(*p, info, /*created=*/true, since);
    partitions_.emplace(info.id(), std::move(p));
  }
  // A backup copy moved elsewhere: dropped, so that a later map giving it
  // back starts from a snapshot again instead of stale state. A primary's
  // partition leaves it with its death, or after handing the role off: a
  // primary move (replication 1) drops the old copy in the epoch after the
  // switch, and a server that skipped the switch's map (a watch hands over
  // only the latest) sees itself a primary still handing off, not listed,
  // another server the primary. Kept, it would report its stale update
  // counts, count as a primary that never writes a checkpoint's part (its
  // manifest never written) and refuse the new primary's replicas. What it
  // held is dropped unanswered: the workers re-sent it to the new primary.
  for (auto it = partitions_.begin(); it != partitions_.end();) {
    const Partition& p = *it->second;
    const auto listed_primary = primary_of.find(it->first);
    const bool handed_off = p.primary && p.handoff_epoch != 0 && listed_primary != primary_of.end() &&
                            listed_primary->second != server_index;
    if (held.contains(it->first) || (p.primary && !handed_off)) {
      ++it;
    } else if (handed_off) {
      LOG(WARNING) << "server " << server_index << ": primary of partition " << it->first << " handed off to server "
                   << listed_primary->second << " and its copy here dropped, both in maps this server skipped "
                   << "(shard map epoch " << map.epoch() << "): dropped after " << p.completed
                   << (RoundBased(config_) ? " rounds" : " updates") << ", " << p.handoff_held.size()
                   << " held requests left to the workers to re-send there";
      handing_off_.erase(it->first);
      dropped_after_handoff_[it->first] = map.epoch();
      partitions_.erase(it++);
    } else {
      if (p.handed_off_at != 0) dropped_after_handoff_[it->first] = map.epoch();
      LOG(INFO) << "server " << server_index << ": copy of partition " << it->first << " moved away at shard map epoch "
                << map.epoch();
      partitions_.erase(it++);
    }
  }
  ++copies_generation_;
  FollowCheckpoints(map, since);
  ApplyMembership(map);
  // In arrival order, before what waited for this epoch (routed later).
  for (Deferred& d : resume) Dispatch(d.peer, d.header, d.has_payload ? &d.payload : nullptr);
  RunDeferred();
  if (!handing_off_.empty()) ProgressHandoffs();
  return absl::OkStatus();
}

void PartitionEngine::ApplyMembership(const ShardMap& map) {
  const uint32_t workers = config_.num_workers();
  excluded_.resize(workers, false);
  join_incarnation_.resize(workers, 0);
  // The map says who is out: a rank leaves the list only by rejoining.
  std::vector<bool> now_excluded(workers, false);
  for (uint32_t r : map.excluded_workers()) {
    if (r < workers) now_excluded[r] = true;
  }
  const auto rejoins = [&](const WorkerRejoin& r) {
    return r.rank() < workers && !now_excluded[r.rank()] && r.incarnation() != join_incarnation_[r.rank()];
  };
  // A watch hands a server only the latest map: a rank removed and
  // rejoined in maps this server skipped (its process restarted at once)
  // is removed first, as the skipped map said, so the open round completes
  // without the dead process instead of waiting for its push. (A server's
  // first map lists rejoins that happened before it: nothing to undo.)
  if (membership_applied_) {
    std::vector<bool> skipped = now_excluded;
    bool any_skipped = false;
    for (const WorkerRejoin& r : map.rejoined_workers()) {
      if (rejoins(r) && !excluded_[r.rank()]) skipped[r.rank()] = any_skipped = true;
    }
    if (any_skipped) {
      std::vector<bool> removed;
      if (MarkExcluded(skipped, map, &removed)) DropRemoved(removed);
    }
  }
  membership_applied_ = true;
  std::vector<bool> removed;
  const bool any = MarkExcluded(now_excluded, map, &removed);
  for (const WorkerRejoin& r : map.rejoined_workers()) {
    if (rejoins(r)) Rejoin(r);
  }
  if (any) DropRemoved(removed);
}

bool PartitionEngine::MarkExcluded(const std::vector<bool>& now_excluded, const ShardMap& map,
                                   std::vector<bool>* removed) {
  const uint32_t workers = config_.num_workers();
  removed->assign(workers, false);
  bool any = false;
  for (uint32_t r = 0; r < workers; ++r) {
    if (now_excluded[r] && !excluded_[r]) {
      (*removed)[r] = any = true;
      const bool left = absl::c_linear_search(map.left_workers(), r);  // its job ended: no news
      LOG_IF(WARNING, !left) << "server " << server_index_ << ": worker " << r << " was removed from the job "
                             << "(shard map epoch " << epoch_ << ")"
                             << (RoundBased(config_) ? "; rounds complete without it" : "");
      LOG_IF(INFO, left) << "server " << server_index_ << ": worker " << r << " left the job (shard map epoch " << epoch_
                         << ")";
    }
  }
  excluded_ = now_excluded;
  num_excluded_ = static_cast<uint32_t>(std::count(excluded_.begin(), excluded_.end(), true));
  return any;
}

void PartitionEngine::DropRemoved(const std::vector<bool>& removed) {
  const absl::Status gone = absl::UnavailableError("this worker was removed from the job");
  for (auto& [id, part] : partitions_) {
    Partition& p = *part;
    if (bounded_ && p.primary) ReleaseBounded(p);  // no longer waited for
    // Its parked requests can never be answered usefully; its pushes that
    // were ahead of the round are not counted.
    std::vector<ParkedPush> ahead;
    for (ParkedPush& push : p.ahead) {
      if (removed[push.header.worker_rank()]) {
        Answer(push.peer, push.header, gone);
        p.next_round[push.header.worker_rank()] = std::min(p.next_round[push.header.worker_rank()],
                                                           push.header.round());
      } else {
        ahead.push_back(std::move(push));
      }
    }
    p.ahead = std::move(ahead);
    // Nor does a copy promoted later count them: a backup drops what was
    // forwarded of them (ssp; a sync round's update may name its pushes)
    // past its open round. Its push of that round stands, counted by the
    // primary. (A primary one round ahead, whose last round is not here
    // yet, counted the next one too; the backup cannot tell, and drops it.)
    if (forwards_pushes_) {
      std::erase_if(p.forwarded, [&](const ParkedPush& f) { return RemovedPush(p, f.header); });
    }
    // Once the last round is on every copy (else FinishRound completes it
    // when the backups confirm), as a push that completes a round.
    if (RoundBased(config_) && Settled(p) && RoundComplete(p)) CompleteRound(p);
  }
}

void PartitionEngine::Rejoin(const WorkerRejoin& r) {
  const uint32_t w = r.rank();
  join_round_.resize(config_.num_workers(), 0);  // from now on rounds check who is counted
  join_round_[w] = r.round();
  join_incarnation_[w] = r.incarnation();
  join_epoch_.resize(config_.num_workers(), 0);
  join_epoch_[w] = r.epoch();
  worker_last_id_[w] = 0;  // a new process numbers its requests afresh
  LOG(WARNING) << "server " << server_index_ << ": worker " << w << " rejoins the job (registration "
               << r.incarnation() << ", shard map epoch " << epoch_ << ")"
               << (RoundBased(config_) ? absl::StrCat(": counted in rounds >= ", r.round()) : "");
  for (auto& [id, part] : partitions_) {
    Partition& p = *part;
    p.incarnation[w] = r.incarnation();
    // Async: its pushes are counted afresh (what the dead process had
    // applied was acknowledged to no survivor).
    p.last_request[w] = 0;
    p.applied_by[w] = 0;
    p.applied_digest[w] = 0;
    p.clock[w] = 0;  // known again from its first push
    if (!RoundBased(config_)) continue;
    p.next_round[w] = r.round();
    // Its dead process's push of the open round is counted in it: one
    // gradient per worker and round, so the new process's push of that
    // round is taken for a retry.
    if (p.contributed[w] && r.round() <= p.completed) p.next_round[w] = p.completed + 1;
    if (p.completed > r.round()) {
      // Rounds up to the open one completed without the worker: every
      // worker was removed mid-step and this partition completed the round
      // it was in while others did not (the rank joins at the fewest,
      // WorkerRejoin.catch_up), or the scheduler placed the round past
      // every server's by their pace and this one was faster. Its pushes of
      // those rounds are taken for retries (answered with the weights, not
      // counted) and it is counted from the open round: the others wait
      // there for it as it catches up. Before 2026-11-25 the second case
      // refused them, and the worker failed ("the worker must rejoin
      // again"; FailureTest.AKilledWorkerStartedAgainRejoins... on a loaded
      // machine: placed at 53, this partition at 55).
      p.next_round[w] = std::max(p.next_round[w], p.completed);
      if (!r.catch_up()) {
        LOG(WARNING) << "server " << server_index_ << ": partition " << p.id << " had completed " << p.completed
                     << " rounds when worker " << w << " rejoined at round " << r.round()
                     << ": it is counted from round " << p.completed << ", its pushes of those before answered "
                     << "with the weights";
      }
    }
  }
}

std::optional<uint64_t> PartitionEngine::fewest_completed_round() const {
  if (!RoundBased(config_)) return std::nullopt;
  std::optional<uint64_t> fewest;
  for (const auto& [id, part] : partitions_) {
    if (part->primary) fewest = std::min(fewest.value_or(part->completed), part->completed);
  }
  return fewest;
}

bool PartitionEngine::Counted(const Partition& p, uint32_t w) const {
  // Before its join round, and where the rounds went past it (a late map),
  // a rejoined worker is not waited for.
  return !excluded_[w] && JoinRound(w) <= p.completed && p.next_round[w] >= p.completed;
}

bool PartitionEngine::RemovedPush(const Partition& p, const DataHeader& h) const {
  return num_excluded_ > 0 && excluded_[h.worker_rank()] && h.round() > p.completed;
}

std::vector<PartitionEngine::RoundStall> PartitionEngine::CheckRoundStalls() {
  std::map<uint32_t, RoundStall> stalled;  // by worker
  if (RoundBased(config_)) {
    for (auto& [id, part] : partitions_) {
      Partition& p = *part;
      const bool open = p.primary && p.arrivals > 0 && !RoundComplete(p);
      const bool stuck = open && p.stall_check_round == p.completed && p.stall_check_arrivals == p.arrivals;
      p.stall_check_round = open ? p.completed : UINT64_MAX;
      p.stall_check_arrivals = p.arrivals;
      if (!stuck) continue;
      for (uint32_t w = 0; w < config_.num_workers(); ++w) {
        if (!Counted(p, w) || Contributed(p, w)) continue;
        RoundStall& s = stalled[w];
        s.round = s.partitions.empty() ? p.completed : std::min(s.round, p.completed);
        s.worker = w;
        s.partitions.push_back(id);
      }
    }
  }
  std::vector<RoundStall> out;
  for (auto& [w, s] : stalled) {
    if (round_stalled_workers_.contains(w)) continue;  // said when found
    std::sort(s.partitions.begin(), s.partitions.end());
    out.push_back(std::move(s));
  }
  for (uint32_t w : round_stalled_workers_) {
    // Not a removed worker: its rounds moved on without it, which the
    // scheduler's line says (before, a killed worker declared dead was
    // said to reach this server again).
    if (stalled.contains(w) || excluded_[w]) continue;
    out.push_back({.worker = w, .partitions = {}, .round = 0, .resumed = true});
  }
  round_stalled_workers_.clear();
  for (const auto& [w, s] : stalled) round_stalled_workers_.insert(w);
  return out;
}

bool PartitionEngine::RoundComplete(const Partition& p) const {
  if (num_excluded_ == 0 && join_round_.empty()) return p.arrivals == config_.num_workers();
  if (p.arrivals == 0) return false;
  for (uint32_t w = 0; w < config_.num_workers(); ++w) {
    if (Counted(p, w) && !Contributed(p, w)) return false;
  }
  return true;
}

absl::Status PartitionEngine::CheckIncarnation(Partition& p, const DataHeader& h) const {
  const uint32_t w = h.worker_rank();
  const uint64_t incarnation = h.worker_incarnation();
  if (incarnation == p.incarnation[w]) return absl::OkStatus();
  if (w < join_incarnation_.size() && join_incarnation_[w] != 0 && incarnation != join_incarnation_[w]) {
    // The rank rejoined: only that process pushes for it. Every worker
    // process names its registration, so one naming none, or the dead
    // process's (a late push), is not it, and may not take the rank over.
    return absl::FailedPreconditionError(absl::StrCat(
        "a push of round ", h.round(), " of partition ", p.id, " names ",
        incarnation == 0 ? std::string("no registration") : absl::StrCat("registration ", incarnation), ", and worker ",
        w, " rejoined the job with registration ", join_incarnation_[w]));
  }
  if (incarnation == 0) return absl::OkStatus();  // a client that never registered
  const bool started = RoundBased(config_) ? p.next_round[w] > 0 : p.last_request[w] > 0;
  if (p.incarnation[w] != 0 && started) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w, " restarted (registration ", incarnation, ", was ", p.incarnation[w], ") and pushes round ",
        h.round(), " of partition ", p.id, ", which its previous process had taken to round ",
        RoundBased(config_) ? p.next_round[w] : p.completed,
        ": a restarted worker rejoins once its rank was declared dead, at the round the scheduler gives it"));
  }
  p.incarnation[w] = incarnation;
  return absl::OkStatus();
}

std::vector<PartitionUpdates> PartitionEngine::UpdateCounts() const {
  return CountsOf([](const Partition& p) { return p.primary; });
}

std::vector<PartitionUpdates> PartitionEngine::BackupUpdateCounts() const {
  return CountsOf([](const Partition& p) { return !p.primary && p.synced; });
}

std::vector<PartitionUpdates> PartitionEngine::CountsOf(absl::FunctionRef<bool(const Partition&)> which) const {
  std::vector<PartitionUpdates> out;
  for (const auto& [id, p] : partitions_) {
    if (!which(*p)) continue;
    out.push_back(PartitionUpdates{id, p->completed, p->applied_by,
                                   RoundBased(config_) ? std::vector<uint64_t>() : p->applied_digest});
  }
  return out;
}

const float* PartitionEngine::weights(uint64_t partition_id) const {
  auto it = partitions_.find(partition_id);
  return it == partitions_.end() ? nullptr : it->second->weights->data();
}

absl::Status PartitionEngine::Validate(const DataHeader& h, const zmq::message_t* payload, Partition** out,
                                       bool* staged) {
  *staged = false;
  if (h.op() == RESPONSE) return absl::InvalidArgumentError("a server does not accept responses");
  // An older epoch is served while this server still owns the partition:
  // membership changes (a worker or server declared dead) move nothing.
  auto it = partitions_.find(h.partition_id());
  if (h.epoch() > epoch_ || (h.epoch() < epoch_ && it == partitions_.end())) {
    return absl::FailedPreconditionError(absl::StrCat("wrong epoch: request routed with shard map epoch ",
                                                      h.epoch(), ", server ", server_index_, " serves epoch ",
                                                      epoch_));
  }
  if (it == partitions_.end()) {
    return absl::NotFoundError(absl::StrCat("partition ", h.partition_id(), " is not served by server ",
                                            server_index_, " (epoch ", epoch_, ")"));
  }
  Partition& p = *it->second;
  if (!p.primary) {
    return absl::FailedPreconditionError(absl::StrCat("wrong epoch: server ", server_index_,
                                                      " holds a backup of partition ", p.id,
                                                      ", not its primary (serves epoch ", epoch_, ")"));
  }
  if (h.worker_rank() >= config_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", h.worker_rank(), " is outside [0, ",
                                                   config_.num_workers(), ")"));
  }
  if (num_excluded_ > 0 && excluded_[h.worker_rank()]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", h.worker_rank(),
                                                      " was declared dead and removed from the job (server ",
                                                      server_index_, ", shard map epoch ", epoch_, ")"));
  }
  if (h.no_gradient()) {
    if (h.op() != PUSH && h.op() != PUSH_PULL) return absl::InvalidArgumentError("only a push may carry no gradient");
    if (!RoundBased(config_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a push of partition ", p.id, " with no gradient takes part in a round, and this cluster applies pushes on "
          "arrival (consistency ", Consistency_Name(config_.consistency()), "): nothing waits for the pushes a "
          "frozen parameter does not send"));
    }
    if (payload != nullptr && payload->size() > 0) {
      return absl::InvalidArgumentError("a push with no gradient carries a payload");
    }
    *out = &p;
    return absl::OkStatus();
  }
  if (CarriesGradient(h.op())) {
    if (payload == nullptr) return absl::InvalidArgumentError("request has no payload frame");
    if (h.dtype() != FLOAT32) return absl::InvalidArgumentError(absl::StrCat("dtype ", h.dtype(), " is not float32"));
    if (h.num_elements() != p.n) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", p.id, " has ", p.n, " elements, request says ",
                                                     h.num_elements()));
    }
    const bool warmup = h.op() != INIT && compression::RoundUncompressed(config_, h.round());
    const compression::WireCodec wire = h.op() == INIT ? compression::WireCodec{} : PushCodec(p, h.round());
    const std::string& expected = wire.spec;
    if (h.codec() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("payload codec '", h.codec(), "' does not match the codec '",
                                                     expected, "' configured for partition ", p.id,
                                                     warmup ? absl::StrCat(" in warm-up round ", h.round()) : ""));
    }
    if (warmup && !wire.raw()) {
      // The warm-up codecs (fp16, bf16) have an exact size, checked here as
      // for raw rounds.
      const size_t want = wire.codec->EncodedBytes(p.n);
      if (payload->size() != want) {
        return absl::InvalidArgumentError(absl::StrCat(expected, " payload of ", payload->size(),
                                                       " bytes for partition ", p.id, " in warm-up round ",
                                                       h.round(), " (expected ", want, ")"));
      }
    } else if (!expected.empty()) {
      // Size, parameters and indices are checked by the decoder, before it
      // writes anything; here only an absurd size is turned away.
      if (payload->size() == 0 || payload->size() > p.n * 8 + 64) {
        return absl::InvalidArgumentError(absl::StrCat("compressed payload of ", payload->size(),
                                                       " bytes for partition ", p.id, " of ", p.n, " elements"));
      }
    } else if (payload->size() != p.n * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("payload of ", payload->size(), " bytes for partition ", p.id,
                                                     " (expected ", p.n * sizeof(float), ")"));
    }
    if (config_.reject_non_finite()) {
      absl::Status s = expected.empty() ? CheckRawGradient(p, h, payload->data<float>(), staged)
                                        : CheckFinite16(p, h, *payload);
      if (!s.ok()) return s;
    }
  } else if (payload != nullptr) {
    return absl::InvalidArgumentError("pull request carries a payload frame");
  }
  *out = &p;
  return absl::OkStatus();
}

absl::Status PartitionEngine::CheckFinite16(const Partition& p, const DataHeader& h,
                                           const zmq::message_t& payload) {
  const uint16_t mask = h.codec() == "fp16" ? 0x7c00 : h.codec() == "bf16" ? 0x7f80 : 0;
  if (mask == 0 || AllFinite16(payload.data<uint16_t>(), payload.size() / 2, mask)) return absl::OkStatus();
  ++stats_.non_finite;
  const std::string what = absl::StrCat("gradient from worker ", h.worker_rank(), " for partition ", p.id,
                                        " (tensor ", p.tensor, ") holds NaN or Inf in its ", h.codec(),
                                        " payload: refused (reject_non_finite), weights unchanged");
  LOG_EVERY_N(WARNING, 1000) << "server " << server_index_ << ": " << what << " [" << google::COUNTER
                             << " such requests so far]";
  return absl::InvalidArgumentError(what);
}

absl::Status PartitionEngine::CheckRawGradient(Partition& p, const DataHeader& h, const float* g, bool* staged) {
  const bool push = h.op() == PUSH || h.op() == PUSH_PULL;
  if (push && RoundBased(config_) && !config_.deterministic() && h.round() == p.completed && p.gradients == 1 &&
      HoldsFirstGradient(p)) {
    // The round's second gradient, summed with the first (Accumulate).
    // Scratch until the push is counted: a refused one leaves nothing behind.
    if (SumAndCheckFinite(StartSum(p), p.first.data<float>(), g, p.n)) {
      *staged = true;
      return absl::OkStatus();
    }
    return RefuseNonFinite(p, h, g);
  }
  if (push && !RoundBased(config_) && p.batch_count == 1 && BatchStartsWithHeldPush(p)) {
    // The batch's second push, summed with the first (PushAsync).
    p.batch_sum.resize(p.n);
    if (SumAndCheckFinite(p.batch_sum.data(), p.first.data<float>(), g, p.n)) {
      *staged = true;
      return absl::OkStatus();
    }
    return RefuseNonFinite(p, h, g);
  }
  return CheckFinite(p, h, g);
}

absl::Status PartitionEngine::CheckFinite(const Partition& p, const DataHeader& h, const float* x) {
  if (AllFinite(x, p.n)) return absl::OkStatus();
  return RefuseNonFinite(p, h, x);
}

absl::Status PartitionEngine::RefuseNonFinite(const Partition& p, const DataHeader& h, const float* x) {
  ++stats_.non_finite;
  const size_t i = FirstNonFinite(x, p.n);
  const std::string what = absl::StrCat(h.op() == INIT ? "INIT" : "gradient", " from worker ", h.worker_rank(),
                                        " for partition ", p.id, " (tensor ", p.tensor, ") holds ", x[i],
                                        " at element ", i, ": refused (reject_non_finite), weights unchanged");
  LOG_EVERY_N(WARNING, 1000) << "server " << server_index_ << ": " << what << " [" << google::COUNTER
                             << " such requests so far]";
  return absl::InvalidArgumentError(what);
}

absl::Status PartitionEngine::LostCopy(const Partition& p) const {
  return absl::DataLossError(absl::StrCat(
      "partition ", p.id, " (tensor ", p.tensor, ") is lost: server ", server_index_,
      " became its primary before its copy was complete (the snapshot from its primary had not arrived, or it had "
      "missed an update) and no complete copy was left; restart the job from a checkpoint"));
}

absl::Status PartitionEngine::CheckRequestId(const Partition& p, const DataHeader& h) {
  // Sync rounds are told apart by round, not by request id.
  if (RoundBased(config_)) return absl::OkStatus();
  const uint32_t w = h.worker_rank();
  uint64_t& last = worker_last_id_[w];
  const uint64_t base = std::max(last, p.last_request[w]);
  const uint64_t id = h.request_id();
  if (id > base && id - base > kRequestIdWindow) {
    ++stats_.bad_request_ids;
    return absl::InvalidArgumentError(absl::StrCat(
        "request id ", id, " from worker ", w, " for partition ", p.id, " is ", id - base,
        " ahead of the last one server ", server_index_, " accepted from it (", base, "; at most ", kRequestIdWindow,
        " allowed): refused, since later pushes would be taken for retries of it"));
  }
  last = std::max(last, id);
  return absl::OkStatus();
}

void PartitionEngine::Handle(const zmq::message_t& peer, const DataHeader& h, zmq::message_t* payload) {
  ++stats_.requests;
  ++stats_.requests_by_op[StatSlot(h.op(), stats_.requests_by_op.size(), 0)];
  if (payload != nullptr) {
    stats_.bytes_in += payload->size();
    AlignForFloats(*payload);
  }
  // A worker (or a primary) that learned of a new epoch before this server
  // did: wait for the epoch (a few epochs ahead at most; further is a bad
  // request). A re-created copy's snapshot may arrive before its map. A
  // server with no map yet (one that joins a running job, whose epochs may
  // be far past 0) holds requests of any epoch until its first.
  if (h.epoch() > epoch_ && (epoch_ == 0 || h.epoch() <= epoch_ + kEpochsAhead) && deferred_.size() < kMaxDeferred) {
    Deferred d{zmq::message_t(peer.data(), peer.size()), h, zmq::message_t(), payload != nullptr};
    if (payload != nullptr) d.payload.move(*payload);
    deferred_.push_back(std::move(d));
    return;
  }
  Dispatch(peer, h, payload);
  if (!handing_off_.empty()) ProgressHandoffs();
}

void PartitionEngine::Dispatch(const zmq::message_t& peer, const DataHeader& h, zmq::message_t* payload) {
  if (h.op() == REPLICATE) {
    HandleReplica(peer, h, payload);
    return;
  }
  if (auto it = partitions_.find(h.partition_id());
      it != partitions_.end() && !it->second->primary && h.epoch() < it->second->handed_off_at) {
    // Routed before this server handed the partition off: the worker
    // re-sends it to the new primary with the same request id, and an
    // answer from here (even an error) would settle that request.
    VLOG(1) << "server " << server_index_ << ": request " << h.request_id() << " for partition " << h.partition_id()
            << " routed at epoch " << h.epoch() << ", before its hand-off: left to the new primary";
    return;
  }
  if (auto d = dropped_after_handoff_.find(h.partition_id());
      d != dropped_after_handoff_.end() && h.epoch() < d->second && !partitions_.contains(h.partition_id())) {
    VLOG(1) << "server " << server_index_ << ": request " << h.request_id() << " for partition " << h.partition_id()
            << " routed at epoch " << h.epoch() << ", before its hand-off and the drop of its copy here: left to the "
            << "new primary";
    return;
  }
  Partition* p = nullptr;
  bool staged = false;
  absl::Status valid = Validate(h, payload, &p, &staged);
  if (valid.ok() && p->primary && !p->synced) valid = LostCopy(*p);
  if (valid.ok()) valid = CheckRequestId(*p, h);
  if (!valid.ok()) {
    Answer(peer, h, valid);
    return;
  }
  if (p->handoff_epoch != 0 && HoldsForHandoff(*p, h)) {
    Deferred held{zmq::message_t(peer.data(), peer.size()), h, zmq::message_t(), payload != nullptr};
    if (payload != nullptr) held.payload.move(*payload);
    p->handoff_held.push_back(std::move(held));
    return;
  }
  switch (h.op()) {
    case INIT:
      Init(*p, peer, h, *payload);
      break;
    case PUSH:
    case PUSH_PULL:
      if (absl::Status s = CheckIncarnation(*p, h); !s.ok()) {
        Answer(peer, h, s);
      } else if (RoundBased(config_)) {
        PushSync(*p, peer, h, payload, /*answer=*/true, staged);
      } else {
        PushAsync(*p, peer, h, *payload, staged);
      }
      break;
    case PULL:
      PullOrWait(*p, peer, h, h.round());
      break;
    default:
      Answer(peer, h, absl::InvalidArgumentError("unsupported op"));
  }
}

void PartitionEngine::Init(Partition& p, const zmq::message_t& peer, const DataHeader& h,
                           const zmq::message_t& payload) {
  // First INIT wins, and only before any update, so a retried or concurrent
  // INIT never rewinds training. A retry (same values, no update yet) is
  // answered OK; any other INIT is refused with ALREADY_EXISTS, saying why,
  // and changes nothing (never a silent no-op).
  if (p.initialized || p.completed > 0) {
    const bool retry = p.completed == 0 && payload.size() == p.n * sizeof(float) &&
                       std::memcmp(p.weights->data(), payload.data(), payload.size()) == 0;
    if (retry) {
      AnswerWhenConfirmed(p, peer, h, p.sent);
    } else {
      Answer(peer, h, absl::AlreadyExistsError(absl::StrCat(
                          "partition ", p.id, " was initialised already and has taken ", p.completed,
                          " updates (trained, or restored from a checkpoint): INIT sets weights only before the "
                          "first update; its weights are unchanged")));
    }
    return;
  }
  std::memcpy(WritableWeights(p), payload.data(), payload.size());
  if (p.delta_pulls) std::memcpy(p.mirror.data(), payload.data(), payload.size());
  p.initialized = true;
  p.encoded_round = -1;  // a cached encoding of the old weights is stale
  DataHeader update;
  update.set_replica_of(INIT);
  Replicate(p, update, payload.data(), payload.size());
  AnswerWhenConfirmed(p, peer, h, p.sent);
}

void PartitionEngine::PushSync(Partition& p, const zmq::message_t& peer, const DataHeader& h,
                               zmq::message_t* payload, bool answer, bool staged) {
  zmq::message_t none;  // a push with no gradient has no payload frame
  if (payload == nullptr) payload = &none;
  const uint32_t w = h.worker_rank();
  const uint64_t round = h.round();
  if (round < JoinRound(w)) {
    Answer(peer, h, absl::InvalidArgumentError(absl::StrCat("worker ", w, " rejoined the job at round ", JoinRound(w),
                                                            " and pushed round ", round, " of partition ", p.id)));
    return;
  }
  if (round < p.next_round[w]) {
    // A retry of a push already counted: do not apply it twice.
    if (answer) AnswerPush(p, peer, h, round);
    return;
  }
  if (round > p.next_round[w]) {
    Answer(peer, h, absl::InvalidArgumentError(absl::StrCat("worker ", w, " pushed round ", round, " of partition ",
                                                            p.id, " but owes round ", p.next_round[w])));
    return;
  }
  if (round < p.completed) {
    // Owed, but the partition went past it: a worker that rejoined at a
    // round this server learned of too late (Rejoin).
    Answer(peer, h, absl::FailedPreconditionError(absl::StrCat(
                        "worker ", w, " rejoined at round ", JoinRound(w), " but partition ", p.id, " on server ",
                        server_index_, " had completed ", p.completed,
                        " rounds without it when it learned of that: its push of round ", round,
                        " is refused (the worker must rejoin again)")));
    return;
  }
  if (round > p.completed + max_ahead_) {
    Answer(peer, h, absl::ResourceExhaustedError(absl::StrCat("worker ", w, " is more than ", max_ahead_,
                                                              " rounds ahead on partition ", p.id)));
    return;
  }
  if (answer && forwards_pushes_ && !p.backups.empty()) {
    ForwardPush(p, h, *payload);
    staged = false;  // a sink that answers at once could have run a round meanwhile: copy again
  }
  if (round > p.completed) {
    // SSP answers at once what the staleness bound allows; sync answers
    // when the push is replayed into its round. A push replayed here
    // unanswered (`answer` false) was answered, or is answered with its
    // retry, already.
    const bool early = answer && answer_staleness_ > 0;
    p.ahead.push_back(
        ParkedPush{zmq::message_t(peer.data(), peer.size()), h, std::move(*payload), early || !answer});
    p.next_round[w] = round + 1;
    if (early) AnswerPush(p, peer, h, round);
    return;
  }
  const size_t bytes = payload->size();  // a raw deterministic payload is moved away
  zmq::message_t kept;
  if (forwards_pushes_) kept.copy(*payload);  // shares the bytes: nothing changes them
  if (h.no_gradient()) {
    p.no_gradient[w] = true;
  } else if (absl::Status s = Accumulate(p, w, round, payload, staged); !s.ok()) {
    Answer(peer, h, s);  // not counted: the worker may send it again
    return;
  } else {
    ++p.gradients;
    p.round_staleness += MeasureStaleness(p, h, round, 1.0);
  }
  if (forwards_counted_) ForwardCounted(p, h, *payload, bytes);
  if (forwards_pushes_) p.open_pushes.push_back(ParkedPush{zmq::message_t(), h, std::move(kept), true});
  p.next_round[w] = round + 1;
  p.contributed[w] = true;
  ++p.arrivals;
  // The round first: a push that completes it is answered with it.
  if (Settled(p) && RoundComplete(p)) CompleteRound(p);
  if (answer) AnswerPush(p, peer, h, round);
}

void PartitionEngine::AnswerPush(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t round) {
  // Replicated, a push is acknowledged once its round is on every copy (a
  // counted push could otherwise die with the primary): so with replication
  // 1 while a primary move gives the partition a copy that a failover would
  // promote.
  if (h.op() != PUSH_PULL && !replicated_ && p.backups.empty()) {
    Answer(peer, h, absl::OkStatus());
    return;
  }
  const uint64_t needed = round + 1 - std::min<uint64_t>(round + 1, answer_staleness_);
  if (forwards_pushes_ && needed <= p.completed) {
    // Not before the backups hold this push (and the rounds it may see).
    AnswerWhenConfirmed(p, peer, h, p.sent);
    return;
  }
  PullOrWait(p, peer, h, needed);
}

double PartitionEngine::MeasureStaleness(Partition& p, const DataHeader& h, uint64_t applied,
                                         double updates_per_round) {
  if (!h.has_based_on() || h.based_on() > applied) return 0;
  const double tau = static_cast<double>(applied - h.based_on()) / updates_per_round;
  ++stats_.stale_gradients;
  stats_.staleness_sum += tau;
  stats_.staleness_max = std::max(stats_.staleness_max, tau);
  ++p.stale_gradients;
  p.staleness_sum += tau;
  p.staleness_max = std::max(p.staleness_max, tau);
  return tau;
}

float PartitionEngine::StalenessLrScale(double tau) const {
  if (!config_.staleness_aware_lr() || tau <= 1.0) return 1.0f;
  return static_cast<float>(1.0 / tau);
}

absl::Status PartitionEngine::Accumulate(Partition& p, uint32_t w, uint64_t round, zmq::message_t* payload,
                                         bool staged) {
  const compression::Codec* codec = PushCodec(p, round).codec;
  const float* g = payload->data<float>();
  if (codec == nullptr) {
    if (config_.deterministic()) {
      p.held[w] = std::move(*payload);  // kept as received: no copy
    } else if (p.gradients == 0) {
      p.first.copy(*payload);  // shares the bytes: nothing changes them
    } else if (p.gradients == 1 && HoldsFirstGradient(p)) {
      // Summed with the first already, by the pass that checked it, unless
      // it was replayed or forwarded since.
      if (!staged) (void)SumAndCheckFinite(StartSum(p), p.first.data<float>(), g, p.n);
      p.first.rebuild();
    } else {
      AddInto(p.acc->data(), g, p.n);
    }
    return absl::OkStatus();
  }
  const uint64_t seed = compression::CodecSeed(p.id, round);
  auto bytes = absl::MakeConstSpan(payload->data<uint8_t>(), payload->size());
  if (config_.deterministic()) {
    // Each rank's gradient has its own buffer: check it before it counts.
    absl::Status s = codec->Decode(bytes, seed, absl::MakeSpan(p.decoded[w]));
    if (s.ok() && config_.reject_non_finite()) {
      DataHeader from;
      from.set_worker_rank(w);
      s = CheckFinite(p, from, p.decoded[w].data());
    }
    return s;
  }
  if (!p.acc_encoded.empty() && codec == p.codecs.push.get()) {
    // Summable codec: aggregate in the compressed domain, decode once.
    if (payload->size() != p.acc_encoded.size() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("compressed payload of ", payload->size(), " bytes, expected ",
                                                     p.acc_encoded.size() * sizeof(float)));
    }
    if (p.gradients == 0) {
      std::memcpy(p.acc_encoded.data(), g, payload->size());
    } else {
      AddInto(p.acc_encoded.data(), g, p.acc_encoded.size());
    }
    return absl::OkStatus();
  }
  return p.gradients == 0 ? codec->Decode(bytes, seed, absl::MakeSpan(StartSum(p), p.n))
                         : codec->DecodeAdd(bytes, seed, absl::MakeSpan(p.acc->data(), p.n));
}

bool PartitionEngine::HoldsFirstGradient(const Partition& p) const {
  return !config_.deterministic() && PushCodec(p, p.completed).codec == nullptr &&
         p.first.size() == p.n * sizeof(float);
}

bool PartitionEngine::BatchStartsWithHeldPush(const Partition& p) {
  return p.batch_count == 1 && p.first.size() == p.n * sizeof(float);
}

uint64_t PartitionEngine::ReplicateFirst(Partition& p, DataHeader h) {
  return Replicate(p, std::move(h), p.first.size(), std::nullopt, [&p] {
    zmq::message_t shared;
    shared.copy(p.first);  // the same bytes, referenced once more
    return shared;
  });
}

float* PartitionEngine::StartSum(Partition& p) {
  if (!p.acc->unique()) p.acc.reset(SharedBuffer::Create(p.n));
  return p.acc->data();
}

// Leaves the round's gradient sum in p.acc, in rank order when deterministic.
void PartitionEngine::SumRound(Partition& p) {
  const uint32_t workers = config_.num_workers();
  const compression::Codec* codec = PushCodec(p, p.completed).codec;
  const bool raw = codec == nullptr;
  if (config_.deterministic()) {
    auto rank = [&](uint32_t w) { return raw ? p.held[w].data<float>() : p.decoded[w].data(); };
    bool first = true;
    for (uint32_t w = 0; w < workers; ++w) {
      // Removed before pushing this round, not rejoined yet, or no gradient.
      if (!Contributed(p, w) || p.no_gradient[w]) continue;
      if (first) {
        std::memcpy(StartSum(p), rank(w), p.n * sizeof(float));
        first = false;
      } else {
        AddInto(p.acc->data(), rank(w), p.n);
      }
    }
    for (auto& m : p.held) m.rebuild();  // release the gradients
  } else if (!p.acc_encoded.empty() && codec == p.codecs.push.get()) {
    auto bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(p.acc_encoded.data()),
                                     p.acc_encoded.size() * sizeof(float));
    absl::Status s =
        p.codecs.push->Decode(bytes, compression::CodecSeed(p.id, p.completed), absl::MakeSpan(StartSum(p), p.n));
    if (!s.ok()) LOG(ERROR) << "partition " << p.id << ": decoding the summed payloads: " << s;
  }
}

void PartitionEngine::CompleteRound(Partition& p) {
  // The mean over the workers that are in: all W, or fewer once a worker
  // was removed from the job; one that pushed no gradient counts as a zero.
  p.contributors = p.arrivals;
  if (p.gradients > 0) SumRound(p);
  // A round of one gradient is applied (and replicated) from the message
  // itself: the sum is never copied.
  const bool first_only = p.gradients == 1 && HoldsFirstGradient(p);
  // Sent before applying here, so this copy's optimizer pass overlaps the
  // transfer and the backups' own pass.
  // Staleness-aware: the round's rate divided by its gradients' mean
  // staleness (1 in sync, where every gradient saw the round before).
  p.lr_scale = StalenessLrScale(p.round_staleness / std::max<uint32_t>(p.gradients, 1));
  DataHeader update;
  update.set_replica_of(PUSH);
  update.set_round(p.completed);
  update.set_contributors(p.contributors);
  update.set_lr_scale(p.lr_scale);
  std::string round_workers((p.contributed.size() + 7) / 8, '\0');
  std::vector<uint32_t> absent;
  for (uint32_t w = 0; w < p.contributed.size(); ++w) {
    if (!p.contributed[w]) {
      absent.push_back(w);
      continue;
    }
    round_workers[w / 8] = static_cast<char>(round_workers[w / 8] | (1 << (w % 8)));
    ++p.applied_by[w];
  }
  // The shorter (a rank below 2^21 takes at most 3 bytes): a header holds
  // at most kMaxHeaderBytes, which a bitmap of over 32,000 workers exceeds.
  if (absent.size() * 3 < round_workers.size()) {
    update.mutable_round_absent_workers()->Add(absent.begin(), absent.end());
  } else {
    update.set_round_workers(std::move(round_workers));
  }
  uint64_t sequence;
  const bool skip = p.gradients == 0;  // every push without one (a frozen parameter)
  if (skip) {
    update.set_no_gradient(true);
    sequence = Replicate(p, update, nullptr, 0);
  } else if (p.forwarding_round && p.counted_order.size() == p.contributors) {
    // The backups hold this round's pushes: they sum them as this copy did.
    for (uint32_t w : p.counted_order) update.add_summed_workers(w);
    sequence = Replicate(p, update, nullptr, 0);
  } else if (first_only) {
    sequence = ReplicateFirst(p, update);
  } else {
    sequence = Replicate(p, update, *p.acc);
  }
  if (skip) {
    SkipRound(p);
  } else {
    ApplyRound(p, first_only ? p.first.data<float>() : nullptr);
  }
  p.first.rebuild();
  MaybeCheckpoint(p);
  if (sequence > 0) return;  // FinishRound once confirmed
  FinishRound(p);
}

void PartitionEngine::ApplyRound(Partition& p, const float* sum) {
  if (sum_only_ && sum == nullptr) {
    // Workers run the optimizer; the server keeps the sum for their pulls:
    // this round's sum becomes the aggregate (StartSum replaces the old one
    // once it is written over, if answers still hold it).
    std::swap(p.aggregate, p.acc);
  } else if (sum_only_) {
    if (!p.aggregate->unique()) p.aggregate.reset(SharedBuffer::Create(p.n));
    std::memcpy(p.aggregate->data(), sum, p.n * sizeof(float));
  } else {
    if (sum == nullptr) sum = p.acc->data();
    optimizer_->Apply(p.completed, 1.0f / static_cast<float>(p.contributors), sum, WritableWeights(p), p.state.data(),
                      p.n, p.lr_scale, p.skipped);
  }
  ++stats_.updates;
  p.last_skipped = false;
  EndRound(p);
}

void PartitionEngine::SkipRound(Partition& p) {
  // Weights, optimizer state and (sum only) the last aggregate stay as they
  // are; answers of this round say it applied nothing.
  ++p.skipped;
  p.last_skipped = true;
  EndRound(p);
}

void PartitionEngine::EndRound(Partition& p) {
  ++p.completed;
  p.arrivals = 0;
  p.gradients = 0;
  p.round_staleness = 0;
  std::fill(p.contributed.begin(), p.contributed.end(), false);
  std::fill(p.no_gradient.begin(), p.no_gradient.end(), false);
  p.forwarding_round = false;
  p.counted_order.clear();
  p.open_pushes.clear();
  // A round with no gradient has no aggregate and no weight delta to encode
  // (its answers carry none): its workers skipped with plain pushes, which
  // no weights answer, so a delta encoded now (what quantisation dropped
  // from the round before) would enter the mirror and reach no worker. It
  // goes out with the next round that steps.
  if (p.codecs.pull != nullptr && RoundBased(config_) && !(p.last_skipped && (sum_only_ || p.delta_pulls))) {
    // Every copy encodes each round's answer once, right after the round, so
    // error feedback and the weight-delta mirror agree on every copy. With
    // replication 1 too: a primary move gives the partition a copy that
    // becomes its primary, and a snapshot must find the last round encoded.
    DataHeader scratch;
    (void)AnswerPayload(p, &scratch);
  }
}

void PartitionEngine::FinishRound(Partition& p) {
  // Answer the pulls this round satisfies; keep the rest in order.
  std::vector<Waiter> still;
  for (Waiter& waiter : p.waiting) {
    if (waiter.header.round() <= p.completed) {
      AnswerWeights(p, waiter.peer, waiter.header);
    } else {
      still.push_back(std::move(waiter));
    }
  }
  p.waiting = std::move(still);
  // Replay pushes that were ahead by one round. One of a round completed
  // meanwhile (a round replayed here completed, and its FinishRound ran
  // inside this one, without a worker the rounds no longer wait for) is
  // replayed too: PushSync refuses it or finds it counted, rather than
  // leave it parked for ever (and in every later snapshot).
  std::vector<ParkedPush> ahead = std::move(p.ahead);
  p.ahead.clear();
  for (ParkedPush& push : ahead) {
    if (push.header.round() <= p.completed) {
      // Count it as a push of the current round, then restore what the
      // worker owes: it may have parked later rounds too.
      const uint32_t w = push.header.worker_rank();
      const uint64_t owed = p.next_round[w];
      p.next_round[w] = push.header.round();
      PushSync(p, push.peer, push.header, &push.payload, /*answer=*/!push.answered);
      p.next_round[w] = std::max(p.next_round[w], owed);
    } else {
      p.ahead.push_back(std::move(push));
    }
  }
  // Pushes of the next round that arrived while this one was being confirmed.
  if (Settled(p) && RoundComplete(p)) CompleteRound(p);
}

void PartitionEngine::PushAsync(Partition& p, const zmq::message_t& peer, const DataHeader& h,
                                zmq::message_t& payload, bool staged) {
  const uint32_t w = h.worker_rank();
  if (h.request_id() <= p.last_request[w]) {
    // A retry of a push taken already: answer without applying it twice,
    // after what was sent before it (or with the batch that holds it).
    if (bounded_) RecordClock(p, h);  // a promoted copy learns the pace from retries too
    if (p.batch_count > 0) {
      p.batch_answers.push_back(Waiter{zmq::message_t(peer.data(), peer.size()), h});
    } else {
      AnswerBounded(p, peer, h, p.sent);
    }
    return;
  }
  const float* g = payload.data<float>();
  if (const compression::Codec* codec = PushCodec(p, h.round()).codec; codec != nullptr) {
    absl::Status s = codec->Decode(absl::MakeConstSpan(payload.data<uint8_t>(), payload.size()),
                                   compression::CodecSeed(p.id, h.round()), absl::MakeSpan(p.scratch));
    if (s.ok() && config_.reject_non_finite()) s = CheckFinite(p, h, p.scratch.data());
    if (!s.ok()) {
      Answer(peer, h, s);
      return;
    }
    g = p.scratch.data();
  }
  if (p.batch_count == 0) {
    p.first.rebuild();
    if (g == payload.data<float>()) {
      p.first.copy(payload);  // raw: held as received, shares the bytes
    } else {
      p.batch_sum.resize(p.n);
      std::memcpy(p.batch_sum.data(), g, p.n * sizeof(float));
    }
  } else if (p.batch_count == 1 && BatchStartsWithHeldPush(p)) {
    // Summed with the first already, by the pass that checked it, unless it
    // was decoded (a codec's payload).
    if (!staged) {
      p.batch_sum.resize(p.n);
      (void)SumAndCheckFinite(p.batch_sum.data(), p.first.data<float>(), g, p.n);
    }
    p.first.rebuild();
  } else {
    AddInto(p.batch_sum.data(), g, p.n);
  }
  ++p.batch_count;
  if (bounded_) RecordClock(p, h);  // answered only once the batch is applied
  // Staleness in rounds: W pushes make a round, as for the schedule.
  p.batch_staleness += MeasureStaleness(p, h, p.completed, std::max<uint32_t>(config_.num_workers(), 1));
  p.batch_ids.emplace_back(w, h.request_id());
  p.last_request[w] = h.request_id();
  p.batch_answers.push_back(Waiter{zmq::message_t(peer.data(), peer.size()), h});
  if (!batching_ || p.batch_count >= std::min(config_.num_workers(), kMaxBatchPushes)) ApplyAsyncBatch(p);
}

void PartitionEngine::ApplyAsyncBatch(Partition& p) {
  const uint32_t k = p.batch_count;
  const float lr_scale = static_cast<float>(k) * StalenessLrScale(p.batch_staleness / k);
  DataHeader update;  // sent first: the transfer overlaps the apply below
  update.set_replica_of(PUSH);
  update.set_round(p.completed);
  update.set_contributors(k);
  update.set_lr_scale(lr_scale);
  for (const auto& [w, id] : p.batch_ids) {
    update.add_batch_workers(w);
    update.add_batch_request_ids(id);
  }
  // A batch of one raw push is applied, and sent to the backups, from the
  // message itself.
  const bool held = BatchStartsWithHeldPush(p);
  const uint64_t sequence = std::max(
      p.sent, held ? ReplicateFirst(p, update) : Replicate(p, update, p.batch_sum.data(), p.n * sizeof(float)));
  // k = 1: grad_scale and lr_scale exactly those of a single push.
  optimizer_->Apply(p.completed, 1.0f / static_cast<float>(k), held ? p.first.data<float>() : p.batch_sum.data(),
                    WritableWeights(p), p.state.data(), p.n, lr_scale);
  p.first.rebuild();
  for (const auto& [w, id] : p.batch_ids) {
    ++p.applied_by[w];
    p.applied_digest[w] += PushDigest(id);
  }
  p.completed += k;
  ++stats_.updates;
  p.batch_count = 0;
  p.batch_staleness = 0;
  p.batch_ids.clear();
  std::vector<Waiter> answers = std::move(p.batch_answers);
  p.batch_answers.clear();
  for (Waiter& a : answers) AnswerBounded(p, a.peer, a.header, sequence);
  if (bounded_) ReleaseBounded(p);
}

void PartitionEngine::EndBatch() {
  batching_ = false;
  for (auto& [id, p] : partitions_) {
    if (p->batch_count > 0) ApplyAsyncBatch(*p);
  }
  if (!handing_off_.empty()) ProgressHandoffs();
}

void PartitionEngine::PullOrWait(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t round) {
  // The last round is visible once every backup has it.
  const uint64_t visible = Settled(p) || p.completed == 0 ? p.completed : p.completed - 1;
  if (!RoundBased(config_) || round <= visible) {
    AnswerWeights(p, peer, h);
    return;
  }
  // A rejoined worker's first pull waits for the round before its join
  // round, however far ahead that is (one waiter per partition).
  const bool joining = round > 0 && round == JoinRound(h.worker_rank());
  if (round > p.completed + max_ahead_ && !joining) {
    Answer(peer, h, absl::InvalidArgumentError(absl::StrCat("pull waits for round ", round, " of partition ", p.id,
                                                            " which has completed ", p.completed)));
    return;
  }
  p.waiting.push_back(Waiter{zmq::message_t(peer.data(), peer.size()), h});
  p.waiting.back().header.set_round(round);
}

float* PartitionEngine::WritableWeights(Partition& p) {
  // Copy on write: an earlier answer may still be on the wire (zero-copy).
  if (!p.weights->unique()) {
    SharedBufferPtr fresh(SharedBuffer::Create(p.n));
    std::memcpy(fresh->data(), p.weights->data(), p.weights->bytes());
    p.weights = std::move(fresh);
  }
  return p.weights->data();
}

void PartitionEngine::Answer(const zmq::message_t& peer, const DataHeader& request, const absl::Status& status) {
  if (!status.ok()) {
    ++stats_.errors;
    ++stats_.errors_by_code[StatSlot(static_cast<int>(status.code()), stats_.errors_by_code.size(), 2)];
    VLOG(1) << "request " << request.request_id() << " from worker " << request.worker_rank() << ": " << status;
  }
  DataHeader reply;
  reply.set_op(RESPONSE);
  reply.set_request_id(request.request_id());
  reply.set_partition_id(request.partition_id());
  reply.set_server_epoch(epoch_);
  SetResponseStatus(status, &reply);
  sink_(peer, reply, nullptr);
}

void PartitionEngine::AnswerWeights(Partition& p, const zmq::message_t& peer, const DataHeader& request) {
  if (request.op() == PUSH || request.op() == INIT) {  // held until confirmed: an ack, no weights
    Answer(peer, request, absl::OkStatus());
    return;
  }
  DataHeader reply;
  reply.set_op(RESPONSE);
  reply.set_request_id(request.request_id());
  reply.set_partition_id(p.id);
  reply.set_server_epoch(epoch_);
  reply.set_completed_rounds(p.completed);
  if (sum_only_) reply.set_contributors(p.contributors);
  reply.set_num_elements(p.n);
  reply.set_dtype(FLOAT32);
  if (p.last_skipped && RoundBased(config_)) {
    reply.set_no_gradient(true);
    if ((sum_only_ || p.delta_pulls) && request.op() == PUSH_PULL) {
      sink_(peer, reply, nullptr);  // no aggregate or delta: the workers apply no step
      return;
    }
  }
  // Sum only: a plain PULL returns the weights the server holds (the initial
  // ones); a PUSH_PULL returns the aggregate of the round it completed.
  // Weight deltas: a plain PULL returns the whole weights, raw.
  if ((sum_only_ || p.delta_pulls) && request.op() == PULL) {
    zmq::message_t payload = p.weights->ZeroCopyMessage();
    stats_.bytes_out += payload.size();
    sink_(peer, reply, &payload);
    return;
  }
  absl::StatusOr<zmq::message_t> payload = AnswerPayload(p, &reply);
  if (!payload.ok()) {
    Answer(peer, request, payload.status());
    return;
  }
  stats_.bytes_out += payload->size();
  sink_(peer, reply, &*payload);
}

absl::StatusOr<zmq::message_t> PartitionEngine::AnswerPayload(Partition& p, DataHeader* reply) {
  SharedBuffer& source = sum_only_ ? *p.aggregate : *p.weights;
  // The aggregate of a warm-up round goes back raw or in the warm-up codec.
  const compression::WireCodec wire =
      sum_only_ && p.completed > 0
          ? compression::RoundCodec(config_, p.codecs, compression::Direction::kAggregate, p.completed - 1)
          : compression::WireCodec{p.codecs.pull.get(), p.codecs.pull_spec};
  const compression::Codec* codec = wire.codec;
  if (codec == nullptr) return source.ZeroCopyMessage();
  reply->set_codec(wire.spec);
  // Every worker pulls the same round: encode once per round, send the same bytes.
  if (p.encoded_round != static_cast<int64_t>(p.completed) || !RoundBased(config_)) {
    // Warm-up rounds keep no error feedback, as raw ones.
    auto feedback = codec == p.codecs.pull.get() ? pull_feedback_.find(wire.spec) : pull_feedback_.end();
    const size_t max_bytes = feedback != pull_feedback_.end() ? feedback->second->MaxEncodedBytes(p.n)
                                                              : codec->EncodedBytes(p.n);
    if (!p.encoded || !p.encoded->unique() || p.encoded->bytes() < max_bytes) {
      p.encoded.reset(SharedBuffer::Create((max_bytes + sizeof(float) - 1) / sizeof(float)));
    }
    const uint64_t seed = compression::CodecSeed(p.id, p.completed);
    auto in = absl::MakeConstSpan(source.data(), p.n);
    if (p.delta_pulls) {
      // The change since what the workers hold; what quantisation drops stays
      // in (weights - mirror) and goes out with the next round.
      for (size_t i = 0; i < p.n; ++i) p.delta[i] = source.data()[i] - p.mirror[i];
      in = absl::MakeConstSpan(p.delta);
    }
    // A diverged job (Inf/NaN weights) fails here, and says so.
    auto cannot_send = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat("partition ", p.id, ": the weight change cannot be sent as ",
                                              wire.spec, " (non-finite weights?): ", why));
    };
    auto out = absl::MakeSpan(p.encoded->byte_data(), max_bytes);
    auto written = feedback != pull_feedback_.end() ? feedback->second->Encode(p.id, in, seed, out)
                                                    : codec->Encode(in, seed, out);
    if (!written.ok()) return cannot_send(written.status().message());
    if (p.delta_pulls) {
      // The workers add the decoded delta to their copy: so does the mirror.
      absl::Status s = codec->DecodeAdd(absl::MakeConstSpan(p.encoded->byte_data(), *written), seed,
                                        absl::MakeSpan(p.mirror));
      if (!s.ok()) return cannot_send(s.message());
    }
    p.encoded_bytes = *written;
    p.encoded_round = static_cast<int64_t>(p.completed);
  }
  return p.encoded->ZeroCopyMessage(p.encoded_bytes);
}

void PartitionEngine::FailWaiting(const absl::Status& status) {
  for (Deferred& d : deferred_) Answer(d.peer, d.header, status);
  deferred_.clear();
  for (auto& [id, p] : partitions_) {
    for (Waiter& waiter : p->waiting) Answer(waiter.peer, waiter.header, status);
    for (Waiter& waiter : p->unconfirmed) Answer(waiter.peer, waiter.header, status);
    for (ParkedPush& push : p->ahead) Answer(push.peer, push.header, status);
    for (Waiter& held : p->bounded) Answer(held.peer, held.header, status);
    p->bounded.clear();
    for (Deferred& held : p->handoff_held) Answer(held.peer, held.header, status);
    p->waiting.clear();
    p->unconfirmed.clear();
    p->ahead.clear();
    p->handoff_held.clear();
  }
}

void PartitionEngine::RecordClock(Partition& p, const DataHeader& h) {
  uint64_t& clock = p.clock[h.worker_rank()];
  clock = std::max(clock, h.round() + 1);
  // Reported in heartbeats: the round a worker that rejoins starts at (its
  // steps then end with the others').
  max_completed_ = std::max(max_completed_, h.round() + 1);
}

bool PartitionEngine::WithinBound(const Partition& p, const DataHeader& h) const {
  if (h.op() != PUSH && h.op() != PUSH_PULL) return true;
  const uint32_t w = h.worker_rank();
  const uint64_t needed = h.round() + 1 - std::min<uint64_t>(h.round() + 1, staleness_);
  for (uint32_t v = 0; v < p.clock.size(); ++v) {
    if (v == w || p.clock[v] == 0 || (num_excluded_ > 0 && excluded_[v])) continue;
    if (p.clock[v] < needed) return false;
  }
  return true;
}

void PartitionEngine::AnswerBounded(Partition& p, const zmq::message_t& peer, const DataHeader& h,
                                    uint64_t sequence) {
  if (!bounded_ || WithinBound(p, h)) {
    AnswerWhenConfirmed(p, peer, h, sequence);
    return;
  }
  p.bounded.push_back(Waiter{zmq::message_t(peer.data(), peer.size()), h});
}

void PartitionEngine::ReleaseBounded(Partition& p) {
  if (p.bounded.empty()) return;
  std::vector<Waiter> still;
  for (Waiter& waiter : p.bounded) {
    if (WithinBound(p, waiter.header)) {
      // Its push was sent to the backups before anything now unconfirmed.
      AnswerWhenConfirmed(p, waiter.peer, waiter.header, p.sent);
    } else {
      still.push_back(std::move(waiter));
    }
  }
  p.bounded = std::move(still);
}

}  // namespace shardps
