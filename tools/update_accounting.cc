#include "tools/update_accounting.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace shardps {

UpdateAccounting AccountUpdates(bool async, const std::map<uint64_t, PartitionApplied>& applied,
                                const std::map<int, WorkerAcks>& acked_by_worker, uint64_t restored_rounds) {
  // Sync: the rounds this run completed.
  auto run_rounds = [restored_rounds](uint64_t completed) {
    return completed > restored_rounds ? completed - restored_rounds : 0;
  };
  UpdateAccounting out;
  // Sync: per partition, the most rounds of this run any worker pushed. A
  // rejoined process pushed from its rejoin round on: the rounds before it
  // were pushed by the process it replaced, whose counts died with it.
  std::map<uint64_t, uint64_t> most_acked;
  for (const auto& [rank, acks] : acked_by_worker) {
    const size_t w = static_cast<size_t>(rank);
    for (const auto& [partition, n] : acks.pushes) {
      most_acked[partition] = std::max(most_acked[partition], run_rounds(acks.rejoin_round) + n);
      auto it = applied.find(partition);
      const PartitionApplied* a = it == applied.end() ? nullptr : &it->second;
      const bool per_worker = a != nullptr && w < a->applied_by_worker.size();
      if (!async) {
        uint64_t done = a != nullptr ? run_rounds(a->completed) : 0;
        if (per_worker && acks.rejoin_round == 0) done = std::min(done, a->applied_by_worker[w]);
        if (n > done) out.lost += n - done;
        continue;
      }
      const uint64_t done = per_worker ? a->applied_by_worker[w] : 0;
      if (n > done) out.lost += n - done;
      if (done > n) out.duplicates += done - n;
      if (n != done || !per_worker || w >= a->applied_digest_by_worker.size()) continue;
      auto digest = acks.digests.find(partition);
      if (digest != acks.digests.end() && digest->second != a->applied_digest_by_worker[w]) {
        ++out.lost;  // equal counts, other pushes: at least one lost and one applied twice
        ++out.duplicates;
      }
    }
  }
  if (!async) {
    for (const auto& [partition, a] : applied) {
      const uint64_t pushed = most_acked[partition];
      if (run_rounds(a.completed) > pushed) out.duplicates += run_rounds(a.completed) - pushed;
    }
  }
  return out;
}

namespace {

uint64_t Total(const PartitionApplied& a) {
  uint64_t sum = a.completed;
  for (uint64_t n : a.applied_by_worker) sum += n;
  return sum;
}

// One server's file: its primaries' lines into `primaries`, its synced
// backup copies' into `backups` where one applied more than any seen yet.
void ReadUpdatesFile(const std::string& path, std::map<uint64_t, PartitionApplied>* primaries,
                     std::map<uint64_t, PartitionApplied>* backups) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const bool backup = absl::StartsWith(line, "backup ");
    std::istringstream fields(backup ? line.substr(7) : line);
    uint64_t id;
    PartitionApplied a;
    if (!(fields >> id >> a.completed)) continue;  // the staleness line
    for (uint64_t n; fields >> n;) a.applied_by_worker.push_back(n);
    fields.clear();
    if (std::string word; fields >> word && word == "digests") {
      for (uint64_t d; fields >> d;) a.applied_digest_by_worker.push_back(d);
    }
    if (!backup) {
      primaries->try_emplace(id, std::move(a));  // two primaries of one id: the first file's, as ever
      continue;
    }
    auto [it, inserted] = backups->try_emplace(id, a);
    if (!inserted && Total(a) > Total(it->second)) it->second = std::move(a);
  }
}

}  // namespace

std::map<uint64_t, PartitionApplied> ReadServerUpdates(const std::vector<std::string>& updates_files) {
  std::map<uint64_t, PartitionApplied> primaries, backups;
  for (const std::string& path : updates_files) ReadUpdatesFile(path, &primaries, &backups);
  primaries.merge(backups);  // keeps every primary's line
  return primaries;
}

WorkerAcks ReadWorkerAcks(const std::string& result_file) {
  WorkerAcks acks;
  std::ifstream in(result_file);
  std::string key, value;  // the file's other lines hold fractions: read as words
  while (in >> key >> value) {
    uint64_t partition, n;
    if (!absl::SimpleAtoi(value, &n)) continue;
    if (absl::StartsWith(key, "acked.") && absl::SimpleAtoi(key.substr(6), &partition)) {
      acks.pushes[partition] = n;
    } else if (absl::StartsWith(key, "acked_digest.") && absl::SimpleAtoi(key.substr(13), &partition)) {
      acks.digests[partition] = n;
    } else if (key == "rejoin_round") {
      acks.rejoin_round = n;
    }
  }
  return acks;
}

}  // namespace shardps
