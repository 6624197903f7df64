// `shardps drain`: asks a running cluster to move every copy a server holds
// to the other servers (primaries by hand-off, while training goes on), then
// waits until that server has stopped and left the job, or says at the
// deadline what is still under way; `--cancel` ends a drain under way.
#include <iostream>
#include <thread>

#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/scheduler_client.h"
#include "common/shard_map.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"

namespace shardps {
namespace {

const NodeStatus* FindServer(const StatusResponse& status, uint32_t index) {
  for (const NodeStatus& n : status.nodes()) {
    if (n.role() == SERVER && n.rank() == index) return &n;
  }
  return nullptr;
}

// The copies the map still lists on server `index`, and the moves from it
// under way.
std::string StillHeld(const ShardMap& map, uint32_t index) {
  int copies = 0, moving = 0;
  for (const PartitionInfo& p : map.partitions()) copies += HoldsCopy(p, index) ? 1 : 0;
  for (const CopyMove& m : map.moves()) moving += m.from() == index ? 1 : 0;
  return absl::StrCat(copies, " copies still on it, ", moving, " moves from it under way (shard map epoch ",
                      map.epoch(), ")");
}

// Server `server` of `status`: its index, or the data address it serves on
// (as `shardps status` lists it, "tcp://" optional). An unknown index is the
// scheduler's to refuse.
absl::StatusOr<uint32_t> ServerIndex(const StatusResponse& status, const std::string& server) {
  uint32_t index;
  if (absl::SimpleAtoi(server, &index)) return index;
  for (const NodeStatus& n : status.nodes()) {
    if (n.role() == SERVER && !n.declared_dead() && !n.left() &&
        (n.address() == server || n.address() == "tcp://" + server)) {
      return n.rank();
    }
  }
  return absl::NotFoundError(absl::StrCat("no live server serves at ", server, " (`shardps status` lists them)"));
}

// Ends the drain of server `index` under way (`before`: the status that
// found it).
absl::Status CancelDrain(SchedulerClient& client, const std::string& address, const StatusResponse& before,
                         uint32_t index) {
  // Checked here too: a scheduler from before DrainRequest.cancel would
  // take the request for a drain of a server that is not draining...
  const NodeStatus* node = FindServer(before, index);
  if (node != nullptr && !node->left() && !node->declared_dead() && !MarkedDraining(before.shard_map(), index)) {
    return absl::FailedPreconditionError(absl::StrCat("server ", index, " is not draining"));
  }
  DrainRequest request;
  request.set_server(index);
  request.set_cancel(true);
  auto response = client.Drain(request, absl::Seconds(10));
  if (!response.ok()) return response.status();
  // ... and one that answers the draining server's cancel as the same
  // drain asked again, with no word of the cancel.
  auto after = client.Status(absl::Seconds(10));
  if (!after.ok()) return after.status();
  if (MarkedDraining(after->shard_map(), index)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler at ", address, " answered, but server ", index, " is still draining at shard map epoch ",
        after->shard_map().epoch(), ": a scheduler from before `shardps drain --cancel` takes a cancel for a "
        "drain (upgrade it, or let the drain finish)"));
  }
  std::cout << "the drain of server " << index << " is cancelled from shard map epoch " << response->epoch()
            << ": it serves on with the " << response->copies() << " copies (" << response->elements()
            << " elements) it still holds; moves from it under way finish, then the servers are balanced again"
            << std::endl;
  return absl::OkStatus();
}

