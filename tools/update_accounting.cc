#include "tools/update_accounting.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace shardps {

UpdateAccounting AccountUpdates(bool async, const std::map<uint64_t, PartitionApplied>& applied,
                                const std::map<int, std::map<uint64_t, uint64_t>>& acked_by_worker,
                                uint64_t restored_rounds,
                                const std::map<int, std::map<uint64_t, uint64_t>>& acked_digests_by_worker) {
  // Sync: the rounds this run completed.
  auto run_rounds = [restored_rounds](uint64_t completed) {
    return completed > restored_rounds ? completed - restored_rounds : 0;
  };
  UpdateAccounting out;
  std::map<uint64_t, uint64_t> most_acked;  // sync: per partition, the most rounds any worker pushed
  for (const auto& [rank, acked] : acked_by_worker) {
    for (const auto& [partition, n] : acked) {
      most_acked[partition] = std::max(most_acked[partition], n);
      auto it = applied.find(partition);
      uint64_t done = 0;
      if (it != applied.end()) {
        done = !async ? run_rounds(it->second.completed)
               : static_cast<size_t>(rank) < it->second.applied_by_worker.size() ? it->second.applied_by_worker[rank]
                                                                                  : 0;
      }
      if (n > done) out.lost += n - done;
      if (async && done > n) out.duplicates += done - n;
      if (async && n == done && it != applied.end() &&
          static_cast<size_t>(rank) < it->second.applied_digest_by_worker.size()) {
        auto worker = acked_digests_by_worker.find(rank);
        if (worker == acked_digests_by_worker.end()) continue;
        auto digest = worker->second.find(partition);
        if (digest != worker->second.end() && digest->second != it->second.applied_digest_by_worker[rank]) {
          ++out.lost;
          ++out.duplicates;
        }
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

namespace {

// The `PREFIX.PARTITION N` lines of a result file (whose other lines hold
// fractions: read as words, not numbers).
std::map<uint64_t, uint64_t> ReadPartitionLines(const std::string& result_file, absl::string_view prefix) {
  std::map<uint64_t, uint64_t> out;
  std::ifstream in(result_file);
  std::string key, value;
  while (in >> key >> value) {
    uint64_t partition, n;
    if (absl::StartsWith(key, prefix) && absl::SimpleAtoi(key.substr(prefix.size()), &partition) &&
        absl::SimpleAtoi(value, &n)) {
      out[partition] = n;
    }
  }
  return out;
}

}  // namespace

std::map<uint64_t, uint64_t> ReadAckedPushes(const std::string& result_file) {
  return ReadPartitionLines(result_file, "acked.");
}

std::map<uint64_t, uint64_t> ReadAckedPushDigests(const std::string& result_file) {
  return ReadPartitionLines(result_file, "acked_digest.");
}

}  // namespace shardps
