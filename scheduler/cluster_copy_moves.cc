// ClusterState, copy moves half: balancing the live servers' loads (after a
// server joined a running job, or a failover), in two phases so no partition
// ever has fewer valid copies than before a move (see CopyMove in
// proto/cluster.proto).
#include <algorithm>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "scheduler/cluster_state.h"
#include "scheduler/copy_moves.h"

namespace shardps {
namespace {

PartitionInfo* FindPartition(ShardMap& map, uint64_t id) {
  for (PartitionInfo& p : *map.mutable_partitions()) {
    if (p.id() == id) return &p;
  }
  return nullptr;
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

bool ClusterState::LiveCopiesSynced() const {
  auto synced_on = [&](uint32_t server, uint64_t partition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = servers_.find(server);
    if (it == servers_.end() || it->second.dead) return true;  // not live: the failover's concern
    const std::vector<uint64_t>& synced = it->second.synced_copies;
    return std::binary_search(synced.begin(), synced.end(), partition);
  };
  for (const PartitionInfo& p : map_.partitions()) {
    if (!synced_on(p.server(), p.id())) return false;
    for (uint32_t b : p.backups()) {
      if (!synced_on(b, p.id())) return false;
    }
  }
  return true;
}

void ClusterState::MaybeStartCopyMoves() {
  // One plan at a time, judged once per epoch, on servers that all serve it
  // with every copy synced: in the middle of a failover the re-created
  // copies are still on their way, and moves would only compete with them.
  if (map_.partitions_size() == 0 || map_.moves_size() > 0 || balance_checked_epoch_ == map_.epoch()) return;
  if (!ServersServe(map_.epoch()) || !LiveCopiesSynced()) return;
  balance_checked_epoch_ = map_.epoch();
  const std::set<uint32_t> live = LiveServers();
  const std::vector<CopyMove> moves = PlanCopyMoves(map_, live);
  if (moves.empty()) return;
  if (moves_planned_ == 0) {
    moves_since_join_ = joined_at_ != absl::InfinitePast();
    moves_since_ = moves_since_join_ ? joined_at_ : clock_();
  }
  joined_at_ = absl::InfinitePast();
  map_.set_epoch(map_.epoch() + 1);
  for (CopyMove move : moves) {
    FindPartition(map_, move.partition())->add_backups(move.to());  // last: never promoted before it is synced
    move.set_epoch(map_.epoch());
    *map_.add_moves() = move;
  }
  moves_planned_ += static_cast<int>(moves.size());
  moves_planned_total_ += moves.size();
  const auto loads = ServerLoadsAfterMoves(map_, live);
  LOG(WARNING) << "copy moves balance the servers: " << moves.size() << " backup copies move (extra copies until "
               << "synced) at shard map epoch " << map_.epoch() << "; elements held per live server once done "
               << DescribeLoads(loads);
  Save();
}

void ClusterState::FinishCopyMoves(const Node& node, const HeartbeatRequest& request) {
  if (map_.moves_size() == 0 || node.role != SERVER) return;
  // A few synced copies per report, a few pending moves: a linear find is enough.
  const auto& synced = request.synced_copies();
  std::vector<std::string> done;
  auto* moves = map_.mutable_moves();
  for (int i = 0; i < moves->size();) {
    const CopyMove& m = moves->Get(i);
    // A report from before the epoch that listed the new copy says nothing
    // about it (the server may not have created it yet).
    if (m.to() != node.rank || request.applied_epoch() < m.epoch() || std::find(synced.begin(), synced.end(), m.partition()) == synced.end()) {
      ++i;
      continue;
    }
    if (PartitionInfo* p = FindPartition(map_, m.partition()); p != nullptr && p->server() != m.from()) {
      auto* backups = p->mutable_backups();
      backups->erase(std::remove(backups->begin(), backups->end(), m.from()), backups->end());
    }
    done.push_back(absl::StrCat(m.partition(), " (", m.from(), "->", m.to(), ")"));
    moves->DeleteSubrange(i, 1);
  }
  if (done.empty()) return;
  map_.set_epoch(map_.epoch() + 1);
  LOG(WARNING) << "copy moves done: partition " << absl::StrJoin(done, ", ") << " synced on server " << node.rank
               << ", old copies dropped; shard map epoch " << map_.epoch() << "; " << map_.moves_size()
               << " moves still under way";
  if (map_.moves_size() == 0) {
    const auto loads = ServerLoadsAfterMoves(map_, LiveServers());
    LOG(WARNING) << "servers balanced: " << moves_planned_ << " copy moves in "
                 << absl::FormatDuration(clock_() - moves_since_)
                 << (moves_since_join_ ? " after the join" : " after their plan") << "; elements held per live server "
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
    const bool broken = p == nullptr || m.to() == dead || m.from() == dead || p->server() == m.from() ||
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

}  // namespace shardps
