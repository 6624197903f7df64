// PartitionEngine's checkpoints: writing the partitions this server is
// primary for at round boundaries, and loading them on a restore. What a
// partition needs to continue bitwise in the modes config validation allows
// (sync, update on server, no compression) is its weights, its optimizer
// state and its completed rounds (the optimizer's step); everything else a
// Partition holds is either derived from the config or belongs to requests
// in flight, which a restarted cluster does not have.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checkpoint_store.h"
#include "common/config.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/partition_engine.h"

namespace shardps {
namespace {

std::string FloatBytes(const float* data, size_t n) {
  return std::string(reinterpret_cast<const char*>(data), n * sizeof(float));
}

}  // namespace

void PartitionEngine::FollowCheckpoints(const ShardMap& map, uint64_t since) {
  checkpoint_owners_.Clear();
  for (const PartitionInfo& info : map.partitions()) {
    CheckpointManifest::Owner* owner = checkpoint_owners_.Add();
    owner->set_partition_id(info.id());
    owner->set_server(info.server());
  }
  const CheckpointRequest& request = map.checkpoint();
  const bool new_request =
      !request.dir().empty() && !google::protobuf::util::MessageDifferencer::Equals(request, requested_checkpoint_);
  if (new_request) requested_checkpoint_ = request;
  if (!RoundBased(config_)) {
    if (!requested_checkpoint_.dir().empty()) FollowAsyncCheckpoint(new_request, since);
    return;
  }
  if (new_request) {
    for (auto& [id, part] : partitions_) {
      Partition& p = *part;
      if (!p.primary || p.completed < request.round()) continue;
      if (p.completed == request.round()) {
        WriteCheckpoint(p, request.dir(), p.completed);
      } else {
        CheckpointFailed(request.dir(), request.round(),
                         absl::StrCat("asked for when partition ", p.id, " had completed ", p.completed, " rounds"));
      }
    }
  }
  // Also at a map that only moved primaries: a partition handed off may
  // have been the last one owing a round here.
  if (!manifests_due_.empty()) FinishCheckpoints();
}

void PartitionEngine::FollowAsyncCheckpoint(bool new_request, uint64_t since) {
  const CheckpointRequest& request = requested_checkpoint_;
  const std::pair<std::string, uint64_t> key(request.dir(), request.round());
  if (new_request) {
    async_checkpoint_written_.clear();
    open_checkpoints_.clear();  // async writes on request only: nothing else is open
  }
  std::vector<Partition*> due;
  for (auto& [id, part] : partitions_) {
    if (part->primary && !async_checkpoint_written_.contains(id)) due.push_back(part.get());
  }
  if (due.empty()) return;
  const std::string round_dir = CheckpointRoundDir(request.dir(), request.round());
  // A partition this server became the primary of after the request (a
  // failover, a hand-off) is written too, unless its old primary's manifest
  // lists it already: rewriting its file at another version would fail that
  // manifest's checksum. So is one it became the primary of in the map
  // that brings it the request (it skipped the one that asked, which the
  // old primary may have written at).
  auto taken_over = [&](const Partition* p) { return !new_request || p->primary_since == since; };
  const std::set<uint64_t> listed = absl::c_any_of(due, taken_over)
                                        ? PartitionsListedElsewhere(round_dir, server_index_, config_.job_id())
                                        : std::set<uint64_t>();
  bool wrote = false;
  for (Partition* p : due) {
    async_checkpoint_written_.insert(p->id);
    if (taken_over(p) && listed.contains(p->id)) continue;
    // Now, at the version the partition has (its open batch was applied as
    // the map arrived), labelled with the request's round.
    if (!new_request) {
      LOG(WARNING) << "server " << server_index_ << ": partition " << p->id << " became primary here after the "
                   << "checkpoint of round " << request.round() << " was asked for, and no manifest lists it: "
                   << "written at version " << p->completed;
    }
    wrote |= WriteCheckpoint(*p, request.dir(), request.round(), /*manifest_when_all=*/false);
  }
  if (wrote) WriteManifest(request.dir(), request.round());
}

void PartitionEngine::CheckpointFailed(const std::string& dir, uint64_t round, const std::string& error) {
  LOG(ERROR) << "server " << server_index_ << ": checkpoint of round " << round << " into " << dir
             << " stays incomplete: " << error;
  checkpoint_failure_.set_dir(dir);
  checkpoint_failure_.set_round(round);
  checkpoint_failure_.set_error(error);
  ++copies_generation_;  // the next heartbeat reports it
}

absl::Status PartitionEngine::RestorePartition(Partition& p) {
  const CheckpointConfig& k = config_.checkpoint();
  auto state = LoadPartitionCheckpoint(k.restore_dir(), p.id);
  if (!state.ok()) return state.status();
  const std::string where = absl::StrCat("checkpoint ", k.restore_dir(), ", partition ", p.id);
  if (state->tensor() != p.tensor || state->offset() != p.offset || state->num_elements() != p.n) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " holds ", state->num_elements(), " elements of '", state->tensor(), "' from ", state->offset(),
        ", the shard map ", p.n, " of '", p.tensor, "' from ", p.offset, ": not the same model or partitioning"));
  }
  if (state->round() != k.restore_round() || state->weights().size() != p.n * sizeof(float) ||
      state->optimizer_state().size() != p.state.size() * sizeof(float)) {
    return absl::FailedPreconditionError(absl::StrCat(where, " is of round ", state->round(), " (restoring ",
                                                      k.restore_round(), ") or of another optimizer"));
  }
  if (RoundBased(config_) && state->has_version()) {
    return absl::FailedPreconditionError(absl::StrCat(where, " is an async checkpoint (partition at version ",
                                                      state->version(), "): restore it with consistency: async"));
  }
  if (state->skipped_rounds() > state->round()) {
    return absl::DataLossError(absl::StrCat(where, " says ", state->skipped_rounds(), " of its ", state->round(),
                                            " rounds were completed without a gradient"));
  }
  std::memcpy(WritableWeights(p), state->weights().data(), state->weights().size());
  std::memcpy(p.state.data(), state->optimizer_state().data(), state->optimizer_state().size());
  p.completed = state->has_version() ? state->version() : state->round();
  p.skipped = state->skipped_rounds();
  max_completed_ = std::max(max_completed_, p.completed);
  p.initialized = state->initialized();
  // Every worker resumes at the checkpoint's round (worker.cc starts there).
  std::fill(p.next_round.begin(), p.next_round.end(), p.completed);
  return absl::OkStatus();
}

