// The per-partition Prometheus series of one server: each partition's
// version and its age, the staleness of the gradients applied to it, and on
// a primary the replication lag of each backup copy. Labels: server,
// partition (id), tensor, role (primary, backup); the lag adds backup
// (server index).
//
// Cardinality is bounded: only the `max_partitions` partitions of lowest id
// held here get series (ServerOptions::metrics_max_partitions); the rest are
// counted in shardps_server_partitions_unreported and still show in the
// server-wide series. A partition that leaves the server, or changes role,
// has its series removed (its counters start again under the new role).
//
// Not thread-safe: the engine thread drives it through ServerMetrics. The
// registry is borrowed and must outlive it.
#ifndef SHARDPS_SERVER_PARTITION_METRICS_H_
#define SHARDPS_SERVER_PARTITION_METRICS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "server/partition_engine.h"

namespace shardps {

class PartitionMetrics {
 public:
  PartitionMetrics(MetricsRegistry& registry, uint32_t server_index, size_t max_partitions);

  size_t max_partitions() const { return max_; }

  // Brings the series to `reports` (PartitionEngine::Reports(max_partitions()))
  // seen at `now`; `held`: the partitions held in all.
  void Publish(const std::vector<PartitionReport>& reports, size_t held, std::chrono::steady_clock::time_point now);

 private:
  struct Series {
    bool primary = true;
    MetricLabels labels;
    MetricGauge version, age, staleness_max;
    MetricCounter gradients, staleness_sum;
    uint64_t gradients_published = 0;
    double sum_published = 0;
    uint64_t last_version = 0;
    std::chrono::steady_clock::time_point changed;  // when last_version was first seen
    std::map<uint32_t, MetricGauge> lag;            // by backup server index
  };

  Series NewSeries(const PartitionReport& r, std::chrono::steady_clock::time_point now);
  void Update(Series& s, const PartitionReport& r, std::chrono::steady_clock::time_point now);
  void Drop(const Series& s);
  MetricLabels LagLabels(const Series& s, uint32_t backup) const;

  MetricsRegistry& registry_;
  const std::string server_;
  const size_t max_;
  MetricGauge unreported_;
  std::map<uint64_t, Series> series_;  // by partition id
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_PARTITION_METRICS_H_
