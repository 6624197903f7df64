// PartitionEngine, hand-off half: a primary giving its role to a synced
// backup (ShardMap.handoffs) without losing or repeating an update. The old
// primary holds what would start new work, drains what was started, says so
// (HandoffsDone, in its heartbeat), and the scheduler switches the roles in
// the next epoch. See InstallShardMap in partition_engine.h.
#include <algorithm>

#include <glog/logging.h>

#include "common/config.h"
#include "server/partition_engine.h"

namespace shardps {

void PartitionEngine::FollowHandoff(Partition& p, const ShardMap& map, const PartitionInfo& info,
                                    std::vector<Deferred>& resume) {
  const Handoff* listed = nullptr;
  for (const Handoff& h : map.handoffs()) {
    if (h.partition() == p.id && h.from() == server_index_) listed = &h;
  }
  const bool primary = info.server() == server_index_;
  if (listed != nullptr && primary && p.primary) {
    if (p.handoff_epoch != 0) {
      // Under way already; a map that ended it and one that listed it again
      // may have come together (the watch keeps only the latest): the report
      // must name the new listing.
      if (p.handoff_epoch != listed->epoch()) ++copies_generation_;
      p.handoff_epoch = listed->epoch();
      p.handoff_to = listed->to();
      return;
    }
    p.handoff_epoch = listed->epoch();
    p.handoff_done = false;
    p.handoff_to = listed->to();
    handing_off_.insert(p.id);
    // Pushes parked for a later round would start it once the open one
    // completes: held instead, and owed again (an answered ssp push stays:
    // the backups hold it, forwarded, and count it once promoted).
    std::vector<ParkedPush> ahead;
    for (ParkedPush& push : p.ahead) {
      if (push.answered) {
        ahead.push_back(std::move(push));
        continue;
      }
      uint64_t& owed = p.next_round[push.header.worker_rank()];
      owed = std::min(owed, push.header.round());
      p.handoff_held.push_back(Deferred{std::move(push.peer), push.header, std::move(push.payload), true});
    }
    p.ahead = std::move(ahead);
    LOG(WARNING) << "server " << server_index_ << ": handing off the primary of partition " << p.id << " to server "
                 << listed->to() << " (shard map epoch " << map.epoch() << "): new work held, "
                 << (p.arrivals > 0 ? "the started round completes first" : "no round started") << " ("
                 << p.completed << (RoundBased(config_) ? " rounds" : " updates") << " applied)";
    return;
  }
  if (p.handoff_epoch == 0) return;
  // The map no longer lists this server's hand-off: it ended.
  handing_off_.erase(p.id);
  p.handoff_epoch = 0;
  p.handoff_done = false;
  ++copies_generation_;
  if (primary) {
    LOG(WARNING) << "server " << server_index_ << ": the hand-off of partition " << p.id
                 << " ended without a switch (shard map epoch " << map.epoch() << "): still its primary, replaying "
                 << p.handoff_held.size() << " held requests";
    for (Deferred& d : p.handoff_held) resume.push_back(std::move(d));
    p.handoff_held.clear();
    return;
  }
  // Another server is the primary now. Nothing held was answered, and
  // nothing left waiting is answered either: every worker re-sends what it
  // waits for there, with the same request ids, and an answer from here
  // (even an error) would settle the request the worker re-sent.
  // Except the pushes parked and answered already (ssp): the new primary
  // counts them, forwarded, and so must this copy if promoted before the
  // new primary's snapshot (which holds them too) arrives.
  for (const ParkedPush& push : p.ahead) {
    if (forwards_pushes_ && push.answered) {
      HoldForwarded(p, ForwardedHeader(push.header), push.payload.data(), push.payload.size());
    }
  }
  const size_t left =
      p.handoff_held.size() + p.waiting.size() + p.ahead.size() + p.unconfirmed.size() + p.bounded.size();
  p.handoff_held.clear();
  p.bounded.clear();
  p.waiting.clear();
  p.ahead.clear();
  p.unconfirmed.clear();
  p.arrivals = p.gradients = 0;
  p.first.rebuild();  // the open round's first gradient, if held
  std::fill(p.contributed.begin(), p.contributed.end(), false);
  std::fill(p.no_gradient.begin(), p.no_gradient.end(), false);
  p.open_pushes.clear();
  p.handed_off_at = map.epoch();
  LOG(WARNING) << "server " << server_index_ << ": primary of partition " << p.id << " handed off to server "
               << info.server() << " at shard map epoch " << map.epoch() << " after " << p.completed
               << (RoundBased(config_) ? " rounds" : " updates") << "; now a backup, " << left
               << " waiting requests left to the workers to re-send there";
}

bool PartitionEngine::HoldsForHandoff(const Partition& p, const DataHeader& h) const {
  if (h.op() == PULL) return false;  // reads start nothing; one still waiting at the switch is re-sent
  if (h.op() == INIT || !RoundBased(config_)) return true;
  // Sync, ssp: a round some push started must complete, or its workers wait
  // forever; a push that would start one (or park for a later one) waits.
  return !(h.round() == p.completed && p.arrivals > 0);
}

void PartitionEngine::ProgressHandoffs() {
  std::vector<uint64_t> ids(handing_off_.begin(), handing_off_.end());
  for (uint64_t id : ids) {
    auto it = partitions_.find(id);
    if (it == partitions_.end()) {
      handing_off_.erase(id);
      continue;
    }
    Partition& p = *it->second;
    // A round started since (an answered ssp push replayed into it) takes
    // the pushes held for it, in order.
    std::vector<Deferred> held = std::move(p.handoff_held);
    p.handoff_held.clear();
    for (Deferred& d : held) {
      if (p.handoff_epoch != 0 && HoldsForHandoff(p, d.header)) {
        p.handoff_held.push_back(std::move(d));
      } else {
        Dispatch(d.peer, d.header, d.has_payload ? &d.payload : nullptr);
      }
    }
    const bool drained = p.arrivals == 0 && p.batch_count == 0 && Settled(p) && p.unconfirmed.empty();
    if (p.handoff_epoch == 0 || p.handoff_done || !drained) continue;
    p.handoff_done = true;
    ++copies_generation_;
    LOG(WARNING) << "server " << server_index_ << ": partition " << p.id << " drained for its hand-off to server "
                 << p.handoff_to << " (" << p.completed << (RoundBased(config_) ? " rounds" : " updates")
                 << " applied and confirmed, " << p.handoff_held.size() << " requests held)";
  }
}

std::vector<HandoffDone> PartitionEngine::HandoffsDone() const {
  std::vector<HandoffDone> done;
  for (uint64_t id : handing_off_) {
    auto it = partitions_.find(id);
    if (it == partitions_.end() || !it->second->handoff_done) continue;
    const Partition& p = *it->second;
    HandoffDone& d = done.emplace_back();
    d.set_partition(id);
    d.set_epoch(p.handoff_epoch);
    d.set_completed(p.completed);
  }
  std::sort(done.begin(), done.end(),
            [](const HandoffDone& a, const HandoffDone& b) { return a.partition() < b.partition(); });
  return done;
}

}  // namespace shardps
