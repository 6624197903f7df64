// What `shardps local` and `shardps launch` share: the cluster config built
// from a file, the process counts and --set overrides, and the scheduler and
// server processes started on loopback.
#ifndef SHARDPS_TOOLS_LOCAL_CLUSTER_H_
#define SHARDPS_TOOLS_LOCAL_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "tools/process.h"

namespace shardps {

// The config file at `path` (empty: defaults) with the process counts set.
absl::StatusOr<ClusterConfig> LoadLocalConfig(const std::string& path, int64_t servers, int64_t workers);
// Sets the push codec from `--compression CODEC` (empty: the config's);
// InvalidArgument naming the flag for a spec that does not parse.
absl::Status SetCompressionFlag(const std::string& codec, ClusterConfig* config);
// A line of ApplyMeasuredDefaults: what a default set (`set`), or a warning
// that none keeps the accuracy of this config (the config is unchanged).
struct MeasuredDefault {
  std::string line;
  bool set = false;
};
// The defaults measured to keep accuracy where the config leaves the fields
// unset: the lossy codecs' recipe and async's Adam momentum. Returns a line
// for each that changed something or warns, saying what.
std::vector<MeasuredDefault> ApplyMeasuredDefaults(ClusterConfig* config);
// Applies each `--set field=value` to `config`; an error names the flag and
// its value (a command line that cannot run: exit 2).
absl::Status ApplyConfigSets(const std::vector<std::string>& sets, ClusterConfig* config);
// Applies each `--set field=value` and the measured defaults (printing what
// they set; the scheduler started with the result says the warnings), then
// validates the result as the scheduler would (fields and compression).
absl::Status FinishLocalConfig(const std::vector<std::string>& sets, ClusterConfig* config);

// The daemons below ignore SIGINT (Ctrl-C at the terminal stops the job, not
// them: the caller stops them after it) and get SIGTERM when this process
// ends, SIGKILLed or not (SpawnOptions). Call from the main thread.

// Starts `shardps scheduler` on `listen` with the config file and writes its
// address to `port_file`, with `extra` flags.
absl::StatusOr<ChildProcess> SpawnScheduler(const std::string& listen, const std::string& config_file,
                                            const std::string& port_file, bool verbose,
                                            const std::vector<std::string>& extra = {});
// A loopback port that is free now, below the kernel's ephemeral range
// (ip_local_port_range): a scheduler restarted after a kill must bind its
// port again, and while it is down any new connection may take an
// ephemeral port as its local end. 0 (any port) where that range leaves no
// room or no free port is found.
int FreeSchedulerPort();
// Starts `count` servers of the scheduler at `address` on loopback, appending
// them to `daemons`; `extra(i)` gives server i's additional flags.
absl::Status SpawnServers(const std::string& address, int64_t count, bool verbose,
                          const std::function<std::vector<std::string>(int)>& extra,
                          std::vector<ChildProcess>& daemons);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_LOCAL_CLUSTER_H_
