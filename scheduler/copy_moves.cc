#include "scheduler/copy_moves.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace shardps {
namespace {

bool Holds(const PartitionInfo& p, uint32_t server) {
  return p.server() == server || std::find(p.backups().begin(), p.backups().end(), server) != p.backups().end();
}

uint64_t LargestPartition(const ShardMap& map) {
  uint64_t largest = 0;
  for (const PartitionInfo& p : map.partitions()) largest = std::max(largest, p.num_elements());
  return largest;
}

// The largest backup copy on `donor` that `receiver` may take and whose
// move narrows their gap; ties to the lower partition id.
std::optional<int> BestCopy(const ShardMap& map, const std::set<uint64_t>& fixed, uint32_t donor,
                            uint32_t receiver, uint64_t gap) {
  std::optional<int> best;
  for (int i = 0; i < map.partitions_size(); ++i) {
    const PartitionInfo& p = map.partitions(i);
    if (fixed.contains(p.id()) || p.server() == donor || !Holds(p, donor) || Holds(p, receiver)) continue;
    if (p.num_elements() >= gap) continue;
    if (!best || p.num_elements() > map.partitions(*best).num_elements()) best = i;
  }
  return best;
}

}  // namespace

std::map<uint32_t, uint64_t> ServerLoadsAfterMoves(const ShardMap& map, const std::set<uint32_t>& live) {
  std::map<uint32_t, uint64_t> loads;
  for (uint32_t s : live) loads[s] = 0;
  std::map<uint64_t, uint32_t> leaving;  // partition -> server whose copy moves away
  for (const CopyMove& m : map.moves()) leaving[m.partition()] = m.from();
  for (const PartitionInfo& p : map.partitions()) {
    auto add = [&](uint32_t s) {
      auto it = leaving.find(p.id());
      if (loads.contains(s) && (it == leaving.end() || it->second != s)) loads[s] += p.num_elements();
    };
    add(p.server());
    for (uint32_t b : p.backups()) add(b);
  }
  return loads;
}

bool LoadsBalanced(const ShardMap& map, const std::map<uint32_t, uint64_t>& loads) {
  if (loads.empty()) return true;
  double total = 0;
  for (const auto& [s, load] : loads) total += static_cast<double>(load);
  const double mean = total / static_cast<double>(loads.size());
  const double slack = static_cast<double>(LargestPartition(map));
  for (const auto& [s, load] : loads) {
    if (std::abs(static_cast<double>(load) - mean) > slack) return false;
  }
  return true;
}

std::vector<CopyMove> PlanCopyMoves(const ShardMap& map, const std::set<uint32_t>& live) {
  std::map<uint32_t, uint64_t> loads = ServerLoadsAfterMoves(map, live);
  ShardMap planned = map;  // the copies as the plan leaves them
  std::set<uint64_t> fixed;
  for (const CopyMove& m : map.moves()) fixed.insert(m.partition());
  for (const PartitionInfo& p : map.partitions()) {
    if (!live.contains(p.server())) fixed.insert(p.id());
  }
  std::vector<CopyMove> moves;
  while (!LoadsBalanced(map, loads)) {
    auto lightest = std::min_element(loads.begin(), loads.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
    const uint32_t receiver = lightest->first;
    std::vector<std::pair<uint64_t, uint32_t>> donors;  // (load, server), heaviest first
    for (const auto& [s, load] : loads) {
      if (load > lightest->second) donors.emplace_back(load, s);
    }
    std::sort(donors.begin(), donors.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::optional<CopyMove> move;
    for (const auto& [load, donor] : donors) {
      std::optional<int> i = BestCopy(planned, fixed, donor, receiver, load - loads[receiver]);
      if (!i) continue;
      PartitionInfo* p = planned.mutable_partitions(*i);
      auto* backups = p->mutable_backups();
      std::replace(backups->begin(), backups->end(), donor, receiver);
      move.emplace();
      move->set_partition(p->id());
      move->set_from(donor);
      move->set_to(receiver);
      loads[donor] -= p->num_elements();
      loads[receiver] += p->num_elements();
      fixed.insert(p->id());
      break;
    }
    if (!move) break;  // no backup copy can narrow a gap: as balanced as moving backups gets
    moves.push_back(*move);
  }
  return moves;
}

}  // namespace shardps
