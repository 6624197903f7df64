// ClusterState, balancing half: the live servers' loads (after a server
// joined a running job, or a failover), first the copies they hold, in two
// phases so no partition ever has fewer valid copies than before a move (see
// CopyMove in proto/cluster.proto), then the primaries, each handed off in
// two epochs so no update is lost or applied twice (see Handoff).
#include <algorithm>

#include <glog/logging.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/names.h"
#include "scheduler/cluster_state.h"
#include "scheduler/copy_moves.h"
#include "scheduler/model_limits.h"

namespace shardps {
namespace {

PartitionInfo* FindPartition(ShardMap& map, uint64_t id) {
  for (PartitionInfo& p : *map.mutable_partitions()) {
    if (p.id() == id) return &p;
  }
  return nullptr;
}

// The copies server `index` holds in `map`, and their elements (the epoch
// left for the caller).
DrainResponse CopiesHeld(const ShardMap& map, uint32_t index) {
  DrainResponse held;
  for (const PartitionInfo& p : map.partitions()) {
    if (HoldsCopy(p, index)) {
      held.set_copies(held.copies() + 1);
      held.set_elements(held.elements() + p.num_elements());
    }
  }
  return held;
}

std::string DescribeLoads(const std::map<uint32_t, uint64_t>& loads) {
  return absl::StrJoin(loads, ", ", [](std::string* out, const auto& l) { absl::StrAppend(out, l.first, ":", l.second); });
}

}  // namespace

std::set<uint32_t> ClusterState::LiveServers() const {
  std::set<uint32_t> live;
  for (const auto& [index, node] : servers_) {
    if (!node.dead) live.insert(index);
  }
  return live;
}

std::set<uint32_t> ClusterState::DrainingServers() const {
  std::set<uint32_t> draining;
  for (const ServerInfo& s : map_.servers()) {
    if (s.draining()) draining.insert(s.index());
  }
  return draining;
}

std::set<uint32_t> ClusterState::StayingServers() const {
  std::set<uint32_t> staying = LiveServers();
  for (uint32_t d : DrainingServers()) staying.erase(d);
  return staying;
}

absl::StatusOr<DrainResponse> ClusterState::Drain(uint32_t index) {
  const WriteOnReturn write(this);  // after mu_ is released
  absl::MutexLock lock(&mu_);
  auto node = servers_.find(index);
  if (node == servers_.end()) {
    return absl::NotFoundError(absl::StrCat("there is no server ", index, " in the cluster (",
                                            servers_.size(), " servers registered, indices from 0)"));
  }
  const std::string who = absl::StrCat("server ", index, " (", node->second.address, ")");
  if (map_.partitions_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job has defined no tensors yet, so ", who,
        " holds nothing; stop it instead (SIGTERM): its place is free until the tensors are defined"));
  }
  if (node->second.dead) {
    // A server that left may have been drained, or stopped after the job:
    // then nothing failed over.
    return absl::FailedPreconditionError(absl::StrCat(
        who, node->second.left ? " left the job already (drained or stopped; `shardps status` lists it as left)"
                               : " is dead; its partitions failed over to their backups"));
  }
  if (static_cast<size_t>(map_.left_workers_size()) >= config_.num_workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job is over (every worker left), so ", who, " has nothing to hand on; stop it instead"));
  }
  DrainResponse response = CopiesHeld(map_, index);
  ServerInfo* info = MapServer(index);
  if (info->draining()) {
    response.set_epoch(map_.epoch());
    return response;  // asked again (a retried hook): the same drain
  }
  std::set<uint32_t> staying = StayingServers();
  staying.erase(index);
  const uint32_t copies = EffectiveReplication(config_);
  if (staying.size() < copies) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job keeps ", copies, " copies of each partition (replication), and without ", who, " only ",
        staying.size(), " live servers that are not draining would be left (",
        absl::StrJoin(staying, ", "), "); start another server first"));
  }
  // As far as the servers said what they can hold (0: not said).
  uint64_t needed = 0, capacity = 0;
  bool all_said = true;
  for (const PartitionInfo& p : map_.partitions()) needed += p.num_elements() * (1 + p.backups_size());
  needed *= ServerBytesPerElement(config_);
  for (uint32_t s : staying) {
    all_said = all_said && servers_[s].memory_bytes > 0;
    capacity += servers_[s].memory_bytes;
  }
  if (all_said && needed > capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's copies need ", needed, " bytes (weights, optimizer state, accumulators), but the ",
        staying.size(), " servers that would be left reported ", capacity, " bytes between them; start another "
        "server first"));
  }
  info->set_draining(true);
  map_.set_epoch(map_.epoch() + 1);
  drain_started_[index] = clock_();
  response.set_epoch(map_.epoch());
  LOG(WARNING) << who << " drains at shard map epoch " << map_.epoch() << ": its " << response.copies()
               << " copies (" << response.elements() << " elements) move to servers " << absl::StrJoin(staying, ", ")
               << " while training goes on (primaries by hand-off); it stops once it holds none";
  Save();
  return response;
}

