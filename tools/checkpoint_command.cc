// `shardps checkpoint`: asks a running cluster for a checkpoint at a round
// boundary none of its partitions has reached, then waits until the servers
// have written it completely (or says what is missing at the deadline).
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_store.h"
#include "common/scheduler_client.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"

namespace shardps {
namespace {

absl::Status Checkpoint(const std::string& address, const std::string& security_config, const std::string& dir,
                        double wait_s) {
  if (dir.empty()) return absl::InvalidArgumentError("--dir is required");
  auto security = LoadSecurityCredentialsFile(security_config, /*for_scheduler=*/false);
  if (!security.ok()) return security.status();
  auto client = SchedulerClient::Create(address, *security);
  if (!client.ok()) return client.status();
  CheckpointRequest request;
  // The servers write where this names, so it must mean the same to them.
  request.set_dir(std::filesystem::absolute(dir).lexically_normal().string());
  auto response = (*client)->RequestCheckpoint(request, absl::Seconds(10));
  if (!response.ok()) return response.status();
  const std::string round_dir = CheckpointRoundDir(response->dir(), response->round());
  std::cout << "checkpoint of round " << response->round() << " requested: " << round_dir << std::endl;
  if (wait_s <= 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + absl::Seconds(wait_s);
  absl::Time next_status = absl::Now();
  for (;;) {
    absl::StatusOr<uint64_t> round = VerifyCheckpointRound(round_dir);
    if (round.ok()) {
      std::cout << "checkpoint of round " << *round << " complete: " << round_dir << std::endl;
      return absl::OkStatus();
    }
    // A server that could not write its part says so in its heartbeats.
    if (absl::Now() >= next_status) {
      next_status = absl::Now() + absl::Milliseconds(250);
      if (auto status = (*client)->Status(absl::Seconds(5)); status.ok()) {
        for (const NodeStatus& n : status->nodes()) {
          const CheckpointFailure& f = n.checkpoint_failure();
          if (n.role() != SERVER || f.dir() != response->dir() || f.round() != response->round()) continue;
          return absl::InternalError(absl::StrCat("checkpoint of round ", f.round(), " into ", f.dir(),
                                                  " cannot complete: server ", n.rank(), " (", n.address(),
                                                  ") could not write its part: ", f.error()));
        }
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("checkpoint of round ", response->round(), " not complete after ", wait_s,
                       " s (did training stop before that round?): ", round.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int CheckpointCommand(const Args& args) {
  std::string address = "127.0.0.1:7000", dir;
  double wait_s = 60;
  CliFlags flags("checkpoint");
  flags.String("scheduler", &address, "scheduler host:port (several, comma-separated: schedulers on etcd)");
  flags.String("dir", &dir, "checkpoint directory, the same path on every server (rounds go in round-N/)");
  flags.Seconds("wait", &wait_s, "seconds to wait for the checkpoint to be complete (0: return once requested)");
  std::string security_config;
  flags.String("security-config", &security_config, "config file whose security { } block reaches a secured scheduler");
  absl::Status s = flags.Parse(args);
  if (s.ok() && flags.help()) return 0;
  if (s.ok()) s = Checkpoint(address, security_config, dir, wait_s);
  if (s.ok()) return 0;
  std::cerr << "shardps checkpoint: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace shardps
