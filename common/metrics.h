// Prometheus metrics for the daemons, behind plain handles so that callers
// never include prometheus-cpp's headers.
//
//   auto metrics = MetricsRegistry::Create();
//   MetricCounter pushes = metrics->Counter("shardps_server_requests_total", "...", {{"op", "push"}});
//   pushes.Add(1);                                  // lock-free (atomic)
//   auto exposer = MetricsExposer::Start("0.0.0.0:9100", *metrics);
//
// A handle is resolved once (name + labels -> series) and is then a pointer:
// Add/Set/Observe take no lock and look nothing up, so a hot thread may use
// them. Handles borrow from their registry, which must outlive them. A
// default-constructed handle does nothing (metrics off).
//
// The exposer serves the registry as Prometheus text on GET /metrics and a
// liveness answer on GET /healthz (HTTP 200 while the process serves), from
// the HTTP library's own threads.
#ifndef SHARDPS_COMMON_METRICS_H_
#define SHARDPS_COMMON_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
class Exposer;
}  // namespace prometheus

namespace shardps {

using MetricLabels = std::map<std::string, std::string>;

// Monotonic count (name ends in _total).
class MetricCounter {
 public:
  MetricCounter() = default;
  explicit MetricCounter(prometheus::Counter* c) : c_(c) {}
  // REQUIRES: value >= 0.
  void Add(double value);

 private:
  prometheus::Counter* c_ = nullptr;
};

// A value that goes up and down (a depth, a count of live nodes, an epoch).
class MetricGauge {
 public:
  MetricGauge() = default;
  explicit MetricGauge(prometheus::Gauge* g) : g_(g) {}
  void Set(double value);

 private:
  prometheus::Gauge* g_ = nullptr;
};

// Distribution of observations (name ends in the unit, e.g. _seconds).
class MetricHistogram {
 public:
  MetricHistogram() = default;
  explicit MetricHistogram(prometheus::Histogram* h) : h_(h) {}
  void Observe(double value);

 private:
  prometheus::Histogram* h_ = nullptr;
};

// Owns the metric families of one process. Registration (Counter, Gauge,
// Histogram, OnScrape) is thread-safe; so are the handles it returns.
class MetricsRegistry {
 public:
  static std::unique_ptr<MetricsRegistry> Create();
  ~MetricsRegistry();

  // Same name twice: the same family (help of the first call); same labels
  // twice: the same series.
  MetricCounter Counter(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  MetricGauge Gauge(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  // `bounds`: the buckets' upper bounds, ascending (+Inf is implicit).
  MetricHistogram Histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                            const MetricLabels& labels = {});

  // Drops the counter or gauge series `name` + `labels` (a partition that
  // left this server); nothing if there is none. REQUIRES: no handle to it
  // is used afterwards.
  void Remove(const std::string& name, const MetricLabels& labels);

  // `refresh` runs on the HTTP thread before every scrape of /metrics, to set
  // gauges read from elsewhere (the scheduler's membership). It must be
  // thread-safe and must not block for long.
  // REQUIRES: called before MetricsExposer::Start for this registry.
  void OnScrape(std::function<void()> refresh);

 private:
  friend class MetricsExposer;
  struct Families;
  MetricsRegistry();
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  std::vector<std::shared_ptr<void>> hooks_;  // scrape hooks (prometheus::Collectable)
};

// An HTTP listener serving a registry (GET /metrics) and a liveness answer
// (GET /healthz). Stops listening when destroyed.
class MetricsExposer {
 public:
  // `listen`: HOST:PORT; port 0 picks a free port (see address()). `registry`
  // is borrowed and must outlive the exposer. Fails if it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(const std::string& listen, MetricsRegistry& registry);
  ~MetricsExposer();

  // HOST:PORT actually bound.
  const std::string& address() const { return address_; }

  // HTTP threads, each serving one connection at a time, and how long a
  // connection may take to send its request before it is closed: fewer idle
  // or slow connections than threads delay no scrape, more delay one by at
  // most the timeout per round of them.
  static constexpr int kHttpThreads = 8;
  static constexpr int kRequestTimeoutMs = 2000;

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, std::shared_ptr<prometheus::Registry> health,
                 std::string address);
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> health_;
  std::string address_;
};

}  // namespace shardps

#endif  // SHARDPS_COMMON_METRICS_H_
