#include "tools/status_view.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "scheduler/node_rates.h"

namespace shardps {

namespace {

constexpr double kMB = 1e6;

// "    12.5 rounds/s  50.0 updates/s  in 1.20 MB/s  out 1.20 MB/s  0 refused/s  (data 300 ms old)"
std::string RatesLine(const NodeStatus& n) {
  const NodeRates& r = n.rates();
  const std::string work = n.role() == SERVER ? absl::StrFormat("%.1f rounds/s  %.1f updates/s", r.rounds(), r.updates())
                                              : absl::StrFormat("%.1f steps/s", r.steps());
  std::string line = absl::StrFormat("    %s  in %.2f MB/s  out %.2f MB/s", work, r.bytes_in() / kMB,
                                     r.bytes_out() / kMB);
  if (n.role() == SERVER) absl::StrAppend(&line, absl::StrFormat("  %.1f refused/s", r.requests_refused()));
  absl::StrAppend(&line, absl::StrFormat("  (data %d ms old)\n", n.ms_since_counters()));
  return line;
}

// How many steps a live worker may trail the most advanced live worker
// before the table calls it lagging: sync workers move in lockstep (one
// round apart at most), SSP ones up to `staleness` rounds, async ones by the
// pushes in flight; a few more absorb the heartbeats' sampling.
uint64_t LagAllowance(const ClusterConfig& c) {
  return (c.consistency() == SSP ? c.staleness() : 0) + 3;
}

}  // namespace

std::string StatusTable(const StatusResponse& status) {
  const ClusterConfig& c = status.config();
  const uint64_t epoch = status.shard_map().epoch();
  int alive = 0, dead = 0, left = 0;
  for (const NodeStatus& n : status.nodes()) {
    if (n.left()) ++left;
    else if (n.declared_dead()) ++dead;
    else if (n.alive()) ++alive;
  }
  // More than num_servers where servers joined the running job.
  const size_t servers = std::max<size_t>(c.num_servers(), status.shard_map().servers_size());
  std::string out = absl::StrFormat(
      "cluster: %s, %d servers, %d workers, shard map epoch %d, %d partitions; %d nodes alive, %d dead%s\n",
      ConsistencyName(c.consistency()), servers, c.num_workers(), epoch, status.shard_map().partitions_size(), alive,
      dead, left > 0 ? absl::StrFormat(", %d left", left) : "");
  std::vector<uint64_t> bytes(servers, 0);
  for (const PartitionInfo& p : status.shard_map().partitions()) {
    if (p.server() < bytes.size()) bytes[p.server()] += p.num_elements() * 4;
  }
  uint64_t most_steps = 0;
  for (const NodeStatus& n : status.nodes()) {
    if (n.role() == WORKER && !n.declared_dead() && !n.left() && n.has_counters()) {
      most_steps = std::max<uint64_t>(most_steps, n.counters().steps());
    }
  }
  std::set<uint32_t> draining;  // `shardps drain`
  for (const ServerInfo& s : status.shard_map().servers()) {
    if (s.draining()) draining.insert(s.index());
  }
  for (const NodeStatus& n : status.nodes()) {
    const uint64_t served = n.rank() < bytes.size() ? bytes[n.rank()] : 0;
    std::string what = n.role() == SERVER ? absl::StrFormat("server %d  %s  %d bytes  epoch %d  copies %d/%d synced",
                                                            n.rank(), n.address(), served, n.applied_epoch(),
                                                            n.copies_synced(), n.copies())
                                          : absl::StrFormat("worker %d  %s", n.rank(), n.host());
    const char* state = n.left()            ? (n.left_error().empty() ? "left" : "FAILED (left on an error)")
                        : n.declared_dead() ? "DEAD"
                        : n.alive()         ? (n.role() == SERVER && draining.contains(n.rank()) ? "alive, draining" : "alive")
                                            : "SILENT";
    const bool behind = n.role() == SERVER && !n.declared_dead() && !n.left() && n.applied_epoch() < epoch;
    std::string lag;
    if (n.role() == WORKER && !n.declared_dead() && !n.left() && n.has_counters() &&
        n.counters().steps() + LagAllowance(c) < most_steps) {
      lag = absl::StrFormat(" lagging %d steps", most_steps - n.counters().steps());
    }
    absl::StrAppend(&out, absl::StrFormat("  %-78s %s (heartbeat %d ms ago)%s%s\n", what, state,
                                          n.ms_since_heartbeat(), behind ? " behind" : "", lag));
    if (n.has_counters()) absl::StrAppend(&out, RatesLine(n));
    if (!n.left_error().empty()) absl::StrAppend(&out, "    error: ", n.left_error(), "\n");
    if (!n.replaced().empty()) {
      absl::StrAppend(&out, "    in the place of a server that ",
                      n.replaced() == "declared dead" ? "was declared dead" : n.replaced(), "\n");
    }
    if (n.has_checkpoint_failure()) {
      const CheckpointFailure& f = n.checkpoint_failure();
      absl::StrAppend(&out, "    checkpoint of round ", f.round(), " into ", f.dir(), " not written here: ", f.error(),
                      "\n");
    }
  }
  if (status.shard_map().handoffs_size() > 0) {
    absl::StrAppend(&out, "  primary hand-offs under way: ",
                    absl::StrJoin(status.shard_map().handoffs(), ", ",
                                  [](std::string* o, const Handoff& h) {
                                    absl::StrAppend(o, "partition ", h.partition(), " (server ", h.from(), " -> ",
                                                    h.to(), ", since epoch ", h.epoch(), ")");
                                  }),
                    "\n");
  }
  return out;
}

void RatesSinceSnapshot(const StatusResponse& before, double seconds, StatusResponse* now) {
  std::map<uint64_t, const NodeStatus*> earlier;
  for (const NodeStatus& n : before.nodes()) {
    if (n.has_counters()) earlier[n.node_id()] = &n;
  }
  for (NodeStatus& n : *now->mutable_nodes()) {
    auto it = earlier.find(n.node_id());
    if (!n.has_counters() || it == earlier.end()) continue;
    // The time between the two heartbeats the counters came in.
    const double between =
        seconds - (static_cast<double>(n.ms_since_counters()) - static_cast<double>(it->second->ms_since_counters())) / 1e3;
    if (between > 0.001) *n.mutable_rates() = RatesBetween(it->second->counters(), n.counters(), between);
  }
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
