// `shardps count-updates`: lost and duplicate updates of a finished job from
// its servers' --updates-file and its workers' --result-file, counted as
// `shardps local` counts them (tools/update_accounting.h), for jobs started
// by other launchers (tools/chaos.sh).
#include <iostream>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/local_cluster.h"
#include "tools/update_accounting.h"

namespace shardps {

int CountUpdatesCommand(const Args& args) {
  std::vector<std::string> sets, updates_files, result_files;
  std::string config_path;
  CliFlags flags("count-updates");
  flags.String("config", &config_path, "the job's cluster configuration file (protobuf text), if it had one");
  flags.Repeated("set", &sets,
                 "a config field the job's scheduler was given, e.g. --set consistency=async (consistency, staleness, "
                 "ssp_in_rounds and checkpoint.restore_round decide how updates are counted)");
  flags.Repeated("updates", &updates_files,
                 "a server's --updates-file, one flag per server (a file that does not exist: a server that did "
                 "not survive)");
  flags.Repeated("result", &result_files,
                 "a worker's train --result-file, one flag per worker in rank order (a file that does not exist: "
                 "a worker that did not finish)");
  auto usage_error = [](const absl::Status& s) {
    std::cerr << "shardps count-updates: " << s.message() << "\n";
    return 2;
  };
  if (absl::Status s = flags.Parse(args); !s.ok()) return usage_error(s);
  if (flags.help()) return 0;
  if (updates_files.empty() || result_files.empty()) {
    return usage_error(absl::InvalidArgumentError("needs --updates (one per server) and --result (one per worker)"));
  }
  ClusterConfig config;
  if (!config_path.empty()) {
    auto loaded = LoadConfigFile(config_path);
    if (!loaded.ok()) return usage_error(loaded.status());
    config = *std::move(loaded);
  }
  if (absl::Status s = ApplyConfigSets(sets, &config); !s.ok()) return usage_error(s);
  std::map<int, WorkerAcks> acked;
  for (size_t r = 0; r < result_files.size(); ++r) acked[static_cast<int>(r)] = ReadWorkerAcks(result_files[r]);
  const std::map<uint64_t, PartitionApplied> applied = ReadServerUpdates(updates_files);
  const bool round_based = RoundBased(config);
  const UpdateAccounting counted =
      AccountUpdates(!round_based, applied, acked, round_based ? config.checkpoint().restore_round() : 0);
  std::cout << absl::StrFormat("{\"lost_updates\": %d, \"duplicate_updates\": %d, \"partitions_reported\": %d}\n",
                               counted.lost, counted.duplicates, applied.size());
  return counted.lost + counted.duplicates == 0 ? 0 : 1;
}

}  // namespace shardps