absl::StatusOr<DrainResponse> ClusterState::CancelDrain(uint32_t index) {
  const WriteOnReturn write(this);  // after mu_ is released
  absl::MutexLock lock(&mu_);
  auto node = servers_.find(index);
  ServerInfo* info = MapServer(index);
  if (node == servers_.end() || info == nullptr) {
    return absl::NotFoundError(absl::StrCat("there is no server ", index, " in the cluster (",
                                            servers_.size(), " servers registered, indices from 0)"));
  }
  const std::string who = absl::StrCat("server ", index, " (", node->second.address, ")");
  if (node->second.dead) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, node->second.left ? " left the job already" : " is dead", "; there is no drain to cancel"));
  }
  if (!info->draining()) return absl::FailedPreconditionError(absl::StrCat(who, " is not draining"));
  DrainResponse response = CopiesHeld(map_, index);
  if (response.copies() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " has handed on every copy it held and stops (or has stopped) by itself; start it again to have "
        "it back, and the servers are balanced again"));
  }
  info->clear_draining();
  drain_started_.erase(index);
  // Its moves not yet handing a primary off are undone: their extra copies
  // (listed last, never promoted) are dropped, and the copy here stays. A
  // hand-off under way finishes, as does its move, and so does a move whose
  // hand-off is made (its new copy is the primary: undone, it would leave
  // the partition a copy more than replication for good).
  int undone = 0;
  auto* moves = map_.mutable_moves();
  for (int i = 0; i < moves->size();) {
    const CopyMove& m = moves->Get(i);
    PartitionInfo* p = FindPartition(map_, m.partition());
    const bool handing = absl::c_any_of(map_.handoffs(), [&m](const Handoff& h) { return h.partition() == m.partition(); });
    const bool handed = m.primary() && p != nullptr && p->server() == m.to();
    if (m.from() != index || handing || handed) {
      ++i;
      continue;
    }
    if (p != nullptr) {
      auto* backups = p->mutable_backups();
      backups->erase(std::remove(backups->begin(), backups->end(), m.to()), backups->end());
      p->mutable_listed_at()->erase(m.to());
    }
    moves->DeleteSubrange(i, 1);
    ++undone;
  }
  if (map_.moves_size() == 0) moves_planned_ = 0;  // the next plan starts its own count
  map_.set_epoch(map_.epoch() + 1);
  response.set_epoch(map_.epoch());
  LOG(WARNING) << "the drain of " << who << " is cancelled at shard map epoch " << map_.epoch() << ": it serves on "
               << "with the " << response.copies() << " copies it still holds (" << response.elements()
               << " elements); " << undone << " moves from it undone, " << moves->size()
               << " under way finish (hand-offs), then the servers are balanced again";
  Save();
  return response;
}

bool ClusterState::ReportedSynced(uint32_t server, const PartitionInfo& p) const {
  auto it = servers_.find(server);
  if (it == servers_.end()) return false;
  // A report from before the map that last gave the server its copy is of
  // the copy it held before (PartitionInfo.listed_at).
  auto listed = p.listed_at().find(server);
  if (listed != p.listed_at().end() && it->second.applied_epoch < listed->second) return false;
  const std::vector<uint64_t>& synced = it->second.synced_copies;
  return std::binary_search(synced.begin(), synced.end(), p.id());
}

