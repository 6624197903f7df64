#include "common/checkpoint_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/durable_file.h"

namespace shardps {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kPartitionKind = "ckpt-partition";
constexpr absl::string_view kManifestKind = "ckpt-manifest";
constexpr absl::string_view kRoundPrefix = "round-";
constexpr absl::string_view kManifestPrefix = "server-";
constexpr absl::string_view kManifestSuffix = ".manifest";

// Named by its writer too, a job's server: two servers that each wrote the
// partition (a primary and the one it was handed to, each at the version it
// had) keep their own files, and so does a job that writes a round again
// (resumed from an earlier one), so each manifest's entry matches what it
// names, and a job that dies before its manifests leaves the round of the
// job before it intact.
std::string PartitionFileName(uint64_t id, uint32_t server, uint64_t job) {
  return absl::StrCat("partition-", id, ".server-", server, ".job-", absl::Hex(job, absl::kZeroPad16), ".ckpt");
}

std::string Join(const std::string &dir, absl::string_view name) {
  return (fs::path(dir) / std::string(name)).string();
}

// The manifests of a round directory, by server; the first unreadable one
// fails.
absl::StatusOr<std::map<uint32_t, CheckpointManifest>> ReadManifests(const std::string &round_dir) {
  std::error_code ec;
  fs::directory_iterator it(round_dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read checkpoint directory ", round_dir, ": ", ec.message()));
  std::map<uint32_t, CheckpointManifest> manifests;
  for (const fs::directory_entry &e : it) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, kManifestPrefix) || !absl::EndsWith(name, kManifestSuffix)) continue;
    const std::string path = e.path().string();
    auto data = ReadWholeFile(path);
    if (!data.ok()) return data.status();
    auto payload = UnsealRecord(kManifestKind, *data, path);
    if (!payload.ok()) return payload.status();
    CheckpointManifest m;
    if (!m.ParseFromString(*payload)) return absl::DataLossError(absl::StrCat(path, " is not a checkpoint manifest"));
    if (name != absl::StrCat(kManifestPrefix, m.server(), kManifestSuffix)) {
      return absl::DataLossError(absl::StrCat(path, " holds the manifest of server ", m.server()));
    }
    manifests[m.server()] = std::move(m);
  }
  if (manifests.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no manifest (", kManifestPrefix, "N", kManifestSuffix, ") in ",
                                                      round_dir, ": not a complete checkpoint"));
  }
  return manifests;
}

// Entry of every partition the manifests cover, after checking they agree
// on the round and cover the whole map.
absl::StatusOr<std::map<uint64_t, CheckpointManifest::Entry>> CoveredEntries(
    const std::string &round_dir, const std::map<uint32_t, CheckpointManifest> &manifests, uint64_t *round) {
  const CheckpointManifest &first = manifests.begin()->second;
  std::map<uint64_t, CheckpointManifest::Entry> entries;
  for (const auto &[server, m] : manifests) {
    const std::string path = Join(round_dir, absl::StrCat(kManifestPrefix, server, kManifestSuffix));
    if (m.round() != first.round()) {
      return absl::DataLossError(
          absl::StrCat(path, " is of round ", m.round(), ", ",
                       Join(round_dir, absl::StrCat(kManifestPrefix, first.server(), kManifestSuffix)), " of round ",
                       first.round()));
    }
    for (const CheckpointManifest::Entry &e : m.entries()) entries[e.partition_id()] = e;
  }
  for (const CheckpointManifest::Owner &owner : first.partitions()) {
    if (entries.contains(owner.partition_id())) continue;
    const std::string manifest = Join(round_dir, absl::StrCat(kManifestPrefix, owner.server(), kManifestSuffix));
    return absl::FailedPreconditionError(
        absl::StrCat("incomplete checkpoint ", round_dir, ": partition ", owner.partition_id(), " (",
                     Join(round_dir, PartitionFileName(owner.partition_id(), owner.server(), first.job())),
                     ") is listed by no manifest; ",
                     manifests.contains(owner.server()) ? "" : absl::StrCat(manifest, " is missing")));
  }
  *round = first.round();
  return entries;
}

// The file of `entry`, checked against the manifest's checksum.
absl::StatusOr<std::string> ReadCheckedFile(const std::string &round_dir, const CheckpointManifest::Entry &entry) {
  const std::string path = Join(round_dir, entry.file());
  auto data = ReadWholeFile(path);
  if (!data.ok()) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", path, " is missing: ", data.status().message()));
  }
  if (data->size() != entry.bytes() || Fnv1a64(*data) != entry.checksum()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " fails the checksum its manifest records (",
                                            data->size(), " bytes, manifest says ", entry.bytes(), ")"));
  }
  return data;
}

// The manifests of the job that wrote the latest of them (a job resumed
// from an earlier round writes the later rounds again, and those of another
// job name files it may have rewritten).
std::map<uint32_t, CheckpointManifest> OfTheLatestJob(std::map<uint32_t, CheckpointManifest> manifests) {
  const CheckpointManifest *latest = nullptr;
  for (const auto &[server, m] : manifests) {
    if (latest == nullptr || m.written_unix_ms() > latest->written_unix_ms()) latest = &m;
  }
  const uint64_t job = latest->job();
  std::erase_if(manifests, [job](const auto &m) { return m.second.job() != job; });
  return manifests;
}

