#include "tools/status_view.h"

#include <google/protobuf/util/json_util.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"

namespace shardps {

std::string StatusTable(const StatusResponse& status) {
  const ClusterConfig& c = status.config();
  const uint64_t epoch = status.shard_map().epoch();
  int alive = 0, dead = 0;
  for (const NodeStatus& n : status.nodes()) {
    if (n.declared_dead()) ++dead;
    else if (n.alive()) ++alive;
  }
  std::string out = absl::StrFormat(
      "cluster: %s, %d servers, %d workers, shard map epoch %d, %d partitions; %d nodes alive, %d dead\n",
      ConsistencyName(c.consistency()), c.num_servers(), c.num_workers(), epoch,
      status.shard_map().partitions_size(), alive, dead);
  std::vector<uint64_t> bytes(c.num_servers(), 0);
  for (const PartitionInfo& p : status.shard_map().partitions()) {
    if (p.server() < bytes.size()) bytes[p.server()] += p.num_elements() * 4;
  }
  for (const NodeStatus& n : status.nodes()) {
    const uint64_t served = n.rank() < bytes.size() ? bytes[n.rank()] : 0;
    std::string what = n.role() == SERVER ? absl::StrFormat("server %d  %s  %d bytes  epoch %d", n.rank(),
                                                            n.address(), served, n.applied_epoch())
                                          : absl::StrFormat("worker %d  %s", n.rank(), n.host());
    const char* state = n.declared_dead() ? "DEAD" : n.alive() ? "alive" : "SILENT";
    const bool behind = n.role() == SERVER && !n.declared_dead() && n.applied_epoch() < epoch;
    absl::StrAppend(&out, absl::StrFormat("  %-60s %s (heartbeat %d ms ago)%s\n", what, state,
                                          n.ms_since_heartbeat(), behind ? " behind" : ""));
  }
  return out;
}

std::string StatusJson(const StatusResponse& status) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(status, &json, options);
  return json;
}

}  // namespace shardps
