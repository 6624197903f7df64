#include "scheduler/copy_moves.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

namespace shardps {
namespace {

uint64_t LargestPartition(const ShardMap& map) {
  uint64_t largest = 0;
  for (const PartitionInfo& p : map.partitions()) largest = std::max(largest, p.num_elements());
  return largest;
}

// A step of a greedy plan: partition `index` of the map goes from `donor`
// to `receiver` (a copy, or the primary role).
struct Step {
  int index;
  uint32_t donor, receiver;
};

// May `receiver` take partition p from `donor`?
using Eligible = std::function<bool(const PartitionInfo& p, uint32_t donor, uint32_t receiver)>;

// The largest partition of `donor` that `eligible` lets `receiver` take,
// of at most `limit` elements, and whose move narrows their gap; ties to the
// lower partition id.
std::optional<int> BestPartition(const ShardMap& map, const std::set<uint64_t>& fixed, const Eligible& eligible,
                                 uint32_t donor, uint32_t receiver, uint64_t gap, uint64_t limit) {
  std::optional<int> best;
  for (int i = 0; i < map.partitions_size(); ++i) {
    const PartitionInfo& p = map.partitions(i);
    if (fixed.contains(p.id()) || !eligible(p, donor, receiver) || p.num_elements() >= gap ||
        p.num_elements() > limit) {
      continue;
    }
    if (!best || p.num_elements() > map.partitions(*best).num_elements()) best = i;
  }
  return best;
}

// Whether some server of `loads` has nothing while another has something.
bool AnIdleServer(const std::map<uint32_t, uint64_t>& loads) {
  bool idle = false, busy = false;
  for (const auto& [s, load] : loads) (load == 0 ? idle : busy) = true;
  return idle && busy;
}

// (load, server) pairs.
using Loads = std::vector<std::pair<uint64_t, uint32_t>>;

// The step that gives `receiver` (holding `receiver_load`) a partition from
// the first of `donors` (heaviest first) with an eligible one that narrows
// their gap and fits its room; of donors as loaded as that one, the largest
// such partition.
std::optional<Step> StepTo(const ShardMap& planned, const std::set<uint64_t>& fixed, const Eligible& eligible,
                           const ServerRoom& room, const Loads& donors, uint32_t receiver, uint64_t receiver_load) {
  std::optional<Step> step;
  uint64_t step_load = 0;
  const uint64_t limit = RoomLeft(room, receiver, receiver_load);
  for (const auto& [load, donor] : donors) {
    if (load <= receiver_load || (step && load < step_load)) break;
    std::optional<int> i = BestPartition(planned, fixed, eligible, donor, receiver, load - receiver_load, limit);
    if (!i) continue;
    if (!step || planned.partitions(*i).num_elements() > planned.partitions(step->index).num_elements()) {
      step = Step{*i, donor, receiver};
      step_load = load;
    }
  }
  return step;
}

// Both plans: while some server of `loads` is more than one partition's size
// from the mean, or has nothing at all (one partition larger than the mean
// share would leave a server that joined without a copy), the least loaded
// server that can take one takes, from the most loaded one that has such a
// partition, the largest eligible one whose move narrows the gap between the
// two, and fits the receiver's `room`; `apply` changes `planned`
// accordingly. Every step lowers the sum of squared loads, so the plan ends
// (and no later plan undoes it). A partition moves at most once.
using ApplyStep = std::function<void(PartitionInfo& p, const Step& step)>;
std::vector<Step> BalanceGreedily(ShardMap& planned, std::map<uint32_t, uint64_t> loads, std::set<uint64_t> fixed,
                                  const Eligible& eligible, const ApplyStep& apply, const ServerRoom& room = {}) {
  std::vector<Step> steps;
  while (!LoadsBalanced(planned, loads) || AnIdleServer(loads)) {
    // Receivers lightest first, donors heaviest first, ties to the lower
    // index.
    Loads receivers, donors;
    for (const auto& [s, load] : loads) receivers.emplace_back(load, s);
    donors = receivers;
    std::sort(receivers.begin(), receivers.end());
    std::sort(donors.begin(), donors.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    // The lightest server that can take something (the lightest may hold
    // copies of everything the heavier ones could give).
    std::optional<Step> step;
    for (const auto& [receiver_load, receiver] : receivers) {
      if ((step = StepTo(planned, fixed, eligible, room, donors, receiver, receiver_load))) break;
    }
    if (!step) break;  // nothing can narrow a gap: as balanced as these steps get
    PartitionInfo& p = *planned.mutable_partitions(step->index);
    apply(p, *step);
    loads[step->donor] -= p.num_elements();
    loads[step->receiver] += p.num_elements();
    fixed.insert(p.id());
    steps.push_back(*step);
  }
  return steps;
}

}  // namespace

uint64_t RoomLeft(const ServerRoom& room, uint32_t server, uint64_t load) {
  auto it = room.find(server);
  if (it == room.end() || it->second == 0) return std::numeric_limits<uint64_t>::max();
  return it->second > load ? it->second - load : 0;
}

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

std::vector<CopyMove> PlanCopyMoves(const ShardMap& map, const std::set<uint32_t>& live, const ServerRoom& room) {
  std::set<uint64_t> fixed;
  for (const CopyMove& m : map.moves()) fixed.insert(m.partition());
  for (const PartitionInfo& p : map.partitions()) {
    if (!live.contains(p.server())) fixed.insert(p.id());
  }
  ShardMap planned = map;  // the copies as the plan leaves them
  // A backup of the donor, or its primary where that is the only copy
  // (replication 1): nothing else could move.
  auto copy_of_donor = [](const PartitionInfo& p, uint32_t donor, uint32_t receiver) {
    return HoldsCopy(p, donor) && !HoldsCopy(p, receiver) && (p.server() != donor || p.backups().empty());
  };
  auto move_copy = [](PartitionInfo& p, const Step& step) {
    if (p.server() == step.donor) {
      p.set_server(step.receiver);
    } else {
      std::replace(p.mutable_backups()->begin(), p.mutable_backups()->end(), step.donor, step.receiver);
    }
  };
  std::vector<CopyMove> moves;
  const auto loads = ServerLoadsAfterMoves(map, live);
  for (const Step& step : BalanceGreedily(planned, loads, fixed, copy_of_donor, move_copy, room)) {
    CopyMove& move = moves.emplace_back();
    const PartitionInfo& p = map.partitions(step.index);
    move.set_partition(p.id());
    move.set_from(step.donor);
    move.set_to(step.receiver);
    move.set_primary(p.server() == step.donor);
  }
  return moves;
}

std::vector<CopyMove> PlanDrainMoves(const ShardMap& map, const std::set<uint32_t>& live,
                                     const std::set<uint32_t>& draining, const ServerRoom& room) {
  std::set<uint64_t> moving;
  for (const CopyMove& m : map.moves()) moving.insert(m.partition());
  std::vector<const PartitionInfo*> order;
  for (const PartitionInfo& p : map.partitions()) {
    if (moving.contains(p.id()) || !(live.contains(p.server()) || draining.contains(p.server()))) continue;
    order.push_back(&p);
  }
  std::stable_sort(order.begin(), order.end(), [](const PartitionInfo* a, const PartitionInfo* b) {
    return a->num_elements() > b->num_elements();
  });
  std::map<uint32_t, uint64_t> loads = ServerLoadsAfterMoves(map, live);
  std::vector<CopyMove> moves;
  for (const PartitionInfo* p : order) {
    std::vector<uint32_t> leaving;
    if (draining.contains(p->server())) leaving.push_back(p->server());
    for (uint32_t b : p->backups()) {
      if (draining.contains(b)) leaving.push_back(b);
    }
    // One move per partition and plan (CopyMove is keyed by partition): a
    // second draining copy of it moves in a later plan.
    if (leaving.empty()) continue;
    std::optional<uint32_t> to;
    for (const auto& [s, load] : loads) {
      if (!HoldsCopy(*p, s) && p->num_elements() <= RoomLeft(room, s, load) && (!to || load < loads[*to])) to = s;
    }
    // Every live server holds a copy already (Drain refuses such a
    // cluster), or has no room for one: the copy stays where it is.
    if (!to) continue;
    CopyMove& move = moves.emplace_back();
    move.set_partition(p->id());
    move.set_from(leaving.front());
    move.set_to(*to);
    move.set_primary(p->server() == leaving.front());
    loads[*to] += p->num_elements();
  }
  return moves;
}

bool IsPrimaryMoveHandoff(const CopyMove& m, const Handoff& h) {
  return m.primary() && m.partition() == h.partition() && m.from() == h.from() && m.to() == h.to();
}

bool CanHandPrimary(const PartitionInfo& p, uint32_t from, uint32_t to) {
  return p.server() == from && to != from && HoldsCopy(p, to);
}

void HandPrimary(PartitionInfo& p, uint32_t from, uint32_t to) {
  std::replace(p.mutable_backups()->begin(), p.mutable_backups()->end(), to, from);
  p.set_server(to);
}

std::map<uint32_t, uint64_t> PrimaryLoadsAfterHandoffs(const ShardMap& map, const std::set<uint32_t>& live) {
  std::map<uint32_t, uint64_t> loads;
  for (uint32_t s : live) loads[s] = 0;
  std::map<uint64_t, uint32_t> taking;  // partition -> server whose primary it becomes
  for (const Handoff& h : map.handoffs()) taking[h.partition()] = h.to();
  for (const PartitionInfo& p : map.partitions()) {
    auto it = taking.find(p.id());
    const uint32_t primary = it != taking.end() ? it->second : p.server();
    if (loads.contains(primary)) loads[primary] += p.num_elements();
  }
  return loads;
}

std::vector<Handoff> PlanHandoffs(const ShardMap& map, const std::set<uint32_t>& live) {
  std::set<uint64_t> fixed;
  for (const Handoff& h : map.handoffs()) fixed.insert(h.partition());
  for (const CopyMove& m : map.moves()) fixed.insert(m.partition());
  ShardMap planned = map;  // the roles as the plan leaves them
  auto backup_of_receiver = [](const PartitionInfo& p, uint32_t donor, uint32_t receiver) {
    return CanHandPrimary(p, donor, receiver);
  };
  auto swap_roles = [](PartitionInfo& p, const Step& step) { HandPrimary(p, step.donor, step.receiver); };
  std::vector<Handoff> handoffs;
  for (const Step& step :
       BalanceGreedily(planned, PrimaryLoadsAfterHandoffs(map, live), fixed, backup_of_receiver, swap_roles)) {
    Handoff& h = handoffs.emplace_back();
    h.set_partition(planned.partitions(step.index).id());
    h.set_from(step.donor);
    h.set_to(step.receiver);
  }
  return handoffs;
}

}  // namespace shardps
