#include "server/partition_metrics.h"

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr char kVersion[] = "shardps_server_partition_version";
constexpr char kAge[] = "shardps_server_partition_version_age_seconds";
constexpr char kGradients[] = "shardps_server_partition_gradients_total";
constexpr char kStalenessSum[] = "shardps_server_partition_gradient_staleness_rounds_total";
constexpr char kStalenessMax[] = "shardps_server_partition_gradient_staleness_max_rounds";
constexpr char kLag[] = "shardps_server_partition_replication_lag_updates";

}  // namespace

PartitionMetrics::PartitionMetrics(MetricsRegistry& registry, uint32_t server_index, size_t max_partitions)
    : registry_(registry), server_(absl::StrCat(server_index)), max_(max_partitions) {
  unreported_ = registry_.Gauge("shardps_server_partitions_unreported",
                                "Partitions held beyond --metrics-max-partitions, which get no per-partition series",
                                {{"server", server_}});
}

void PartitionMetrics::Publish(const std::vector<PartitionReport>& reports, size_t held,
                               std::chrono::steady_clock::time_point now) {
  unreported_.Set(static_cast<double>(held > reports.size() ? held - reports.size() : 0));
  std::map<uint64_t, Series> kept;
  for (const PartitionReport& r : reports) {
    auto it = series_.find(r.partition);
    Series s;
    if (it != series_.end() && it->second.primary == r.primary) {
      s = std::move(it->second);
      series_.erase(it);
    } else {
      s = NewSeries(r, now);
    }
    Update(s, r, now);
    kept.emplace(r.partition, std::move(s));
  }
  for (const auto& [id, s] : series_) Drop(s);  // gone, past the bound, or in another role
  series_ = std::move(kept);
}

PartitionMetrics::Series PartitionMetrics::NewSeries(const PartitionReport& r,
                                                     std::chrono::steady_clock::time_point now) {
  Series s;
  s.primary = r.primary;
  s.labels = {{"server", server_},
              {"partition", absl::StrCat(r.partition)},
              {"tensor", r.tensor},
              {"role", r.primary ? "primary" : "backup"}};
  s.version = registry_.Gauge(kVersion, "Updates applied to the partition (sync, ssp: rounds; async: pushes)",
                              s.labels);
  s.age = registry_.Gauge(kAge,
                          "Seconds since the partition's version last changed (or since this server saw it "
                          "first), to 0.1 s",
                          s.labels);
  s.gradients = registry_.Counter(kGradients,
                                  "Gradients applied to the partition whose staleness was measured (primaries)",
                                  s.labels);
  s.staleness_sum = registry_.Counter(kStalenessSum, "Staleness of those gradients, summed, in rounds", s.labels);
  s.staleness_max = registry_.Gauge(kStalenessMax, "Largest staleness of a gradient applied to the partition, in rounds",
                                    s.labels);
  s.last_version = r.version;
  s.changed = now;
  return s;
}

void PartitionMetrics::Update(Series& s, const PartitionReport& r, std::chrono::steady_clock::time_point now) {
  if (r.version != s.last_version) {
    s.last_version = r.version;
    s.changed = now;
  }
  s.version.Set(static_cast<double>(r.version));
  s.age.Set(std::chrono::duration<double>(now - s.changed).count());
  if (r.stale_gradients < s.gradients_published) s.gradients_published = 0;  // a new copy
  s.gradients.Add(static_cast<double>(r.stale_gradients - s.gradients_published));
  s.gradients_published = r.stale_gradients;
  if (r.staleness_sum < s.sum_published) s.sum_published = 0;
  s.staleness_sum.Add(r.staleness_sum - s.sum_published);
  s.sum_published = r.staleness_sum;
  s.staleness_max.Set(r.staleness_max);
  std::map<uint32_t, MetricGauge> lag;
  for (const auto& [backup, updates] : r.backup_lag) {
    auto it = s.lag.find(backup);
    MetricGauge g = it != s.lag.end() ? it->second
                                      : registry_.Gauge(kLag,
                                                        "Updates of the partition sent to a backup copy and not "
                                                        "confirmed yet (primaries)",
                                                        LagLabels(s, backup));
    if (it != s.lag.end()) s.lag.erase(it);
    g.Set(static_cast<double>(updates));
    lag.emplace(backup, g);
  }
  for (const auto& [backup, g] : s.lag) registry_.Remove(kLag, LagLabels(s, backup));
  s.lag = std::move(lag);
}

void PartitionMetrics::Drop(const Series& s) {
  for (const char* name : {kVersion, kAge, kGradients, kStalenessSum, kStalenessMax}) registry_.Remove(name, s.labels);
  for (const auto& [backup, g] : s.lag) registry_.Remove(kLag, LagLabels(s, backup));
}

MetricLabels PartitionMetrics::LagLabels(const Series& s, uint32_t backup) const {
  MetricLabels labels = s.labels;
  labels["backup"] = absl::StrCat(backup);
  return labels;
}

}  // namespace shardps