void PartitionEngine::MaybeCheckpoint(Partition& p) {
  if (!p.primary) return;
  max_completed_ = std::max(max_completed_, p.completed);
  const CheckpointConfig& k = config_.checkpoint();
  if (!RoundBased(config_)) return;  // async writes on request only (FollowCheckpoints)
  if (!k.dir().empty() && p.completed % k.every_rounds() == 0) WriteCheckpoint(p, k.dir(), p.completed);
  const CheckpointRequest& request = requested_checkpoint_;
  if (!request.dir().empty() && request.round() == p.completed &&
      (request.dir() != k.dir() || k.dir().empty() || p.completed % k.every_rounds() != 0)) {
    WriteCheckpoint(p, request.dir(), p.completed);
  }
  if (!manifests_due_.empty()) FinishCheckpoints();
}

bool PartitionEngine::WriteCheckpoint(Partition& p, const std::string& dir, uint64_t round, bool manifest_when_all) {
  PartitionCheckpoint state;
  state.set_partition_id(p.id);
  state.set_tensor(p.tensor);
  state.set_offset(p.offset);
  state.set_num_elements(p.n);
  state.set_round(round);
  if (!RoundBased(config_)) state.set_version(p.completed);
  state.set_skipped_rounds(p.skipped);
  state.set_initialized(p.initialized);
  state.set_weights(FloatBytes(p.weights->data(), p.n));
  state.set_optimizer_state(FloatBytes(p.state.data(), p.state.size()));
  auto entry = WritePartitionCheckpoint(CheckpointRoundDir(dir, round), state, server_index_, config_.job_id());
  if (!entry.ok()) {
    CheckpointFailed(dir, round,
                     absl::StrCat("partition ", p.id, " not written: ", entry.status().message()));
    return false;
  }
  CheckpointManifest& manifest = open_checkpoints_[{dir, round}];
  auto same = std::find_if(manifest.mutable_entries()->begin(), manifest.mutable_entries()->end(),
                           [&](const CheckpointManifest::Entry& e) { return e.partition_id() == p.id; });
  if (same != manifest.mutable_entries()->end()) {
    *same = *std::move(entry);
  } else {
    *manifest.add_entries() = *std::move(entry);
  }
  if (manifest_when_all) manifests_due_.insert({dir, round});
  return true;
}

void PartitionEngine::FinishCheckpoints() {
  // A primary below the round writes its part here later; one at or past it
  // wrote it here, or before it was handed here (or could not: reported).
  std::vector<std::pair<std::string, uint64_t>> finished;
  for (const auto& key : manifests_due_) {
    const uint64_t round = key.second;
    const bool owed = std::any_of(partitions_.begin(), partitions_.end(), [round](const auto& kv) {
      return kv.second->primary && kv.second->completed < round;
    });
    if (!owed) finished.push_back(key);
  }
  for (const auto& [dir, round] : finished) {
    WriteManifest(dir, round);
    manifests_due_.erase({dir, round});
  }
  // The oldest written ones go: a partition that reaches their round here
  // after so many later rounds were written is past any hand-off's reach.
  constexpr size_t kKeptCheckpoints = 8;
  while (open_checkpoints_.size() > kKeptCheckpoints) {
    auto oldest = open_checkpoints_.end();
    for (auto it = open_checkpoints_.begin(); it != open_checkpoints_.end(); ++it) {
      if (manifests_due_.contains(it->first)) continue;
      if (oldest == open_checkpoints_.end() || it->first.second < oldest->first.second) oldest = it;
    }
    if (oldest == open_checkpoints_.end()) break;
    open_checkpoints_.erase(oldest);
  }
}

void PartitionEngine::WriteManifest(const std::string& dir, uint64_t round) {
  CheckpointManifest& manifest = open_checkpoints_[{dir, round}];
  const std::string round_dir = CheckpointRoundDir(dir, round);
  manifest.set_round(round);
  manifest.set_server(server_index_);
  manifest.set_job(config_.job_id());
  manifest.set_written_unix_ms(absl::ToUnixMillis(absl::Now()));
  *manifest.mutable_partitions() = checkpoint_owners_;
  if (absl::Status s = WriteCheckpointManifest(round_dir, manifest); !s.ok()) {
    CheckpointFailed(dir, round, absl::StrCat("manifest not written: ", s.message()));
  } else {
    LOG(INFO) << "server " << server_index_ << ": checkpoint of round " << round << " written to " << round_dir
              << " (" << manifest.entries_size() << " partitions)";
    // A later round of the directory a failure named is written (a full disk
    // freed since): the failure is past, and no longer reported. Before
    // 2026-11-26 `shardps status` showed it for the rest of the job (chaos17).
    if (checkpoint_failure_.dir() == dir && checkpoint_failure_.round() < round) {
      checkpoint_failure_.Clear();
      ++copies_generation_;  // the next heartbeat says so
    }
  }
}

}  // namespace shardps
