// The `shardps` command: daemons, the local cluster, status and benchmarks.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <new>
#include <string>

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
  count-updates lost and duplicate updates of a finished job, from its servers' and workers' files
  certs         a CA, TLS certificates, a cluster token and security configs for a test cluster
benchmarks:
  bench         push/pull round trips against real servers vs raw ZeroMQ
  bench-codec   compression codecs vs memcpy
  bench-local   local-tier merge/broadcast vs memcpy
  bench-checkpoint  checkpoint write of the demo model vs a plain file write
  flood         8 workers flood one server with 64 MiB async pushes; its RSS must stay bounded
)";

// "shardps server --listen ..." (at most the buffer), for the line below.
char invocation[512];

// An exception nothing caught (std::bad_alloc above all: a model larger than
// an address-space limit leaves room for) still ends the process, so its
// partitions fail over and nothing half-applied outlives it, but the line
// says which process and why; libstdc++'s own ("terminate called after
// throwing an instance of 'std::bad_alloc'") named neither. Formats into a
// fixed buffer: the heap may be what ran out.
[[noreturn]] void SayWhyAndAbort() {
  const char* what = "unknown exception";
  const char* hint = "";
  try {
    if (auto e = std::current_exception()) std::rethrow_exception(e);
    what = "std::terminate without an exception";
  } catch (const std::bad_alloc& e) {
    what = e.what();
    hint = " (out of memory: the machine's, or an address-space limit such as prlimit --as / ulimit -v)";
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  char line[1024];
  const int n = snprintf(line, sizeof(line), "%s (pid %d): stops on an uncaught exception: %s%s\n", invocation,
                         static_cast<int>(getpid()), what, hint);
  if (n > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(static_cast<size_t>(n), sizeof(line) - 1));
  std::abort();
}

void RememberInvocation(int argc, char** argv) {
  std::string line = "shardps";
  for (int i = 1; i < argc; ++i) line.append(" ").append(argv[i]);
  snprintf(invocation, sizeof(invocation), "%s", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  RememberInvocation(argc, argv);
  std::set_terminate(SayWhyAndAbort);
  using shardps::Args;
  const std::map<std::string, int (*)(const Args&)> commands = {
      {"scheduler", shardps::SchedulerCommand},   {"server", shardps::ServerCommand},
      {"train", shardps::TrainCommand},           {"status", shardps::StatusCommand},
      {"local", shardps::LocalCommand},           {"launch", shardps::LaunchCommand},
      {"bench", shardps::BenchCommand},
      {"flood", shardps::FloodCommand},
      {"bench-codec", shardps::BenchCodecCommand}, {"bench-local", shardps::BenchLocalCommand},
      {"bench-checkpoint", shardps::BenchCheckpointCommand}, {"checkpoint", shardps::CheckpointCommand},
      {"drain", shardps::DrainCommand},           {"count-updates", shardps::CountUpdatesCommand},
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
