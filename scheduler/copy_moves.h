// Planning the backup copies that move to balance the live servers' loads
// (after a server joined a running job, or a failover), then the primary
// roles handed off to balance the primaries. Pure functions of a shard map: the scheduler
// (ClusterState) carries out a plan in two phases, see CopyMove in
// proto/cluster.proto and "A server that joins" in docs/architecture.md.
#ifndef SHARDPS_SCHEDULER_COPY_MOVES_H_
#define SHARDPS_SCHEDULER_COPY_MOVES_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "common/shard_map.h"  // HoldsCopy, which callers of these use too
#include "proto/cluster.pb.h"

namespace shardps {

// Elements of partitions each server can hold, from the memory it reported
// (ClusterState::ServerRooms); a server not listed, or listed with 0, is
// not limited.
using ServerRoom = std::map<uint32_t, uint64_t>;
// The elements `server`, holding `load`, may still take within `room`.
uint64_t RoomLeft(const ServerRoom& room, uint32_t server, uint64_t load);

// Elements of the copies (primary or backup) each server in `live` holds
// once the moves in `map.moves()` are done (their `from` copies gone).
std::map<uint32_t, uint64_t> ServerLoadsAfterMoves(const ShardMap& map, const std::set<uint32_t>& live);

// Whether every server of `loads` holds within one partition's size (the
// map's largest) of the mean.
bool LoadsBalanced(const ShardMap& map, const std::map<uint32_t, uint64_t>& loads);

// The moves (epoch unset) that balance `live` servers' loads, greedily: while
// some server is more than one partition's size from the mean, or holds
// nothing while others hold copies, the least loaded server that can take a
// copy takes, from the most loaded one that has such a copy (of equally
// loaded ones, the one with the largest), the largest backup copy it does
// not hold already and whose move narrows the gap between the two (size
// below the difference of their loads). Largest first keeps the number of
// moves low; every move lowers the sum of squared loads, so the plan ends
// and no later plan undoes it. Only backups move (primaries stay where
// workers send; their roles move by PlanHandoffs), except a primary that is
// its partition's only copy (replication 1): that move is marked `primary`
// and ends with a hand-off (ClusterState::FinishCopyMoves). A partition moves
// at most once per plan, and partitions with a move under way, or whose
// primary is not live, are left alone. No server is given a copy past its
// `room`. Deterministic.
std::vector<CopyMove> PlanCopyMoves(const ShardMap& map, const std::set<uint32_t>& live, const ServerRoom& room = {});

// The moves (epoch unset) that take every copy off the `draining` servers
// (`shardps drain`): largest partitions first, each copy goes to the server
// of `live` (which lists no draining one) that holds the fewest elements,
// counting the moves planned so far, and no copy of the partition yet. A
// primary's move is marked `primary`, backups or not: the role is handed to
// its new copy once that is synced, then the old copy dropped. Partitions
// with a move under way, or whose primary is neither live nor draining
// (the failover's concern), are left alone, and so is a copy that fits the
// `room` of no server without one (the drain then waits for a server that
// joins). Deterministic.
std::vector<CopyMove> PlanDrainMoves(const ShardMap& map, const std::set<uint32_t>& live,
                                     const std::set<uint32_t>& draining, const ServerRoom& room = {});

// Whether hand-off `h` is the second step of primary move `m` (the role
// going to the move's new copy), not one balancing the primaries.
bool IsPrimaryMoveHandoff(const CopyMove& m, const Handoff& h);

// Whether `from`, p's primary, can hand the role to `to`: `to` holds a copy.
bool CanHandPrimary(const PartitionInfo& p, uint32_t from, uint32_t to);
// Makes `to` p's primary and `from` a backup in its place (copies unchanged).
void HandPrimary(PartitionInfo& p, uint32_t from, uint32_t to);

// Elements of the partitions each server in `live` is the primary of once
// the hand-offs in `map.handoffs()` are done (their `to` the primary).
std::map<uint32_t, uint64_t> PrimaryLoadsAfterHandoffs(const ShardMap& map, const std::set<uint32_t>& live);

// The hand-offs of primary roles (epoch unset) that balance `live` servers'
// primary elements (the workers' traffic and the optimizer work), the same
// greedy way as PlanCopyMoves: while some server's primaries are more than
// one partition's size from the mean (or it has none while others have
// some), the least loaded server that can take one takes, from the most
// loaded one that has such a partition, the primary role of the largest
// partition it holds a backup of whose switch narrows the gap between the
// two. Copies stay where they are (the old primary becomes a backup in the
// new one's place). A partition is handed off at most once per plan; those
// with a hand-off or a copy move under way are left alone. Deterministic.
// REQUIRES: every backup the map lists is synced (the scheduler plans only
// then).
std::vector<Handoff> PlanHandoffs(const ShardMap& map, const std::set<uint32_t>& live);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_COPY_MOVES_H_