bool ClusterState::LiveCopiesSynced() const {
  auto synced_on = [&](uint32_t server, const PartitionInfo& partition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = servers_.find(server);
    if (it == servers_.end() || it->second.dead) return true;  // not live: the failover's concern
    return ReportedSynced(server, partition);
  };
  for (const PartitionInfo& p : map_.partitions()) {
    if (!synced_on(p.server(), p)) return false;
    for (uint32_t b : p.backups()) {
      if (!synced_on(b, p)) return false;
    }
  }
  return true;
}

void ClusterState::MaybeStartCopyMoves() {
  // One plan at a time, judged once per epoch, on servers that all serve it
  // with every copy synced: in the middle of a failover the re-created
  // copies are still on their way, and moves would only compete with them.
  if (map_.partitions_size() == 0 || map_.moves_size() > 0 || map_.handoffs_size() > 0 ||
      balance_checked_epoch_ == map_.epoch()) {
    return;
  }
  if (!ServersServe(map_.epoch()) || !LiveCopiesSynced()) return;
  balance_checked_epoch_ = map_.epoch();
  // Draining servers give their copies away first, and are given none.
  const std::set<uint32_t> live = StayingServers();
  const std::set<uint32_t> draining = DrainingServers();
  // No server is given a copy it reported no memory for (it would die
  // receiving it).
  const ServerRoom room = ServerRooms();
  std::vector<CopyMove> moves = PlanDrainMoves(map_, live, draining, room);
  const bool draining_moves = !moves.empty();
  drain_waits_.clear();
  if (moves.empty() && !draining.empty()) {
    const auto left = absl::c_count_if(map_.partitions(), [&draining](const PartitionInfo& p) {
      return absl::c_any_of(draining, [&p](uint32_t s) { return HoldsCopy(p, s); });
    });
    // Said by `shardps drain` too: the log alone left its caller with a
    // count of copies that never fell, and no reason (review22).
    if (left > 0) {
      drain_waits_ = absl::StrCat("the drain of server ", absl::StrJoin(draining, ", "), " waits at shard map epoch ",
                                  map_.epoch(), ": ", Counted(left, "copy it holds fits", "copies it holds fit"),
                                  " on no staying server without one (the memory each reported); start another "
                                  "server");
      LOG(WARNING) << drain_waits_;
    }
  }
  if (moves.empty()) moves = PlanCopyMoves(map_, live, room);
  if (moves.empty()) {
    MaybeStartHandoffs(live);  // the copies are as balanced as they get: now the primaries
    return;
  }
  if (moves_planned_ == 0) {
    moves_since_join_ = joined_at_ != absl::InfinitePast();
    moves_since_ = moves_since_join_ ? joined_at_ : clock_();
    moves_resumed_ = false;
  }
  joined_at_ = absl::InfinitePast();
  map_.set_epoch(map_.epoch() + 1);
  for (CopyMove move : moves) {
    PartitionInfo* p = FindPartition(map_, move.partition());
    p->add_backups(move.to());  // last: never promoted before it is synced
    (*p->mutable_listed_at())[move.to()] = map_.epoch();
    move.set_epoch(map_.epoch());
    *map_.add_moves() = move;
  }
  moves_planned_ += static_cast<int>(moves.size());
  moves_planned_total_ += moves.size();
  const auto loads = ServerLoadsAfterMoves(map_, live);
  const auto primaries = absl::c_count_if(moves, [](const CopyMove& m) { return m.primary(); });
  LOG(WARNING) << "copy moves " << (draining_moves ? absl::StrCat("drain server ", absl::StrJoin(draining, ", "))
                                                   : std::string("balance the servers"))
               << ": " << moves.size() << " copies move (extra copies until synced"
               << (primaries > 0 ? absl::StrCat("; ", primaries, " of them primaries, each handed off once synced")
                                 : std::string())
               << ") at shard map epoch " << map_.epoch() << "; elements held per live server once done "
               << DescribeLoads(loads);
  Save();
}

