#include "tools/daemon_metrics.h"

#include <array>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/endpoint.h"
#include "scheduler/scheduler.h"
#include "worker/worker.h"

namespace shardps {
namespace {

// Gauges and counters of the scheduler, refreshed from one status snapshot.
class SchedulerSeries {
 public:
  static constexpr int kStates = 4;  // alive, silent, dead, left

  SchedulerSeries(MetricsRegistry& r, SchedulerDaemon& scheduler) : scheduler_(scheduler) {
    const std::array<const char*, 2> roles = {"server", "worker"};
    const std::array<const char*, kStates> states = {"alive", "silent", "dead", "left"};
    for (int role = 0; role < 2; ++role) {
      for (int state = 0; state < kStates; ++state) {
        nodes_[role][state] = r.Gauge("shardps_scheduler_nodes",
                                      "Registered nodes by role and state (silent: missed heartbeats, not yet "
                                      "declared dead; left: workers whose job ended, servers stopped or drained)",
                                      {{"role", roles[role]}, {"state", states[state]}});
      }
    }
    epoch_ = r.Gauge("shardps_scheduler_shard_map_epoch", "Epoch of the current shard map (0: no tensors yet)");
    partitions_ = r.Gauge("shardps_scheduler_partitions", "Partitions in the shard map");
    draining_ = r.Gauge("shardps_scheduler_servers_draining",
                        "Live servers being drained (shardps drain): their copies move to the others");
    moves_ = r.Gauge("shardps_scheduler_copy_moves", "Copy moves under way (a join, a drain, a rebalance)");
    handoffs_ = r.Gauge("shardps_scheduler_handoffs", "Primary hand-offs under way");
    declared_dead_ = r.Counter("shardps_scheduler_nodes_declared_dead_total",
                               "Nodes the scheduler declared dead (each publishes a new epoch)");
  }

  void Refresh() {
    const StatusResponse status = scheduler_.Status();
    std::array<std::array<int, kStates>, 2> count{};
    for (const NodeStatus& n : status.nodes()) {
      const int state = n.left() ? 3 : n.declared_dead() ? 2 : n.alive() ? 0 : 1;
      ++count[n.role() == SERVER ? 0 : 1][state];
    }
    for (int role = 0; role < 2; ++role) {
      for (int state = 0; state < kStates; ++state) nodes_[role][state].Set(count[role][state]);
    }
    epoch_.Set(status.shard_map().epoch());
    partitions_.Set(status.shard_map().partitions_size());
    int draining = 0;
    for (const ServerInfo& s : status.shard_map().servers()) draining += s.draining() && !s.dead() ? 1 : 0;
    draining_.Set(draining);
    moves_.Set(status.shard_map().moves_size());
    handoffs_.Set(status.shard_map().handoffs_size());
    // Declarations counted by the scheduler, not nodes dead now: a rejoin or
    // a replacement clears a dead entry, and a later death must still count.
    const uint64_t declared = scheduler_.NodesDeclaredDead();
    absl::MutexLock lock(&mu_);  // scrapes may run on two HTTP threads at once
    if (declared > declared_published_) {
      declared_dead_.Add(declared - declared_published_);
      declared_published_ = declared;
    }
  }

 private:
  SchedulerDaemon& scheduler_;
  std::array<std::array<MetricGauge, kStates>, 2> nodes_;
  MetricGauge epoch_, partitions_, draining_, moves_, handoffs_;
  MetricCounter declared_dead_;
  absl::Mutex mu_;
  uint64_t declared_published_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counters of one worker, advanced by what its stats gained since the last scrape.
class WorkerSeries {
 public:
  WorkerSeries(MetricsRegistry& r, const Worker& worker, uint32_t rank) : worker_(worker) {
    const MetricLabels l = {{"rank", absl::StrCat(rank)}};
    requests_ = r.Counter("shardps_worker_requests_total", "Data-plane requests sent", l);
    pushed_ = r.Counter("shardps_worker_pushed_bytes_total", "Payload bytes pushed (as sent, encoded)", l);
    pulled_ = r.Counter("shardps_worker_pulled_bytes_total", "Payload bytes pulled (as received, encoded)", l);
    breaks_ = r.Counter("shardps_worker_connection_breaks_total",
                        "Data connections to servers that broke after their handshake (cut, closed, silent)", l);
    resent_ = r.Counter("shardps_worker_resent_requests_total",
                        "Requests that waited on a broken data connection and were sent again on the next", l);
  }

  void Refresh() {
    const WorkerStats s = worker_.stats();
    absl::MutexLock lock(&mu_);
    requests_.Add(s.requests - last_.requests);
    pushed_.Add(s.bytes_pushed - last_.bytes_pushed);
    pulled_.Add(s.bytes_pulled - last_.bytes_pulled);
    breaks_.Add(s.connection_breaks - last_.connection_breaks);
    resent_.Add(s.requests_resent - last_.requests_resent);
    last_ = s;
  }

 private:
  const Worker& worker_;
  MetricCounter requests_, pushed_, pulled_, breaks_, resent_;
  absl::Mutex mu_;
  WorkerStats last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void AddWorkerMetrics(MetricsRegistry& registry, const Worker& worker, uint32_t rank) {
  auto series = std::make_shared<WorkerSeries>(registry, worker, rank);
  registry.OnScrape([series] { series->Refresh(); });
}

void AddSchedulerMetrics(MetricsRegistry& registry, SchedulerDaemon& scheduler) {
  auto series = std::make_shared<SchedulerSeries>(registry, scheduler);
  registry.OnScrape([series] { series->Refresh(); });
}

absl::Status CheckMetricsListen(const std::string& listen) {
  return ParseHostPort(listen, "--metrics-listen", {.allow_port_zero = true, .allow_wildcard = true}).status();
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> ServeMetrics(const std::string& command, const std::string& listen,
                                                             MetricsRegistry& registry) {
  if (absl::Status s = CheckMetricsListen(listen); !s.ok()) return s;
  auto exposer = MetricsExposer::Start(listen, registry);
  if (exposer.ok()) std::cerr << "shardps " << command << ": metrics on http://" << (*exposer)->address() << "/metrics\n";
  return exposer;
}

}  // namespace shardps
