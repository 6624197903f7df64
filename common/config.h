// Loading and validating the cluster configuration (proto/config.proto).
// The scheduler loads it once; every other node receives it at registration.
#ifndef SHARDPS_COMMON_CONFIG_H_
#define SHARDPS_COMMON_CONFIG_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace shardps {

// Parses protobuf text format. Errors name the file, line and field.
absl::StatusOr<ClusterConfig> ParseConfigText(absl::string_view text, absl::string_view origin);
absl::StatusOr<ClusterConfig> LoadConfigFile(const std::string& path);

// Checks every field's range; the error names the field and the allowed values.
absl::Status ValidateConfig(const ClusterConfig& config);
// The checkpoint fields alone (part of ValidateConfig): a checkpoint holds
// what the servers hold, so ssp, sum_only and compression are refused, and
// in async periodic checkpoints. `on_request`: checkpoint.dir comes from
// `shardps checkpoint` (allowed in async).
absl::Status ValidateCheckpointConfig(const ClusterConfig& config, bool on_request = false);
// The resource limits alone (part of ValidateConfig): every bound finite and > 0.
absl::Status ValidateLimits(const ResourceLimits& limits);

// Copies of each partition the cluster keeps: the config's `replication`, or
// when 0, 2 with at least two servers and 1 otherwise.
uint32_t EffectiveReplication(const ClusterConfig& config);

// The most servers a cluster has: num_servers at start, and as many as
// join the running job later (one more each when no dead one's place is
// free).
inline constexpr uint32_t kMaxServers = 1024;

// The largest `staleness` accepted: a server parks the pushes of rounds
// that are not complete yet, up to this many per worker and partition.
inline constexpr uint32_t kMaxStaleness = 256;

// Whether gradients are applied per round, all workers' at once (sync; ssp
// with staleness 0 or ssp_in_rounds), rather than one push at a time as
// they arrive (async; ssp with staleness >= 1, bounded by the staleness).
bool RoundBased(const ClusterConfig& config);

// How long a data connection may carry no whole message before it is taken
// for broken (SetHeartbeats' `silent_ms`): the longer of the heartbeat and
// request timeouts. A frame that takes longer to cross its link breaks a
// healthy connection, and then the request it belongs to has timed out.
int SilentConnectionMs(const ClusterConfig& config);
// How many rounds a worker may run ahead of the slowest: ssp's staleness, 0
// for sync (async has no bound and is not round based).
uint32_t StalenessBound(const ClusterConfig& config);

// Async with Adam and at least kAsyncMomentumFreeWorkers workers: when the
// config leaves optimizer.beta1 unset, sets it to 0 and returns a line that
// says so (empty when it changed nothing). Asynchrony acts as momentum of its
// own, about 1 - 1/W with W workers (Mitliagkas et al. 2016), so Adam's on
// top of it overshoots; measured in docs/performance.md ("Async at 8
// workers"): 0.0038 closer to sync at 8 workers, no change at 4, within the
// noise at 2 (where it is not applied).
inline constexpr uint32_t kAsyncMomentumFreeWorkers = 8;
std::string ApplyAsyncMomentumDefault(ClusterConfig* config);

// Sets one field from "path=value", e.g. "optimizer.learning_rate=0.1" or
// "consistency=async" (enum values are case-insensitive).
absl::Status SetConfigField(ClusterConfig* config, absl::string_view assignment);

// The value of one field, by the same path SetConfigField takes: a scalar as
// text (an unset field reads as its default; enums by name, strings raw), a
// message as protobuf text, compression.tensor_codecs as "name=spec" lines
// sorted by name.
absl::StatusOr<std::string> GetConfigField(const ClusterConfig& config, absl::string_view path);

// Lowercase name of an enum value, e.g. "sync".
std::string ConsistencyName(Consistency c);

}  // namespace shardps

#endif  // SHARDPS_COMMON_CONFIG_H_