absl::StatusOr<std::map<uint64_t, CheckpointManifest::Entry>> VerifiedEntries(const std::string &round_dir,
                                                                              uint64_t *round) {
  auto manifests = ReadManifests(round_dir);
  if (!manifests.ok()) return manifests.status();
  return CoveredEntries(round_dir, OfTheLatestJob(*std::move(manifests)), round);
}

}  // namespace

std::string CheckpointRoundDir(const std::string &dir, uint64_t round) {
  return Join(dir, absl::StrFormat("%s%012d", kRoundPrefix, round));
}

absl::StatusOr<CheckpointManifest::Entry> WritePartitionCheckpoint(const std::string &round_dir,
                                                                   const PartitionCheckpoint &state, uint32_t server,
                                                                   uint64_t job) {
  std::error_code ec;
  fs::create_directories(round_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create checkpoint directory ", round_dir, ": ", ec.message()));
  const std::string file = SealRecord(kPartitionKind, state.SerializeAsString());
  CheckpointManifest::Entry entry;
  entry.set_partition_id(state.partition_id());
  entry.set_file(PartitionFileName(state.partition_id(), server, job));
  entry.set_checksum(Fnv1a64(file));
  entry.set_bytes(file.size());
  if (absl::Status s = WriteFileDurably(Join(round_dir, entry.file()), file); !s.ok()) return s;
  return entry;
}

absl::Status WriteCheckpointManifest(const std::string &round_dir, const CheckpointManifest &manifest) {
  return WriteFileDurably(Join(round_dir, absl::StrCat(kManifestPrefix, manifest.server(), kManifestSuffix)),
                          SealRecord(kManifestKind, manifest.SerializeAsString()));
}

absl::StatusOr<uint64_t> VerifyCheckpointRound(const std::string &round_dir) {
  uint64_t round = 0;
  auto entries = VerifiedEntries(round_dir, &round);
  if (!entries.ok()) return entries.status();
  for (const auto &[id, entry] : *entries) {
    if (auto data = ReadCheckedFile(round_dir, entry); !data.ok()) return data.status();
  }
  return round;
}

absl::StatusOr<RestorePoint> FindRestorePoint(const std::string &dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read checkpoint directory ", dir, ": ", ec.message()));
  std::vector<std::string> rounds;
  bool is_round = false;
  for (const fs::directory_entry &e : it) {
    const std::string name = e.path().filename().string();
    uint64_t r;
    if (absl::StartsWith(name, kRoundPrefix) && absl::SimpleAtoi(name.substr(kRoundPrefix.size()), &r)) {
      rounds.push_back(e.path().string());
    }
    is_round |= absl::StartsWith(name, kManifestPrefix) || absl::StartsWith(name, "partition-");
  }
  if (is_round || rounds.empty()) {
    auto round = VerifyCheckpointRound(dir);
    if (!round.ok()) return round.status();
    return RestorePoint{dir, *round};
  }
  std::sort(rounds.rbegin(), rounds.rend());  // zero-padded: newest first
  absl::Status latest;
  for (const std::string &round_dir : rounds) {
    auto round = VerifyCheckpointRound(round_dir);
    if (round.ok()) return RestorePoint{round_dir, *round};
    if (!absl::IsFailedPrecondition(round.status())) return round.status();
    LOG(WARNING) << "skipping " << round.status().message();
    if (latest.ok()) latest = round.status();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no complete checkpoint in ", dir, "; the latest: ", latest.message()));
}

absl::Status SetRestorePoint(const std::string &dir, ClusterConfig *config) {
  auto point = FindRestorePoint(dir);
  if (!point.ok()) return point.status();
  std::error_code ec;
  const fs::path absolute = fs::absolute(point->round_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot resolve ", point->round_dir, ": ", ec.message()));
  config->mutable_checkpoint()->set_restore_dir(absolute.lexically_normal().string());
  config->mutable_checkpoint()->set_restore_round(point->round);
  return absl::OkStatus();
}

std::set<uint64_t> PartitionsListedElsewhere(const std::string &round_dir, uint32_t server, uint64_t job) {
  std::set<uint64_t> listed;
  if (!fs::exists(round_dir)) return listed;
  auto manifests = ReadManifests(round_dir);
  if (!manifests.ok()) return listed;
  for (const auto &[s, m] : *manifests) {
    if (s == server || m.job() != job) continue;
    for (const CheckpointManifest::Entry &e : m.entries()) listed.insert(e.partition_id());
  }
  return listed;
}

absl::StatusOr<PartitionCheckpoint> LoadPartitionCheckpoint(const std::string &round_dir, uint64_t partition_id) {
  uint64_t round = 0;
  auto entries = VerifiedEntries(round_dir, &round);
  if (!entries.ok()) return entries.status();
  auto entry = entries->find(partition_id);
  if (entry == entries->end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", round_dir, " has no partition ", partition_id, ": no manifest lists it"));
  }
  auto data = ReadCheckedFile(round_dir, entry->second);
  if (!data.ok()) return data.status();
  const std::string path = Join(round_dir, entry->second.file());
  auto payload = UnsealRecord(kPartitionKind, *data, path);
  if (!payload.ok()) return payload.status();
  PartitionCheckpoint state;
  if (!state.ParseFromString(*payload) || state.partition_id() != partition_id || state.round() != round) {
    return absl::DataLossError(absl::StrCat(path, " does not hold partition ", partition_id, " at round ", round));
  }
  return state;
}

}  // namespace shardps
