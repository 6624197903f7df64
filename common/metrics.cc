#include "common/metrics.h"

#include <exception>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardps {

void MetricCounter::Add(double value) {
  if (c_ != nullptr) c_->Increment(value);
}
void MetricGauge::Set(double value) {
  if (g_ != nullptr) g_->Set(value);
}
void MetricHistogram::Observe(double value) {
  if (h_ != nullptr) h_->Observe(value);
}

// Families by name; prometheus-cpp refuses a second family of one name.
struct MetricsRegistry::Families {
  absl::Mutex mu;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters ABSL_GUARDED_BY(mu);
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges ABSL_GUARDED_BY(mu);
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms ABSL_GUARDED_BY(mu);
};

namespace {

// Collects nothing; runs a refresh callback before the families registered
// after it are collected (the exposer collects in registration order).
class ScrapeHook : public prometheus::Collectable {
 public:
  explicit ScrapeHook(std::function<void()> refresh) : refresh_(std::move(refresh)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    refresh_();
    return {};
  }

 private:
  std::function<void()> refresh_;
};

}  // namespace

std::unique_ptr<MetricsRegistry> MetricsRegistry::Create() { return std::unique_ptr<MetricsRegistry>(new MetricsRegistry()); }

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()), families_(std::make_unique<Families>()) {}
MetricsRegistry::~MetricsRegistry() = default;

MetricCounter MetricsRegistry::Counter(const std::string& name, const std::string& help, const MetricLabels& labels) {
  absl::MutexLock lock(&families_->mu);
  auto& family = families_->counters[name];
  if (family == nullptr) family = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  return MetricCounter(&family->Add(labels));
}

MetricGauge MetricsRegistry::Gauge(const std::string& name, const std::string& help, const MetricLabels& labels) {
  absl::MutexLock lock(&families_->mu);
  auto& family = families_->gauges[name];
  if (family == nullptr) family = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  return MetricGauge(&family->Add(labels));
}

MetricHistogram MetricsRegistry::Histogram(const std::string& name, const std::string& help,
                                           const std::vector<double>& bounds, const MetricLabels& labels) {
  absl::MutexLock lock(&families_->mu);
  auto& family = families_->histograms[name];
  if (family == nullptr) family = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  return MetricHistogram(&family->Add(labels, prometheus::Histogram::BucketBoundaries(bounds)));
}

namespace {

template <typename Families>
void RemoveFrom(Families& families, const std::string& name, const MetricLabels& labels) {
  auto it = families.find(name);
  if (it != families.end() && it->second->Has(labels)) it->second->Remove(&it->second->Add(labels));
}

}  // namespace

void MetricsRegistry::Remove(const std::string& name, const MetricLabels& labels) {
  absl::MutexLock lock(&families_->mu);
  RemoveFrom(families_->counters, name, labels);
  RemoveFrom(families_->gauges, name, labels);
}

void MetricsRegistry::OnScrape(std::function<void()> refresh) {
  absl::MutexLock lock(&families_->mu);
  hooks_.push_back(std::make_shared<ScrapeHook>(std::move(refresh)));
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(const std::string& listen,
                                                                      MetricsRegistry& registry) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  std::unique_ptr<prometheus::Exposer> exposer;
  // civetweb says only "Possible problem binding to port": name the likely causes.
  const std::string cannot = absl::StrCat("cannot serve metrics on ", listen,
                                          " (is the port in use, or the host not this machine's?)");
  // civetweb gives each connection a thread until its request is in (30 s by
  // default): with two threads, two idle connections from anyone held
  // /healthz for 30 s at a time, and again as they reconnected, failing a
  // liveness probe (deploy/k8s) until the kubelet killed a serving process.
  // A scrape sends its request at once; more threads and a short deadline
  // for it leave an attacker needing kHttpThreads connections made again
  // every kRequestTimeoutMs instead (README, Security: not protected).
  try {
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", absl::StrCat(kHttpThreads), "request_timeout_ms",
        absl::StrCat(kRequestTimeoutMs)});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(cannot, ": ", e.what()));
  }
  std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(cannot);
  {
    absl::MutexLock lock(&registry.families_->mu);
    for (const auto& hook : registry.hooks_) {
      exposer->RegisterCollectable(std::static_pointer_cast<ScrapeHook>(hook), "/metrics");
    }
  }
  exposer->RegisterCollectable(registry.registry_, "/metrics");
  auto health = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge().Name("shardps_up").Help("1 while the process serves").Register(*health).Add({}).Set(1);
  exposer->RegisterCollectable(health, "/healthz");
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return std::unique_ptr<MetricsExposer>(
      new MetricsExposer(std::move(exposer), std::move(health), absl::StrCat(host, ":", ports[0])));
}

MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                               std::shared_ptr<prometheus::Registry> health, std::string address)
    : exposer_(std::move(exposer)), health_(std::move(health)), address_(std::move(address)) {}
MetricsExposer::~MetricsExposer() = default;

}  // namespace shardps
