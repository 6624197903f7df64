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

#include "absl/strings/str_cat.h"
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

void PartitionEngine::FollowCheckpoints(const ShardMap& map) {
  checkpoint_owners_.Clear();
  for (const PartitionInfo& info : map.partitions()) {
    CheckpointManifest::Owner* owner = checkpoint_owners_.Add();
    owner->set_partition_id(info.id());
    owner->set_server(info.server());
  }
  const CheckpointRequest& request = map.checkpoint();
  if (request.dir().empty() || google::protobuf::util::MessageDifferencer::Equals(request, requested_checkpoint_)) {
    return;
  }
  requested_checkpoint_ = request;
  for (auto& [id, part] : partitions_) {
    Partition& p = *part;
    if (!p.primary) continue;
    if (!RoundBased(config_)) {
      // Async: now, at the version the partition has (its open batch was
      // applied as the map arrived), labelled with the request's round.
      WriteCheckpoint(p, request.dir(), request.round());
      continue;
    }
    if (p.completed < request.round()) continue;
    if (p.completed == request.round()) {
      WriteCheckpoint(p, request.dir(), p.completed);
    } else {
      CheckpointFailed(request.dir(), request.round(),
                       absl::StrCat("asked for when partition ", p.id, " had completed ", p.completed, " rounds"));
    }
  }
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
  std::memcpy(WritableWeights(p), state->weights().data(), state->weights().size());
  std::memcpy(p.state.data(), state->optimizer_state().data(), state->optimizer_state().size());
  p.completed = state->has_version() ? state->version() : state->round();
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
}

void PartitionEngine::WriteCheckpoint(Partition& p, const std::string& dir, uint64_t round) {
  PartitionCheckpoint state;
  state.set_partition_id(p.id);
  state.set_tensor(p.tensor);
  state.set_offset(p.offset);
  state.set_num_elements(p.n);
  state.set_round(round);
  if (!RoundBased(config_)) state.set_version(p.completed);
  state.set_initialized(p.initialized);
  state.set_weights(FloatBytes(p.weights->data(), p.n));
  state.set_optimizer_state(FloatBytes(p.state.data(), p.state.size()));
  const std::string round_dir = CheckpointRoundDir(dir, round);
  auto entry = WritePartitionCheckpoint(round_dir, state);
  if (!entry.ok()) {
    CheckpointFailed(dir, round,
                     absl::StrCat("partition ", p.id, " not written: ", entry.status().message()));
    return;
  }
  const std::pair<std::string, uint64_t> key(dir, round);
  CheckpointManifest& manifest = open_checkpoints_[key];
  *manifest.add_entries() = *std::move(entry);
  const auto primaries =
      std::count_if(partitions_.begin(), partitions_.end(), [](const auto& kv) { return kv.second->primary; });
  if (manifest.entries_size() < primaries) return;
  manifest.set_round(round);
  manifest.set_server(server_index_);
  *manifest.mutable_partitions() = checkpoint_owners_;
  if (absl::Status s = WriteCheckpointManifest(round_dir, manifest); !s.ok()) {
    CheckpointFailed(dir, round, absl::StrCat("manifest not written: ", s.message()));
  } else {
    LOG(INFO) << "server " << server_index_ << ": checkpoint of round " << round << " written to " << round_dir;
  }
  open_checkpoints_.erase(key);
}

}  // namespace shardps
