// The subcommands of the `shardps` tool. Each takes its arguments (after the
// command name) and returns the process exit code; errors are printed to
// stderr saying what failed and where.
#ifndef SHARDPS_TOOLS_COMMANDS_H_
#define SHARDPS_TOOLS_COMMANDS_H_

#include <string>
#include <vector>

namespace shardps {

using Args = std::vector<std::string>;

int SchedulerCommand(const Args& args);
int ServerCommand(const Args& args);
int TrainCommand(const Args& args);
int StatusCommand(const Args& args);
int CheckpointCommand(const Args& args);
int DrainCommand(const Args& args);
int CertsCommand(const Args& args);
int LocalCommand(const Args& args);
int LaunchCommand(const Args& args);
int BenchCommand(const Args& args);
int BenchCodecCommand(const Args& args);
int BenchLocalCommand(const Args& args);
int BenchCheckpointCommand(const Args& args);
int FloodCommand(const Args& args);  // server memory under a push flood
int RunCommand(const Args& args);  // role and addresses from DMLC_* (tools/run_plan.h)
int CountUpdatesCommand(const Args& args);  // lost/duplicate updates of a finished job

// Set by SIGTERM/SIGINT once InstallStopSignals() ran (SIGINT only when it
// was not ignored at start: a background job's, or a launched daemon's).
bool StopRequested();
void InstallStopSignals();

}  // namespace shardps

#endif  // SHARDPS_TOOLS_COMMANDS_H_
