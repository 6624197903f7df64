// `shardps run`: the scheduler, a server or a worker, chosen and addressed by
// the DMLC_* environment (tools/run_plan.h). The only place the `shardps`
// command reads launcher variables.
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_join.h"
#include "tools/commands.h"
#include "tools/run_plan.h"

namespace shardps {

int RunCommand(const Args& args) {
  std::map<std::string, std::string> env;
  for (const std::string& name : RunEnvironmentVariables()) {
    if (const char* v = std::getenv(name.c_str())) env[name] = v;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  auto plan = PlanRun(args, env, host);
  if (!plan.ok()) {
    std::cerr << "shardps run: " << plan.status().message() << "\n";
    return 2;
  }
  if (plan->help) {
    std::cout << RunUsage();
    return 0;
  }
  const std::string line = "shardps " + plan->command + " " + absl::StrJoin(plan->args, " ");
  if (plan->dry_run) {
    std::cout << line << "\n";
    return 0;
  }
  std::cerr << "shardps run: " << line << "\n";
  if (plan->command == "scheduler") return SchedulerCommand(plan->args);
  if (plan->command == "server") return ServerCommand(plan->args);
  return TrainCommand(plan->args);
}

}  // namespace shardps
