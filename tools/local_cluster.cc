#include "tools/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "compression/codec_params.h"
#include "compression/codec_policy.h"
#include "google/protobuf/util/message_differencer.h"

namespace shardps {
namespace {

std::string VerboseFlag(bool verbose) { return verbose ? "--verbose" : "--verbose=false"; }

// A daemon started for one job: Ctrl-C at the terminal stops the job's
// workers while the daemons, which ignore it, still serve them, and we stop
// the daemons after; the daemons end with us however we end. They stay in
// our process group, so Ctrl-Z pauses the whole job alike.
absl::StatusOr<ChildProcess> SpawnDaemon(const std::string& name, const std::vector<std::string>& argv) {
  SpawnOptions options = SpawnOptions::JobChild();
  options.ignore_interrupt = true;
  return Spawn(name, argv, options);
}

}  // namespace

absl::StatusOr<ClusterConfig> LoadLocalConfig(const std::string& path, int64_t servers, int64_t workers) {
  ClusterConfig config;
  if (!path.empty()) {
    auto loaded = LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    config = *loaded;
  }
  config.set_num_servers(servers);
  config.set_num_workers(workers);
  // Every process on 127.0.0.1: a server's data port takes a connection from
  // each (two while one replaces a broken one), which the per-address limit
  // (server/accepted_connections.h) would refuse past 32 processes; a few
  // more for servers that join or replace a dead one. A config's own wins.
  const auto one_host = static_cast<uint32_t>(2 * std::clamp<int64_t>(servers + workers, 0, 1 << 20) + 8);
  if (!config.limits().has_max_connections_per_address() && one_host > config.limits().max_connections_per_address()) {
    config.mutable_limits()->set_max_connections_per_address(one_host);
  }
  return config;
}

absl::Status SetCompressionFlag(const std::string& codec, ClusterConfig* config) {
  if (codec.empty()) return absl::OkStatus();
  if (auto parsed = compression::ParseCodecSpec(codec); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--compression: ", parsed.status().message()));
  }
  config->mutable_compression()->set_codec(codec);
  return absl::OkStatus();
}

std::vector<MeasuredDefault> ApplyMeasuredDefaults(ClusterConfig* config) {
  std::vector<MeasuredDefault> lines;
  for (auto apply : {&compression::ApplyCompressionRecipe, &ApplyAsyncMomentumDefault}) {
    const ClusterConfig before = *config;
    std::string line = apply(config);
    if (line.empty()) continue;
    lines.push_back({std::move(line), !google::protobuf::util::MessageDifferencer::Equals(before, *config)});
  }
  return lines;
}

absl::Status ApplyConfigSets(const std::vector<std::string>& sets, ClusterConfig* config) {
  for (const std::string& s : sets) {
    if (absl::Status st = SetConfigField(config, s); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", s, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status FinishLocalConfig(const std::vector<std::string>& sets, ClusterConfig* config) {
  if (absl::Status s = ApplyConfigSets(sets, config); !s.ok()) return s;
  // A warning is the scheduler's to say: it applies the same defaults to the
  // config written for it, finds set what was set here, and warns again.
  for (const MeasuredDefault& d : ApplyMeasuredDefaults(config)) {
    if (d.set) std::cerr << "shardps: " << d.line << "\n";
  }
  if (absl::Status s = ValidateConfig(*config); !s.ok()) return s;
  return compression::ValidateCompressionConfig(*config);
}

absl::StatusOr<ChildProcess> SpawnScheduler(const std::string& listen, const std::string& config_file,
                                            const std::string& port_file, bool verbose,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {SelfExecutable(), "scheduler", "--listen", listen, "--config", config_file,
                                   "--port-file", port_file, VerboseFlag(verbose)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return SpawnDaemon("scheduler", argv);
}

int FreeSchedulerPort() {
  constexpr int kLowest = 10000;  // below: well-known and registered services
  int ephemeral = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral;
  if (ephemeral <= kLowest + 100) return 0;
  std::mt19937 random(static_cast<uint32_t>(getpid()) ^ static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())));
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = kLowest + static_cast<int>(random() % static_cast<uint32_t>(ephemeral - kLowest));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    if (free) return port;
  }
  return 0;
}

absl::Status SpawnServers(const std::string& address, int64_t count, bool verbose,
                          const std::function<std::vector<std::string>(int)>& extra,
                          std::vector<ChildProcess>& daemons) {
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> argv = {SelfExecutable(), "server", "--scheduler", address, "--listen",
                                     "tcp://127.0.0.1:0", VerboseFlag(verbose)};
    if (extra) {
      std::vector<std::string> more = extra(i);
      argv.insert(argv.end(), more.begin(), more.end());
    }
    auto server = SpawnDaemon(absl::StrCat("server ", i), argv);
    if (!server.ok()) return server.status();
    daemons.push_back(*server);
  }
  return absl::OkStatus();
}

}  // namespace shardps
