// Lost and duplicate updates of a finished job, from the daemons' own
// counters: what the surviving primaries applied per partition (each
// server's `--updates-file`) against what was acknowledged to the surviving
// workers (the `acked.PARTITION N` lines of each worker's `train
// --result-file`). `shardps local` and `shardps count-updates` (used by
// tools/chaos.sh) both count with these, so a lost update means the same in
// both.
//
// Stateless functions; thread-compatible.
#ifndef SHARDPS_TOOLS_UPDATE_ACCOUNTING_H_
#define SHARDPS_TOOLS_UPDATE_ACCOUNTING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardps {

// Sync: a worker acknowledged more rounds than its partition's primary
// completed, or than the primary's rounds summed a gradient of it, lost
// some; a primary that completed more rounds than any worker pushed (a
// rejoined process: its rejoin round and those after it) applied one
// twice. Async: the same per worker and push, and where the counts
// agree, which pushes (PushDigest sums, common/protocol.h): a push of a
// worker lost and another of the same worker and partition applied twice
// leave equal counts and unequal digests, counted as one lost and one
// duplicate (at least that many). A sync worker that rejoined is compared
// with the rounds only: its pushes of rounds the job completed without it
// (a rank that catches up) are answered as retries, by design.
struct PartitionApplied {
  uint64_t completed = 0;
  // Async: pushes applied per worker; sync: rounds that summed its gradient.
  // Empty where a file named none.
  std::vector<uint64_t> applied_by_worker;
  std::vector<uint64_t> applied_digest_by_worker;  // async; empty where a file named none
};
// What one worker's result file says it was acknowledged.
struct WorkerAcks {
  std::map<uint64_t, uint64_t> pushes;   // partition id -> pushes answered OK
  std::map<uint64_t, uint64_t> digests;  // partition id -> their PushDigests summed
  // The round a process that rejoined the job was counted from (its
  // `rejoin_round`); 0 for one there from the start.
  uint64_t rejoin_round = 0;
};
struct UpdateAccounting {
  uint64_t lost = 0, duplicates = 0;
};
// `async`: !RoundBased(config). `restored_rounds`: sync rounds a restored
// job's servers began with (checkpoint.restore_round), completed before any
// worker of this run pushed.
UpdateAccounting AccountUpdates(bool async, const std::map<uint64_t, PartitionApplied>& applied,
                                const std::map<int, WorkerAcks>& acked_by_worker, uint64_t restored_rounds = 0);

// What the servers' `--updates-file`s say was applied, per partition: its
// primary's line ("ID COMPLETED [APPLIED_BY_WORKER... digests DIGEST...]"); for a partition
// no file names a primary of (a hand-off switched as the job stopped: the
// old primary installed the switch, the new one was stopped before it), the
// synced backup copy ("backup ID ...") that applied the most: its state is
// the partition's. A file that does not exist (a server that did not
// survive) adds nothing.
std::map<uint64_t, PartitionApplied> ReadServerUpdates(const std::vector<std::string>& updates_files);

// The `acked.PARTITION N`, `acked_digest.PARTITION D` and `rejoin_round R`
// lines of a worker's `train --result-file`. Empty when the file does not
// exist.
WorkerAcks ReadWorkerAcks(const std::string& result_file);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_UPDATE_ACCOUNTING_H_