absl::Status Drain(const std::string& address, const std::string& security_config, const std::string& server,
                   double wait_s, bool cancel) {
  if (server.empty()) {
    return absl::InvalidArgumentError("--server is required (an index or data address, as `shardps status` lists)");
  }
  auto security = LoadSecurityCredentialsFile(security_config, /*for_scheduler=*/false);
  if (!security.ok()) return security.status();
  auto client = SchedulerClient::Create(address, *security);
  if (!client.ok()) return client.status();
  auto before = (*client)->Status(absl::Seconds(10));
  if (!before.ok()) return before.status();
  auto found = ServerIndex(*before, server);
  if (!found.ok()) return found.status();
  const uint32_t index = *found;
  if (cancel) return CancelDrain(**client, address, *before, index);
  // The process being drained, so that a server that takes its place later
  // is not taken for it.
  const NodeStatus* node = FindServer(*before, index);
  const uint64_t node_id = node != nullptr ? node->node_id() : 0;
  DrainRequest request;
  request.set_server(index);
  const absl::Time start = absl::Now();
  auto response = (*client)->Drain(request, absl::Seconds(10));
  if (!response.ok()) return response.status();
  std::cout << "server " << index << " drains from shard map epoch " << response->epoch() << ": its "
            << response->copies() << " copies (" << response->elements()
            << " elements) move to the other servers; it stops once it holds none" << std::endl;
  if (wait_s <= 0) return absl::OkStatus();
  const absl::Time deadline = start + absl::Seconds(wait_s);
  std::string last = "no status yet";
  std::string waits;  // StatusResponse.drain_waits last seen
  // The drained process died, or stopped before its drain was done; `after`
  // says what the status shows since (a process in its place).
  const std::string drained = absl::StrCat("server ", index, " (", node != nullptr ? node->address() : "?", ")");
  auto died = [&](const std::string& after) {
    return absl::UnavailableError(absl::StrCat(
        drained, " died while it drained, after ", absl::FormatDuration(absl::Now() - start), after,
        "; the scheduler failed its partitions over to their backups (`shardps status` shows what is left)"));
  };
  auto left_undrained = [&](absl::string_view why, const std::string& after) {
    return absl::DataLossError(absl::StrCat(drained, " left without being drained, after ",
                                            absl::FormatDuration(absl::Now() - start), after, ": ", why));
  };
  for (;;) {
    auto status = (*client)->Status(absl::Seconds(5));
    if (status.ok() && status->config().job_id() != before->config().job_id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the scheduler at ", address, " now runs another job (job id ", status->config().job_id(), ", was ",
          before->config().job_id(), "): it restarted without its state (--state-dir, --etcd) and knows nothing of ",
          drained, " or its drain, which had run ", absl::FormatDuration(absl::Now() - start),
          "; `shardps status` shows what it knows"));
    }
    if (status.ok()) {
      const NodeStatus* n = FindServer(*status, index);
      // Between two reads the server may have ended and another taken its
      // place: the newcomer's status says how the drained one ended.
      const bool replaced = n != nullptr && n->node_id() != node_id;
      const std::string in_place =
          replaced ? absl::StrCat(", and another server (", n->address(), ") has taken its place") : "";
      absl::string_view why = n != nullptr ? absl::string_view(n->replaced()) : absl::string_view();
      if (replaced && why == "declared dead") return died(in_place);
      if (replaced && absl::ConsumePrefix(&why, "left: ")) return left_undrained(why, in_place);
      if (n == nullptr || replaced) {
        std::cout << "server " << index << " drained and stopped after "
                  << absl::FormatDuration(absl::Now() - start) << " (another server has its place now)" << std::endl;
        return absl::OkStatus();
      }
      if (n->left() && !n->left_error().empty()) return left_undrained(n->left_error(), "");
      if (n->left()) {
        std::cout << "server " << index << " drained, stopped and left the job after "
                  << absl::FormatDuration(absl::Now() - start) << "; shard map epoch " << status->shard_map().epoch()
                  << std::endl;
        return absl::OkStatus();
      }
      if (n->declared_dead()) return died("");
      if (!MarkedDraining(status->shard_map(), index)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the drain of server ", index, " (", n->address(), ") ended after ", absl::FormatDuration(absl::Now() - start),
            ": another server died and too few would be left for the job's copies, so it serves on (the "
            "scheduler's log says so; start another server and ask again)"));
      }
      last = StillHeld(status->shard_map(), index);
      // The scheduler moves nothing more until a server with room joins:
      // said at once, and again at the deadline.
      if (!status->drain_waits().empty()) {
        if (status->drain_waits() != waits) std::cout << status->drain_waits() << std::endl;
        absl::StrAppend(&last, "; ", status->drain_waits());
      }
      waits = status->drain_waits();
    } else {
      last = std::string(status.status().message());
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("server ", index, " not drained after ", wait_s, " s: ", last,
                                                      "; it goes on draining (ask `shardps status`)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

int DrainCommand(const Args& args) {
  std::string address = "127.0.0.1:7000";
  std::string server;
  double wait_s = 600;
  CliFlags flags("drain");
  flags.String("scheduler", &address, "scheduler host:port (several, comma-separated: schedulers on etcd)");
  flags.String("server", &server, "the server to drain: its index or data address (as `shardps status` lists them)");
  flags.Seconds("wait", &wait_s,
               "seconds to wait for the server to be drained and stopped (0: return once asked; not with --cancel)");
  bool cancel = false;
  flags.Bool("cancel", &cancel, "end the server's drain under way instead: it serves on with the copies it still holds");
  std::string security_config;
  flags.String("security-config", &security_config, "config file whose security { } block reaches a secured scheduler");
  absl::Status s = flags.Parse(args);
  if (s.ok() && flags.help()) return 0;
  // A cancel is answered at once; a wait asked with it would be ignored.
  if (s.ok() && cancel && flags.given("wait")) {
    s = absl::InvalidArgumentError("--wait does not go with --cancel: a cancel is answered at once");
  }
  if (s.ok()) s = Drain(address, security_config, server, wait_s, cancel);
  if (s.ok()) return 0;
  std::cerr << "shardps drain: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace shardps