void ClusterState::FinishCopyMoves(const Node& node, const HeartbeatRequest& request) {
  if (map_.moves_size() == 0 || node.role != SERVER) return;
  const uint64_t epoch = map_.epoch() + 1;
  // A few synced copies per report, a few pending moves: a linear find is enough.
  const auto& synced = request.synced_copies();
  std::vector<std::string> done, handing;
  auto* moves = map_.mutable_moves();
  for (int i = 0; i < moves->size();) {
    const CopyMove& m = moves->Get(i);
    // A report from before the epoch that listed the new copy (for a
    // primary move, that made it the primary) says nothing about it (the
    // server may not have created it yet).
    if (m.to() != node.rank || request.applied_epoch() < m.epoch() || std::find(synced.begin(), synced.end(), m.partition()) == synced.end()) {
      ++i;
      continue;
    }
    PartitionInfo* p = FindPartition(map_, m.partition());
    if (m.primary() && p != nullptr && p->server() == m.from()) {
      // The only copy was the primary's: its role goes to the synced new
      // copy first, by a hand-off (the old primary drains, then the roles
      // switch), and the old copy is dropped once the new primary serves.
      const bool under_way = absl::c_any_of(map_.handoffs(), [&m](const Handoff& h) { return h.partition() == m.partition(); });
      if (!under_way && clock_() >= handoffs_retry_at_) {
        Handoff& h = *map_.add_handoffs();
        h.set_partition(m.partition());
        h.set_from(m.from());
        h.set_to(m.to());
        h.set_epoch(epoch);
        handoff_started_[m.partition()] = clock_();
        ++handoffs_planned_total_;  // status counts every hand-off the map lists
        handing.push_back(absl::StrCat(m.partition(), " (", m.from(), "->", m.to(), ")"));
      }
      ++i;
      continue;
    }
    if (p != nullptr && p->server() != m.from()) {
      auto* backups = p->mutable_backups();
      backups->erase(std::remove(backups->begin(), backups->end(), m.from()), backups->end());
    }
    done.push_back(absl::StrCat(m.partition(), " (", m.from(), "->", m.to(), m.primary() ? ", primary" : "", ")"));
    moves->DeleteSubrange(i, 1);
  }
  if (done.empty() && handing.empty()) return;
  map_.set_epoch(epoch);
  if (!handing.empty()) {
    LOG(WARNING) << "copy moves of primaries: partition " << absl::StrJoin(handing, ", ") << " synced on server "
                 << node.rank << ", the primary role is handed off to it at shard map epoch " << epoch
                 << " (the old primary drains first), then the old copy is dropped";
  }
  if (!done.empty()) {
    LOG(WARNING) << "copy moves done: partition " << absl::StrJoin(done, ", ") << " synced on server " << node.rank
                 << ", old copies dropped; shard map epoch " << epoch << "; " << map_.moves_size()
                 << " moves still under way";
  }
  if (map_.moves_size() == 0) {
    const auto loads = ServerLoadsAfterMoves(map_, StayingServers());
    LOG(WARNING) << "servers balanced: " << moves_planned_ << " copy moves in "
                 << absl::FormatDuration(clock_() - moves_since_)
                 << (moves_resumed_      ? " after the scheduler resumed them"
                     : moves_since_join_ ? " after the join"
                                         : " after their plan")
                 << "; elements held per live server "
                 << DescribeLoads(loads) << (LoadsBalanced(map_, loads) ? " (each within" : " (not all within")
                 << " one partition of the mean)";
    moves_planned_ = 0;
  }
  Save();
}

