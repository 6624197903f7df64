// The `shardps` command: daemons, the local cluster, status and benchmarks.
#include <iostream>
#include <map>

#include "common/protocol.h"
#include "tools/commands.h"
#include "worker/c_api.h"

namespace shardps {
int EchoServerCommand(const Args& args);
}

namespace {

constexpr char kUsage[] = R"(usage: shardps COMMAND [flags]   (shardps COMMAND --help for its flags)
       shardps --version

daemons:
  scheduler     serve the scheduler (membership, shard map, barriers)
  server        serve partitions of the weights
  train         the example training job: one worker embedding the client library
  run           scheduler, server or train, chosen and addressed by DMLC_* variables (MXJob)
operations:
  status        show the cluster as the scheduler sees it
  checkpoint    ask a running cluster for a checkpoint at its next round boundary and wait for it
  drain         move a server's partitions to the others while training goes on, then stop it
  local         scheduler + servers + workers as processes on this machine, training Fashion-MNIST
  launch        scheduler + servers on this machine, and W copies of any command as the workers
  certs         a CA, TLS certificates, a cluster token and security configs for a test cluster
benchmarks:
  bench         push/pull round trips against real servers vs raw ZeroMQ
  bench-codec   compression codecs vs memcpy
  bench-local   local-tier merge/broadcast vs memcpy
  bench-checkpoint  checkpoint write of the demo model vs a plain file write
  flood         8 workers flood one server with 64 MiB async pushes; its RSS must stay bounded
)";

}  // namespace

int main(int argc, char** argv) {
  using shardps::Args;
  const std::map<std::string, int (*)(const Args&)> commands = {
      {"scheduler", shardps::SchedulerCommand},   {"server", shardps::ServerCommand},
      {"train", shardps::TrainCommand},           {"status", shardps::StatusCommand},
      {"local", shardps::LocalCommand},           {"launch", shardps::LaunchCommand},
      {"bench", shardps::BenchCommand},
      {"flood", shardps::FloodCommand},
      {"bench-codec", shardps::BenchCodecCommand}, {"bench-local", shardps::BenchLocalCommand},
      {"bench-checkpoint", shardps::BenchCheckpointCommand}, {"checkpoint", shardps::CheckpointCommand},
      {"drain", shardps::DrainCommand},
      {"certs", shardps::CertsCommand},
      {"echo-server", shardps::EchoServerCommand}, {"run", shardps::RunCommand},
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    // Nodes of one cluster must speak the same wire protocol (Register refuses another).
    std::cout << "shardps " << shardps_version() << " (wire protocol " << shardps::kProtocolVersion << ")\n";
    return 0;
  }
  auto it = commands.find(argv[1]);
  if (it == commands.end()) {
    std::cerr << "shardps: unknown command '" << argv[1] << "'\n" << kUsage;
    return 2;
  }
  return it->second(Args(argv + 2, argv + argc));
}
