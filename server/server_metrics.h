// The Prometheus series of one parameter server, fed from its engine thread.
//
// The engine counts in plain integers (EngineStats); MaybePublish, called by
// the engine thread once per poll-loop iteration, adds what changed to the
// Prometheus counters at most every 100 ms, so counting costs the request
// path nothing and a scrape is at most that much behind. Per request there is
// only ObserveHandling: two clock reads and a lock-free histogram observation.
// Not thread-safe: one engine thread drives it. The registry is borrowed and must outlive it.
#ifndef SHARDPS_SERVER_SERVER_METRICS_H_
#define SHARDPS_SERVER_SERVER_METRICS_H_

#include <array>
#include <chrono>
#include <cstdint>

#include "common/metrics.h"
#include "server/partition_engine.h"
#include "server/partition_metrics.h"

namespace shardps {

class ServerMetrics {
 public:
  // Resolves every series of server `server_index` (label server="N") once;
  // per-partition series for at most `max_partitions` partitions
  // (server/partition_metrics.h).
  ServerMetrics(MetricsRegistry& registry, uint32_t server_index, size_t max_partitions);

  // Publishes `engine`'s counts if 100 ms passed since the last time (or
  // `force`, e.g. when draining).
  void MaybePublish(const PartitionEngine& engine, bool force = false);

  // One request's handling time in the engine thread (validate, apply,
  // answer or park; not the time a parked request then waits).
  // Requests the server itself refused before the engine saw them.
  void CountOverInflight() { over_inflight_.Add(1); }
  void CountOverConnections() { over_connections_.Add(1); }
  // Secured data plane: not sealed by a node of the map; a key speaking for
  // another node (server/sender_roles.h).
  void CountUnsealed() { unsealed_.Add(1); }
  void CountWrongSender() { wrong_sender_.Add(1); }
  // Data connections closed (server/accepted_connections.h): over
  // limits.max_connections_per_address, and no valid message in time.
  void CountClosedConnections(uint64_t over_address_limit, uint64_t no_message_in_time) {
    if (over_address_limit != 0) closed_over_address_.Add(over_address_limit);
    if (no_message_in_time != 0) closed_no_message_.Add(no_message_in_time);
  }

  void ObserveHandling(std::chrono::steady_clock::duration d) {
    handling_.Observe(std::chrono::duration<double>(d).count());
  }

 private:
  std::chrono::steady_clock::time_point next_ = {};
  EngineStats last_;
  std::array<MetricCounter, 7> requests_;   // by op
  std::array<MetricCounter, 17> errors_;    // by status code
  MetricCounter bytes_in_, bytes_out_, updates_, replicated_, replicated_bytes_, promotions_;
  MetricCounter snapshots_sent_, snapshot_probes_;
  // shardps_server_refused_total{reason}.
  MetricCounter non_finite_, bad_request_ids_, over_inflight_, over_connections_, unsealed_, wrong_sender_;
  // shardps_server_closed_connections_total{reason}.
  MetricCounter closed_over_address_, closed_no_message_;
  MetricCounter stale_gradients_, staleness_sum_;
  MetricGauge staleness_max_;
  MetricHistogram handling_;
  MetricGauge waiting_pulls_, parked_pushes_, deferred_, unconfirmed_, replication_lag_, bounded_, handoff_held_,
      epoch_;
  PartitionMetrics partitions_;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_SERVER_METRICS_H_
