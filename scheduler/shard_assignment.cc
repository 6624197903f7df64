#include "scheduler/shard_assignment.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"

namespace shardps {

uint64_t ElementCount(const TensorSpec& tensor) {
  // Saturates: a shape whose product overflows counts as UINT64_MAX, which
  // every size limit refuses, instead of wrapping to a small number.
  uint64_t n = 1;
  for (int64_t d : tensor.shape()) {
    const uint64_t u = d < 0 ? 0 : static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return UINT64_MAX;
    n *= u;
  }
  return n;
}

absl::Status ValidateTensorSpecs(const std::vector<TensorSpec>& tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("no tensors declared");
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& t : tensors) {
    if (t.name().empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (absl::Status s = CheckName("tensor name", t.name()); !s.ok()) return s;
    if (absl::Status s = CheckName(absl::StrCat("codec of tensor '", t.name(), "'"), t.codec()); !s.ok()) return s;
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' is declared twice"));
    }
    if (t.dtype() != FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "': dtype must be float32"));
    }
    if (t.shape().empty()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has no shape"));
    // The product is bounded as it is formed: dimensions that are each
    // within the limit can still wrap around 64 bits together.
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t n = 1;
    for (int64_t d : t.shape()) {
      if (d <= 0 || d > static_cast<int64_t>(kMaxElements)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dimension ", d));
      }
      if (n > kMaxElements / static_cast<uint64_t>(d)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' [", absl::StrJoin(t.shape(), "x"),
                                                       "] is too large (more than 2^40 elements)"));
      }
      n *= static_cast<uint64_t>(d);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardMap> BuildShardMap(const std::vector<TensorSpec>& tensors,
                                       const std::vector<ServerInfo>& servers,
                                       uint64_t partition_bytes, uint64_t epoch, uint32_t replication) {
  if (absl::Status s = ValidateTensorSpecs(tensors); !s.ok()) return s;
  if (servers.empty()) return absl::FailedPreconditionError("no servers to place partitions on");
  if (replication < 1 || replication > servers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replication ", replication, " needs as many servers; there are ",
                                                   servers.size()));
  }
  const uint64_t max_elems = std::max<uint64_t>(1, partition_bytes / sizeof(float));
  ShardMap map;
  map.set_epoch(epoch);
  for (const ServerInfo& s : servers) *map.add_servers() = s;
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    *map.add_tensors() = tensors[t];
    const uint64_t n = ElementCount(tensors[t]);
    const uint64_t parts = (n + max_elems - 1) / max_elems;
    for (uint64_t p = 0; p < parts; ++p) {
      PartitionInfo* info = map.add_partitions();
      info->set_id(map.partitions_size() - 1);
      info->set_tensor(t);
      info->set_offset(n * p / parts);
      info->set_num_elements(n * (p + 1) / parts - n * p / parts);
    }
  }
  // Largest first onto the least-loaded server.
  std::vector<int> order(map.partitions_size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return map.partitions(a).num_elements() > map.partitions(b).num_elements();
  });
  std::vector<uint64_t> load(servers.size(), 0);
  std::vector<size_t> primary(map.partitions_size());
  for (int i : order) {
    size_t best = std::min_element(load.begin(), load.end()) - load.begin();
    map.mutable_partitions(i)->set_server(servers[best].index());
    load[best] += map.partitions(i).num_elements();
    primary[i] = best;
  }
  // Backups on the servers holding the least in all, never two copies on one.
  for (uint32_t copy = 1; copy < replication; ++copy) {
    for (int i : order) {
      PartitionInfo* p = map.mutable_partitions(i);
      size_t best = servers.size();
      for (size_t s = 0; s < servers.size(); ++s) {
        const bool holds = s == primary[i] || std::find(p->backups().begin(), p->backups().end(),
                                                         servers[s].index()) != p->backups().end();
        if (!holds && (best == servers.size() || load[s] < load[best])) best = s;
      }
      p->add_backups(servers[best].index());
      load[best] += p->num_elements();
    }
  }
  return map;
}

}  // namespace shardps
