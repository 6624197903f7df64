#include "scheduler/model_limits.h"

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "scheduler/shard_assignment.h"

namespace shardps {

absl::Status CheckModelSize(const std::vector<TensorSpec>& tensors, const ClusterConfig& config) {
  const uint64_t limit = config.limits().max_model_bytes();
  uint64_t bytes = 0;
  for (const TensorSpec& t : tensors) {
    const uint64_t n = ElementCount(t);
    const uint64_t b = n > UINT64_MAX / sizeof(float) ? UINT64_MAX : n * sizeof(float);
    bytes = b > UINT64_MAX - bytes ? UINT64_MAX : bytes + b;
    if (bytes > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model is larger than limits.max_model_bytes (", limit, " bytes): it reaches ", bytes,
          " bytes of weights at tensor '", t.name(), "'; refused before any server allocates it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShardMapSize(const ShardMap& map) {
  const size_t bytes = map.ByteSizeLong();
  if (bytes <= kMaxShardMapBytes) return absl::OkStatus();
  size_t key_bytes = 0;
  for (const std::string& key : map.worker_curve_keys()) key_bytes += key.size() + 2;  // tag, length
  return absl::ResourceExhaustedError(absl::StrCat(
      "the shard map of ", map.tensors_size(), " tensors in ", map.partitions_size(), " partitions",
      key_bytes > 0 ? absl::StrCat(" and ", map.worker_curve_keys_size(), " workers' keys (", key_bytes, " bytes)")
                    : "",
      " would take ", bytes, " bytes, more than the ", kMaxShardMapBytes,
      " a cluster sends its nodes (they receive at most 4 MiB a message, and a map grows as the job runs); "
      "refused before any server sees it: fewer tensors (concatenate small ones) or a larger partition_bytes"));
}

uint64_t ServerBytesPerElement(const ClusterConfig& config) {
  auto optimizer = Optimizer::Create(config.optimizer());
  const uint64_t slots = optimizer.ok() ? (*optimizer)->state_slots() : 2;
  return sizeof(float) * (2 + slots);
}

absl::Status CheckServerCapacity(const ShardMap& map, const ClusterConfig& config,
                                 const absl::flat_hash_map<uint32_t, uint64_t>& capacity) {
  const uint64_t per_element = ServerBytesPerElement(config);
  absl::flat_hash_map<uint32_t, uint64_t> held;
  for (const PartitionInfo& p : map.partitions()) {
    held[p.server()] += p.num_elements() * per_element;
    for (uint32_t b : p.backups()) held[b] += p.num_elements() * per_element;
  }
  for (const auto& [server, bytes] : held) {
    auto it = capacity.find(server);
    if (it == capacity.end() || it->second == 0 || bytes <= it->second) continue;
    return absl::ResourceExhaustedError(absl::StrCat(
        "server ", server, " would hold ", bytes, " bytes of partitions (weights, optimizer state, accumulator; ",
        "replicas included) but reported it can hold ", it->second,
        " bytes: use more servers, less replication or a smaller model"));
  }
  return absl::OkStatus();
}

}  // namespace shardps