int ClusterState::EndBrokenCopyMoves(uint32_t dead) {
  const int copies = static_cast<int>(EffectiveReplication(config_));
  int ended = 0;
  auto* moves = map_.mutable_moves();
  for (int i = 0; i < moves->size();) {
    const CopyMove& m = moves->Get(i);
    const PartitionInfo* p = FindPartition(map_, m.partition());
    // A backup's move is broken once its old copy became the primary; a
    // primary's once the role went to neither of its copies.
    const bool roles_changed = p != nullptr && (m.primary() ? p->server() != m.from() && p->server() != m.to()
                                                            : p->server() == m.from());
    const bool broken = p == nullptr || m.to() == dead || m.from() == dead || roles_changed ||
                        p->backups_size() + 1 <= copies;
    if (!broken) {
      ++i;
      continue;
    }
    LOG(WARNING) << "copy move of partition " << m.partition() << " from server " << m.from() << " to " << m.to()
                 << " ends with server " << dead << "'s death; its copies stay as they are ("
                 << (p != nullptr ? p->backups_size() + 1 : 0) << " of " << copies << ")";
    moves->DeleteSubrange(i, 1);
    ++ended;
  }
  if (map_.moves_size() == 0) moves_planned_ = 0;
  return ended;
}

void ClusterState::MaybeStartHandoffs(const std::set<uint32_t>& live) {
  if (clock_() < handoffs_retry_at_) {
    balance_checked_epoch_ = 0;  // judged again by a later heartbeat, once the pause is over
    return;
  }
  const std::vector<Handoff> handoffs = PlanHandoffs(map_, live);
  if (handoffs.empty()) return;
  map_.set_epoch(map_.epoch() + 1);
  const absl::Time now = clock_();
  if (handoffs_planned_ == 0) {
    handoffs_since_join_ = last_join_ != absl::InfinitePast();
    handoffs_since_ = handoffs_since_join_ ? last_join_ : now;
    handoffs_resumed_ = false;
  }
  std::vector<std::string> planned;
  for (Handoff h : handoffs) {
    h.set_epoch(map_.epoch());
    *map_.add_handoffs() = h;
    handoff_started_[h.partition()] = now;
    planned.push_back(absl::StrCat(h.partition(), " (", h.from(), "->", h.to(), ")"));
  }
  handoffs_planned_ += static_cast<int>(handoffs.size());
  handoffs_planned_total_ += handoffs.size();
  LOG(WARNING) << "primary hand-offs balance the primaries: partition " << absl::StrJoin(planned, ", ")
               << " at shard map epoch " << map_.epoch() << " (each old primary drains first); primary elements per "
               << "live server once done " << DescribeLoads(PrimaryLoadsAfterHandoffs(map_, live));
  Save();
}

