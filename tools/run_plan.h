// `shardps run`: which command to run, with which flags, from the DMLC_*
// environment that launchers such as Kubeflow's MXJob operator set. Pure:
// the caller hands in the environment and the host name, so the mapping is
// tested without touching the process environment.
#ifndef SHARDPS_TOOLS_RUN_PLAN_H_
#define SHARDPS_TOOLS_RUN_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardps {

// The variables PlanRun reads; the caller copies these (and only these) out
// of the process environment.
const std::vector<std::string>& RunEnvironmentVariables();

struct RunPlan {
  std::string command;             // "scheduler", "server" or "train"
  std::vector<std::string> args;   // its flags: derived ones first, then the caller's
  bool dry_run = false;            // print the command line instead of running it
  bool help = false;               // `shardps run --help`
};

// args: what followed `shardps run`. Its own flags are `--role ROLE` (wins over
// DMLC_ROLE) and `--dry-run`; every other argument goes to the command, and a
// flag given there is never derived from the environment (explicit flags win).
// hostname: the fallback for the address a server advertises.
absl::StatusOr<RunPlan> PlanRun(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& env, const std::string& hostname);

// `shardps run --help` text: the variables and what they become.
std::string RunUsage();

}  // namespace shardps

#endif  // SHARDPS_TOOLS_RUN_PLAN_H_
