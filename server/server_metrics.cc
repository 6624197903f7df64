#include "server/server_metrics.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr std::chrono::milliseconds kPublishEvery(100);

// Label of DataHeader op value `op` (proto/data.proto).
const char* OpLabel(size_t op) {
  switch (op) {
    case 1: return "init";
    case 2: return "push";
    case 3: return "pull";
    case 4: return "push_pull";
    case 6: return "replicate";
    default: return "other";
  }
}

}  // namespace

ServerMetrics::ServerMetrics(MetricsRegistry& r, uint32_t server_index, size_t max_partitions)
    : partitions_(r, server_index, max_partitions) {
  const std::string server = absl::StrCat(server_index);
  for (size_t op = 0; op < requests_.size(); ++op) {
    requests_[op] = r.Counter("shardps_server_requests_total", "Data requests received, by op",
                              {{"server", server}, {"op", OpLabel(op)}});
  }
  for (size_t code = 1; code < errors_.size(); ++code) {
    const std::string kind = absl::AsciiStrToLower(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
    errors_[code] = r.Counter("shardps_server_errors_total",
                              "Requests answered with an error (and backups' refusals), by status code",
                              {{"server", server}, {"code", kind}});
  }
  const MetricLabels l = {{"server", server}};
  bytes_in_ = r.Counter("shardps_server_received_bytes_total", "Payload bytes received (as sent, encoded)", l);
  bytes_out_ = r.Counter("shardps_server_sent_bytes_total", "Payload bytes sent in answers (as sent, encoded)", l);
  updates_ = r.Counter("shardps_server_updates_total",
                       "Optimizer passes applied (sync, ssp: rounds completed per partition; async: pushes, or "
                       "batches of pushes drained together)",
                       l);
  replicated_ = r.Counter("shardps_server_replicated_updates_total", "Updates sent to backups (one per copy)", l);
  replicated_bytes_ = r.Counter("shardps_server_replicated_bytes_total",
                                "Payload bytes of the updates sent to backups (one per copy)", l);
  stale_gradients_ = r.Counter("shardps_server_gradients_total",
                               "Gradients applied whose staleness was measured (they say what they were computed on)", l);
  staleness_sum_ = r.Counter("shardps_server_gradient_staleness_rounds_total",
                             "Staleness of the gradients applied, summed, in rounds (async: W pushes = 1 round); "
                             "divide its rate by shardps_server_gradients_total's for the mean",
                             l);
  staleness_max_ = r.Gauge("shardps_server_gradient_staleness_max_rounds",
                           "Largest staleness of a gradient applied so far, in rounds", l);
  promotions_ = r.Counter("shardps_server_promotions_total", "Partitions this server took over as primary", l);
  snapshots_sent_ = r.Counter("shardps_server_snapshots_sent_total",
                              "Whole partitions sent to backup copies (re-created, refused an update, or their "
                              "link broke with updates unconfirmed)",
                              l);
  snapshot_probes_ = r.Counter("shardps_server_snapshot_probes_total",
                               "Backups asked whether a snapshot that stayed unconfirmed for a check arrived", l);
  const char* refused_help = "Requests refused to protect the server, by reason";
  non_finite_ = r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "non_finite"}});
  bad_request_ids_ =
      r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "request_id"}});
  over_inflight_ =
      r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "inflight_bytes"}});
  over_connections_ =
      r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "connections"}});
  unsealed_ = r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "unsealed"}});
  wrong_sender_ =
      r.Counter("shardps_server_refused_total", refused_help, {{"server", server}, {"reason", "wrong_sender"}});
  const char* closed_help = "Data connections closed to protect the server, by reason";
  closed_over_address_ = r.Counter("shardps_server_closed_connections_total", closed_help,
                                   {{"server", server}, {"reason", "per_address"}});
  closed_no_message_ =
      r.Counter("shardps_server_closed_connections_total", closed_help, {{"server", server}, {"reason", "no_message"}});
  handling_ = r.Histogram("shardps_server_request_handling_seconds",
                          "Engine-thread time per request: validate, apply, answer or park (not time parked)",
                          {1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3, 16e-3, 64e-3, 256e-3}, l);
  waiting_pulls_ = r.Gauge("shardps_server_waiting_pulls", "Pulls waiting for their round", l);
  parked_pushes_ = r.Gauge("shardps_server_parked_pushes", "Pushes parked for a later round", l);
  deferred_ = r.Gauge("shardps_server_deferred_requests", "Requests waiting for a newer shard-map epoch", l);
  unconfirmed_ = r.Gauge("shardps_server_unconfirmed_answers", "Answers held until the backups confirm", l);
  replication_lag_ = r.Gauge("shardps_server_replication_lag_updates",
                             "Updates sent to backups and not yet confirmed by all of them", l);
  bounded_ = r.Gauge("shardps_server_bounded_answers", "SSP push answers held by the staleness bound", l);
  handoff_held_ = r.Gauge("shardps_server_handoff_held_requests",
                          "Requests held while a partition's primary role is handed off", l);
  epoch_ = r.Gauge("shardps_server_shard_map_epoch", "Shard-map epoch this server serves", l);
}

void ServerMetrics::MaybePublish(const PartitionEngine& engine, bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now < next_) return;
  next_ = now + kPublishEvery;
  const EngineStats& s = engine.stats();
  for (size_t i = 0; i < requests_.size(); ++i) requests_[i].Add(s.requests_by_op[i] - last_.requests_by_op[i]);
  for (size_t i = 1; i < errors_.size(); ++i) errors_[i].Add(s.errors_by_code[i] - last_.errors_by_code[i]);
  bytes_in_.Add(s.bytes_in - last_.bytes_in);
  bytes_out_.Add(s.bytes_out - last_.bytes_out);
  updates_.Add(s.updates - last_.updates);
  replicated_.Add(s.replicated - last_.replicated);
  replicated_bytes_.Add(s.replicated_bytes - last_.replicated_bytes);
  promotions_.Add(s.promotions - last_.promotions);
  snapshots_sent_.Add(s.snapshots_sent - last_.snapshots_sent);
  snapshot_probes_.Add(s.snapshot_probes - last_.snapshot_probes);
  non_finite_.Add(s.non_finite - last_.non_finite);
  bad_request_ids_.Add(s.bad_request_ids - last_.bad_request_ids);
  stale_gradients_.Add(s.stale_gradients - last_.stale_gradients);
  staleness_sum_.Add(s.staleness_sum - last_.staleness_sum);
  staleness_max_.Set(s.staleness_max);
  last_ = s;
  const EngineQueues q = engine.Queues();
  waiting_pulls_.Set(q.waiting_pulls);
  parked_pushes_.Set(q.parked_pushes);
  deferred_.Set(q.deferred);
  unconfirmed_.Set(q.unconfirmed);
  replication_lag_.Set(q.replication_lag);
  bounded_.Set(q.bounded);
  handoff_held_.Set(q.handoff_held);
  epoch_.Set(engine.epoch());
  size_t held = 0;
  const std::vector<PartitionReport> reports = engine.Reports(partitions_.max_partitions(), &held);
  partitions_.Publish(reports, held, now);
}

}  // namespace shardps