void ClusterState::FinishHandoffs(const Node& node, const HeartbeatRequest& request) {
  if (map_.handoffs_size() == 0 || node.role != SERVER || request.handoffs_done_size() == 0) return;
  const uint64_t epoch = map_.epoch() + 1;
  const absl::Time now = clock_();
  bool changed = false;
  auto* handoffs = map_.mutable_handoffs();
  for (int i = 0; i < handoffs->size();) {
    const Handoff& h = handoffs->Get(i);
    const auto& done = request.handoffs_done();
    auto report = std::find_if(done.begin(), done.end(), [&h](const HandoffDone& d) {
      return d.partition() == h.partition() && d.epoch() == h.epoch();
    });
    if (h.from() != node.rank || request.applied_epoch() < h.epoch() || report == done.end()) {
      ++i;
      continue;
    }
    PartitionInfo* p = FindPartition(map_, h.partition());
    const bool still = p != nullptr && CanHandPrimary(*p, h.from(), h.to());
    const auto started = handoff_started_.find(h.partition());
    const std::string after = started != handoff_started_.end() ? absl::FormatDuration(now - started->second) : "?";
    // A primary move's hand-off (FinishCopyMoves) is part of that move: the
    // move drops the old copy once the new primary serves this epoch.
    auto move = std::find_if(map_.mutable_moves()->begin(), map_.mutable_moves()->end(),
                             [&h](const CopyMove& m) { return IsPrimaryMoveHandoff(m, h); });
    const bool of_move = move != map_.mutable_moves()->end();
    if (still) {
      HandPrimary(*p, h.from(), h.to());  // the old primary takes the new one's place among the backups
      ++handoffs_made_total_;
      if (of_move) {
        move->set_epoch(epoch);
      } else {
        ++handoffs_made_;
      }
      LOG(WARNING) << "primary of partition " << h.partition() << " handed off from server " << h.from() << " to "
                   << h.to() << " at shard map epoch " << epoch << " after " << after << " ("
                   << report->completed() << " updates completed on server " << h.from() << ")";
    } else {
      LOG(WARNING) << "hand-off of partition " << h.partition() << " from server " << h.from() << " to " << h.to()
                   << " ends unmade at shard map epoch " << epoch << ": the roles changed meanwhile";
    }
    handoff_started_.erase(h.partition());
    handoffs->DeleteSubrange(i, 1);
    changed = true;
  }
  if (!changed) return;
  map_.set_epoch(epoch);
  if (map_.handoffs_size() == 0 && handoffs_planned_ > 0) {
    const auto loads = PrimaryLoadsAfterHandoffs(map_, StayingServers());
    const bool balanced = LoadsBalanced(map_, loads);
    LOG(WARNING) << "primaries balanced: " << handoffs_made_ << " of " << handoffs_planned_ << " hand-offs made, "
                 << absl::FormatDuration(now - handoffs_since_)
                 << (handoffs_resumed_      ? " after the scheduler resumed them"
                     : handoffs_since_join_ ? " after the join"
                                            : " after their plan")
                 << "; primary elements per live server " << DescribeLoads(loads)
                 << (balanced ? " (each within" : " (not all within") << " one partition of the mean)";
    handoffs_planned_ = handoffs_made_ = 0;
    // A server that joined meanwhile is still to be given its share: the
    // next plan's time counts from its join.
    if (balanced) last_join_ = absl::InfinitePast();
  }
  Save();
}

int ClusterState::EndBrokenHandoffs(uint32_t dead) {
  int ended = 0;
  auto* handoffs = map_.mutable_handoffs();
  for (int i = 0; i < handoffs->size();) {
    const Handoff& h = handoffs->Get(i);
    if (h.from() != dead && h.to() != dead) {
      ++i;
      continue;
    }
    LOG(WARNING) << "hand-off of partition " << h.partition() << " from server " << h.from() << " to " << h.to()
                 << " ends with server " << dead << "'s death at shard map epoch " << map_.epoch()
                 << (h.to() == dead ? "; its old primary resumes" : "");
    handoff_started_.erase(h.partition());
    handoffs->DeleteSubrange(i, 1);
    ++ended;
  }
  if (map_.handoffs_size() == 0) handoffs_planned_ = handoffs_made_ = 0;
  return ended;
}

int ClusterState::EndLateHandoffs() {
  const absl::Time now = clock_();
  const absl::Duration timeout = absl::Milliseconds(config_.heartbeat_timeout_ms());
  int ended = 0;
  auto* handoffs = map_.mutable_handoffs();
  for (int i = 0; i < handoffs->size();) {
    const Handoff& h = handoffs->Get(i);
    // A restarted scheduler knows no start: it counts from its first check.
    const absl::Time started = handoff_started_.try_emplace(h.partition(), now).first->second;
    if (now - started <= timeout) {
      ++i;
      continue;
    }
    LOG(WARNING) << "hand-off of partition " << h.partition() << " from server " << h.from() << " to " << h.to()
                 << " ends at shard map epoch " << map_.epoch() + 1 << ": not drained within heartbeat_timeout_ms ("
                 << absl::FormatDuration(now - started) << "); server " << h.from()
                 << " stays the primary and replays what it held (no new hand-off for one timeout)";
    handoff_started_.erase(h.partition());
    handoffs->DeleteSubrange(i, 1);
    ++ended;
  }
  if (ended == 0) return 0;
  map_.set_epoch(map_.epoch() + 1);
  // A partition that did not drain (a round held up by a slow worker) would
  // be held again at once: new hand-offs wait one timeout first.
  handoffs_retry_at_ = now + timeout;
  if (map_.handoffs_size() == 0) handoffs_planned_ = handoffs_made_ = 0;
  return ended;
}

}  // namespace shardps
