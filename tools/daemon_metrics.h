// `--metrics-listen` for the daemons: the scheduler's membership series and
// the HTTP listener that serves a registry.
#ifndef SHARDPS_TOOLS_DAEMON_METRICS_H_
#define SHARDPS_TOOLS_DAEMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace shardps {

class SchedulerDaemon;
class Worker;

// Series read from `scheduler`'s status at every scrape: nodes by role and
// state, shard-map epoch, partitions, nodes declared dead. `scheduler` is
// borrowed and must outlive the registry's exposer.
// REQUIRES: called before MetricsExposer::Start on `registry`.
void AddSchedulerMetrics(MetricsRegistry& registry, SchedulerDaemon& scheduler);

// Series read from `worker`'s stats at every scrape (label rank): requests
// sent, payload bytes pushed and pulled. `worker` is borrowed and must
// outlive the registry's exposer.
// REQUIRES: called before MetricsExposer::Start on `registry`.
void AddWorkerMetrics(MetricsRegistry& registry, const Worker& worker, uint32_t rank);

// InvalidArgument, naming --metrics-listen, unless `listen` is HOST:PORT
// (port 0: any free port). Lets a command refuse the flag before it waits
// for anything.
absl::Status CheckMetricsListen(const std::string& listen);

// Starts serving `registry` on `listen` (HOST:PORT) and tells stderr where,
// as "shardps COMMAND: metrics on http://HOST:PORT/metrics".
absl::StatusOr<std::unique_ptr<MetricsExposer>> ServeMetrics(const std::string& command, const std::string& listen,
                                                             MetricsRegistry& registry);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_DAEMON_METRICS_H_
