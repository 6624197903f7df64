// Failure handling end to end. Multi-process: `shardps local --kill` sends a
// real SIGKILL to a scheduler, server or worker process mid-training. In
// process: a worker and a server given a scheduler client the test controls.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/tensor_spec.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/scheduler_client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/closing_listener.h"
#include "tests/sanitizer_slowdown.h"
#include "tests/test_cluster.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

struct LocalRun {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Heartbeats of the jobs below: short, so failures are found fast, and
// stretched in a sanitizer tree (tests/sanitizer_slowdown.h), where live
// nodes slowed several times over would otherwise miss them. Rendezvous and
// barriers (30 s by default) stretch the same way: a sanitized worker loads
// its data that much slower.
constexpr int kHeartbeatIntervalMs = 200 * kTestSlowdown;
constexpr int kHeartbeatTimeoutMs = 2000 * kTestSlowdown;

// Runs `shardps local` with a small, fast job and short heartbeats (0.2 s
// interval, 2 s timeout in a plain build). request_timeout_ms is long
// (120 s): a run that only recovered by a request timeout would show it.
LocalRun RunLocal(std::vector<std::string> extra) {
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("failure-test-", getpid());
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv = {SHARDPS_BINARY, "local", "--epochs", "1", "--test-limit", "2000", "--log-every",
                                   "0", "--json", "--set", absl::StrCat("heartbeat_interval_ms=", kHeartbeatIntervalMs),
                                   "--set", absl::StrCat("heartbeat_timeout_ms=", kHeartbeatTimeoutMs), "--set",
                                   "request_timeout_ms=120000", "--set",
                                   absl::StrCat("rendezvous_timeout_ms=", 30000 * kTestSlowdown), "--timeout",
                                   absl::StrCat(300 * kTestSlowdown)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid;
  LocalRun run;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) == 0) {
    int status;
    waitpid(pid, &status, 0);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  run.out = Slurp(dir + "/out");
  run.err = Slurp(dir + "/err");
  std::filesystem::remove_all(dir);
  return run;
}

// A number from the JSON line, e.g. "detected_seconds": 2.1 (NaN for null).
double Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": (null|[-0-9.e]+)"))) return -1;
  return m[1] == "null" ? std::nan("") : std::stod(m[1]);
}

TEST(FailureTest, AWorkerKilledInSyncIsRemovedAndTheOthersFinish) {
  LocalRun run = RunLocal({"--servers", "2", "--workers", "3", "--train-limit", "6000", "--kill", "worker:2@20"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("worker rank 2 (host " + LocalHostName() + ") declared dead"));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));  // no request waited out its timeout
  const double detected = Field(run.out, "detected_seconds"), recovered = Field(run.out, "recovered_seconds");
  // The last heartbeat may have left up to one interval before the kill.
  EXPECT_GT(detected, (kHeartbeatTimeoutMs - 2 * kHeartbeatIntervalMs) / 1000.0)
      << "declared dead before its heartbeat timeout: " << run.out;
  EXPECT_GE(recovered, detected) << run.out;
  EXPECT_LT(recovered, 120) << "recovered by a request timeout, not by failure detection";
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.6) << run.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, MostWorkersKilledAtOnceAreDeclaredDeadAndTheLastFinishes) {
  // 3 of 6 nodes silent at once: the scheduler took itself for cut off and
  // declared no one, and rank 0 failed after its request timeout blaming a
  // server. Their closed connections tell it otherwise.
  LocalRun run = RunLocal({"--servers", "2", "--workers", "4", "--train-limit", "8000", "--kill", "worker:1@20",
                           "--kill", "worker:2@20", "--kill", "worker:3@20"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (int r = 1; r <= 3; ++r) EXPECT_THAT(run.err, HasSubstr(absl::StrCat("worker rank ", r, " (host ")));
  EXPECT_THAT(run.err, HasSubstr("1 worker goes on"));
  EXPECT_THAT(run.err, Not(HasSubstr("more likely cut off itself")));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
  // Rank 0 has a few steps left once alone, which may all fall between two
  // of the launcher's polls: recovery_seconds can be null; detection not.
  const double detected = Field(run.out, "detected_seconds");
  EXPECT_GT(detected, 0) << run.out;
  EXPECT_LT(detected, 120) << "found by a request timeout, not by failure detection";
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, AKilledWorkerStartedAgainRejoinsTheSyncJobAtARoundAndItsUpdatesCount) {
  // --replace starts rank 2 again once it is declared dead; it rejoins at a
  // round past every server's (in epoch 1 or 2, by the pace), trains from
  // there, and its acknowledged pushes are in the lost/duplicate accounting.
  const std::vector<std::string> job = {"--servers", "2", "--workers", "3", "--train-limit", "6000", "--epochs", "2"};
  LocalRun clean = RunLocal(job);
  std::vector<std::string> faulty = job;
  faulty.insert(faulty.end(), {"--replace", "--kill", "worker:2@20"});
  LocalRun run = RunLocal(faulty);
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("worker rank 2 (host " + LocalHostName() + ") declared dead"));
  EXPECT_THAT(run.err, ContainsRegex("worker rank 2 \\(host [^)]+\\) rejoins the running job at round [0-9]+"));
  EXPECT_THAT(run.err, ContainsRegex("worker 2: rejoined at round [0-9]+: epoch [12], step"));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
  // The bar for a worker kill (issue 8): within 0.015 of the run without it.
  EXPECT_NEAR(Field(run.out, "test_accuracy"), Field(clean.out, "test_accuracy"), 0.015)
      << run.out << "\n" << clean.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, ReplacingAKilledWorkerWhereTheWorkersHoldTheWeightsIsRefusedBeforeTheJobStarts) {
  const LocalRun run = RunLocal({"--compression", "2bit", "--kill", "worker:1@5", "--replace"});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("--replace cannot start worker 1 again"));
  EXPECT_THAT(run.err, HasSubstr("update_mode=UPDATE_ON_SERVER"));
  EXPECT_THAT(run.err, Not(HasSubstr("step")));  // no process was started
}

TEST(FailureTest, AKilledWorkerStartedAgainRejoinsAnSspJobWithoutStallingItsBound) {
  // SSP applied on arrival: while the killed worker is not yet declared dead
  // the others wait for it at the bound; once it is removed they go on, and
  // its replacement, counted from its first push at the rejoin round, neither
  // holds them nor waits for them past the epoch barriers.
  LocalRun run = RunLocal({"--servers", "2", "--workers", "3", "--train-limit", "6000", "--epochs", "2",
                           "--consistency", "ssp", "--set", "staleness=2", "--replace", "--kill", "worker:2@20"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("worker rank 2 (host " + LocalHostName() + ") declared dead"));
  EXPECT_THAT(run.err, ContainsRegex("worker rank 2 \\(host [^)]+\\) rejoins the running job at round [0-9]+"));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.6) << run.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, TrainingGoesOnWhileTheSchedulerIsDeadAndARestartedOneResumesTheCluster) {
  LocalRun run = RunLocal({"--servers", "2", "--workers", "2", "--train-limit", "40000", "--kill", "scheduler@20",
                      "--restart-after", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("resuming the cluster saved in"));
  EXPECT_GT(Field(run.out, "detected_seconds"), 0.9) << run.out;
  EXPECT_GT(Field(run.out, "recovered_seconds"), 0) << "every node reconnected to the new scheduler: " << run.out;
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.7) << run.out;
}

TEST(FailureTest, AServerKilledWithoutAReplicaFailsTheJobAtOnceNamingIt) {
  LocalRun run = RunLocal({"--servers", "2", "--workers", "2", "--train-limit", "20000", "--set", "replication=1",
                           "--kill", "server:1@20"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("server 1 was declared dead by the scheduler"));
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("heartbeat_timeout_ms ", kHeartbeatTimeoutMs)));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
}

TEST(FailureTest, TwoOfThreeServersKilledAtOnceLoseThePartitionsOnlyTheyHeldAndSaySo) {
  // fix20: with replication 2 the copies of a partition on both lie on no
  // live server. The first failover promoted the second server's copies and
  // re-created their backups on the third; the second promoted those, which
  // no snapshot reached: the third answered DATA_LOSS, and the scheduler
  // said the partitions failed over.
  LocalRun run = RunLocal({"--servers", "3", "--workers", "2", "--train-limit", "20000", "--kill", "server:0@60",
                           "--kill", "server:1@60"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, ContainsRegex("partitions? had no live replica and (is|are) lost"));
  EXPECT_THAT(run.err, HasSubstr("its partitions have no live replica"));
  EXPECT_THAT(run.err, Not(HasSubstr("before its copy was complete"))) << "a copy promoted before its snapshot";
  EXPECT_THAT(run.err, Not(HasSubstr("not reported synced")));
}

TEST(FailureTest, TheOnlyServerOfAOneWorkerJobKilledIsDeclaredDeadNamingIt) {
  // Two nodes: a dead one leaves 1 of 2 heard, which read as the scheduler
  // cut off until its closed connection counted (review17); the worker
  // waited out its request timeout.
  LocalRun run = RunLocal({"--servers", "1", "--workers", "1", "--train-limit", "8000", "--kill", "server:0@20"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("server 0 was declared dead by the scheduler"));
  EXPECT_THAT(run.err, Not(HasSubstr("more likely cut off itself")));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
}

std::string Sha(const std::string& json) {
  std::smatch m;
  return std::regex_search(json, m, std::regex("\"weights_sha256\": \"([0-9a-f]*)\"")) ? std::string(m[1]) : "";
}

// Runs `job` without faults and again with `faults` added; both must exit 0
// and the faulty run must end bitwise where the clean one did, with no
// update lost or applied twice. Returns the faulty run for more checks.
LocalRun ExpectFaultsChangeNoWeight(const std::vector<std::string>& job, const std::vector<std::string>& faults) {
  LocalRun clean = RunLocal(job);
  std::vector<std::string> faulty = job;
  faulty.insert(faulty.end(), faults.begin(), faults.end());
  LocalRun killed = RunLocal(faulty);
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_EQ(killed.exit_code, 0) << killed.err;
  EXPECT_EQ(Field(killed.out, "lost_updates"), 0) << killed.out;
  EXPECT_EQ(Field(killed.out, "duplicate_updates"), 0) << killed.out;
  EXPECT_EQ(Sha(clean.out).size(), 64u) << clean.out;
  EXPECT_EQ(Sha(killed.out), Sha(clean.out));
  return killed;
}

TEST(FailureTest, AKilledServersPartitionsFailOverToTheirBackupsBitwiseUnchanged) {
  // Deterministic sync: the weights after a failover are exactly those of the
  // run without the fault (no update lost, none applied twice).
  const std::vector<std::string> job = {"--servers", "3", "--workers", "3", "--train-limit", "9000",
                                        "--deterministic"};
  LocalRun killed = ExpectFaultsChangeNoWeight(job, {"--kill", "server:1@20"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.err, ContainsRegex("fails? over to (its backup|their backups)"));
  EXPECT_THAT(killed.err, Not(HasSubstr("no answer within")));
  EXPECT_GE(Field(killed.out, "recovered_seconds"), Field(killed.out, "detected_seconds")) << killed.out;
}

TEST(FailureTest, CopiesAreRecreatedSoASecondServerDeathLosesNothing) {
  // After the first failover every partition gets a new backup on a
  // survivor, so killing another server later still loses nothing.
  const std::vector<std::string> job = {"--servers", "3", "--workers", "2", "--train-limit", "9000",
                                        "--epochs", "2", "--deterministic"};
  LocalRun killed = ExpectFaultsChangeNoWeight(job, {"--kill", "server:1@20", "--kill", "server:2@150"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.err, HasSubstr("re-created on the surviving servers"));
  EXPECT_THAT(killed.err, Not(HasSubstr("no live replica")));
}

TEST(FailureTest, ReplacementServersTakeTheDeadOnesPlacesUntilNoOriginalIsLeft) {
  // Each killed server is replaced (new process, new address) once declared
  // dead; the replacement gets copies again, so every original server can
  // die in turn and the weights stay bitwise those of the run without faults.
  const std::vector<std::string> job = {"--servers", "3", "--workers", "2", "--train-limit", "9000",
                                        "--epochs", "2", "--deterministic"};
  LocalRun killed = ExpectFaultsChangeNoWeight(
      job, {"--replace", "--kill", "server:1@20", "--kill", "server:0@150", "--kill", "server:2@250"});
  if (killed.exit_code != 0) return;
  for (int index : {0, 1, 2}) {
    EXPECT_THAT(killed.err, ContainsRegex(absl::StrCat("server ", index, " \\(tcp://[^)]*\\) joins the running job")))
        << "no replacement for server " << index;
  }
  EXPECT_THAT(killed.err, Not(HasSubstr("no live replica")));
  EXPECT_THAT(killed.err, Not(HasSubstr("no answer within")));
}

// The scheduler's line once the copy moves to a joined server are done:
// "servers balanced: N copy moves in D; elements held per live server
// I:E, ... (each within one partition of the mean)". Returns N and the loads.
struct Balance {
  int moves = -1;
  std::map<int, uint64_t> loads;
  bool within = false;
};
// The last line of the scheduler's log matching `line`, whose groups are
// the count, the loads ("I:E, ...") and "each" or "not all".
Balance LastBalanceLine(const std::string& err, const std::regex& line) {
  Balance b;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    b.moves = std::stoi((*it)[1]);
    b.within = (*it)[3] == "each";
    b.loads.clear();
    std::stringstream loads((*it)[2]);
    int server;
    char colon, comma;
    uint64_t elements;
    while (loads >> server >> colon >> elements) {
      b.loads[server] = elements;
      loads >> comma;
    }
  }
  return b;
}
Balance LastBalance(const std::string& err) {
  return LastBalanceLine(err, std::regex("servers balanced: ([0-9]+) copy moves in [^;]*; elements held per live "
                                         "server ([0-9:, ]+) \\((each|not all) within"));
}

// A job cut into many small partitions (64 KiB), so a server's share is
// many copies.
const std::vector<std::string> kSmallPartitionsJob = {"--servers", "3", "--workers", "2", "--train-limit", "9000",
                                                      "--epochs", "2", "--deterministic", "--set",
                                                      "partition_bytes=65536"};

// The last "servers balanced" line of `log` lists three servers, each within
// one partition of the mean, and `server` (one that joined) holds at least
// its share less one partition (64 KiB: 16384 elements, the largest).
void ExpectHoldsItsShareOfCopies(const std::string& log, const std::string& err, int server) {
  const Balance b = LastBalance(log);
  ASSERT_GT(b.moves, 0) << err;
  EXPECT_TRUE(b.within) << err;
  ASSERT_EQ(b.loads.size(), 3u) << err;
  uint64_t total = 0;
  for (const auto& [s, elements] : b.loads) total += elements;
  EXPECT_GE(b.loads.at(server) + 16384, total / 3) << "server " << server << " holds less than its share: " << err;
}

TEST(FailureTest, AReplacementServerIsGivenItsShareOfCopiesWithoutChangingAWeight) {
  // Server 1 dies: its copies are re-created on the survivors, which then
  // hold everything. Its replacement joins; backups move to it (extra copy
  // first, old one dropped once the new one is synced) until every server
  // holds within one partition of the mean, bitwise the fault-free run.
  LocalRun killed = ExpectFaultsChangeNoWeight(kSmallPartitionsJob, {"--replace", "--kill", "server:1@20"});
  if (killed.exit_code != 0) return;
  ExpectHoldsItsShareOfCopies(killed.err, killed.err, 1);
  EXPECT_THAT(killed.err, Not(HasSubstr("no live replica")));
  EXPECT_THAT(killed.err, Not(HasSubstr("before its copy was complete")));
}

// The scheduler's line once the hand-offs of primaries are done: "primaries
// balanced: M of N hand-offs made, D after the join; primary elements per
// live server I:E, ... (each within one partition of the mean)".
Balance LastPrimaryBalance(const std::string& err) {
  return LastBalanceLine(err, std::regex("primaries balanced: ([0-9]+) of [0-9]+ hand-offs made, [^;]*; primary "
                                         "elements per live server ([0-9:, ]+) \\((each|not all) within"));
}

TEST(FailureTest, AServerStartedWhileTheJobTrainsJoinsAsOneMoreAndTakesItsShareWithoutChangingAWeight) {
  // Two servers, and a third started once training runs: it joins as one
  // more (not in a dead one's place), copies and then primaries move to it,
  // and the grown cluster survives the death of an original server. Secured:
  // workers and servers admit the new server's key. Bitwise the weights of
  // the two-server run without faults.
  const std::vector<std::string> job = {"--servers", "2", "--workers", "2", "--train-limit", "9000", "--epochs",
                                        "2", "--deterministic", "--secure", "--set", "partition_bytes=65536"};
  LocalRun grown = ExpectFaultsChangeNoWeight(job, {"--add-server", "20", "--kill", "server:0@200"});
  if (grown.exit_code != 0) return;
  EXPECT_THAT(grown.err, ContainsRegex("server 2 \\(tcp://[^)]*\\) joins the running job as one more server"));
  // The balance before the kill: three servers, the new one with its share.
  const std::string before_kill = grown.err.substr(
      0, std::min(grown.err.find("over to their backups"), grown.err.find("over to its backup")));
  ASSERT_NE(before_kill.size(), grown.err.size()) << "server 0's death was never declared: " << grown.err;
  ExpectHoldsItsShareOfCopies(before_kill, grown.err, 2);
  const Balance primaries = LastPrimaryBalance(before_kill);
  ASSERT_EQ(primaries.loads.size(), 3u) << grown.err;
  EXPECT_GT(primaries.loads.at(2), 0u) << "the joined server serves no primary: " << grown.err;
  EXPECT_THAT(grown.err, Not(HasSubstr("no live replica")));
  EXPECT_THAT(grown.err, Not(HasSubstr("no answer within")));
  EXPECT_THAT(grown.err, Not(HasSubstr("refus")));
}

TEST(FailureTest, AWorkerKilledAfterAServerJoinedAsOneMoreRejoinsTheGrownJob) {
  // The rejoining rank defines the tensors again with 3 servers registered
  // of num_servers 2: it used to wait for exactly 2 until its rendezvous
  // timed out, and the job failed.
  LocalRun run = RunLocal({"--servers", "2", "--workers", "3", "--train-limit", "9000", "--epochs", "2", "--set",
                           "partition_bytes=65536", "--add-server", "20", "--replace", "--kill", "worker:2@25"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, ContainsRegex("server 2 \\(tcp://[^)]*\\) joins the running job as one more server"));
  EXPECT_THAT(run.err, ContainsRegex("worker 2: rejoined at round [0-9]+: epoch [12], step"));
  EXPECT_THAT(run.err, Not(HasSubstr("not all servers registered")));
  EXPECT_THAT(run.err, Not(HasSubstr("no answer within")));
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, AServerJoiningAJobWithoutBackupsTakesItsSharePrimariesAndAllWithoutChangingAWeight) {
  // Replication 1: no backup to move, so the joined server gets primaries
  // themselves, each as an extra copy, then its role by a hand-off (the old
  // primary drains), then the old copy dropped; the workers follow. Bitwise
  // the weights of the run without it, nothing lost or applied twice.
  const std::vector<std::string> job = {"--servers", "2", "--workers", "2", "--train-limit", "9000", "--epochs",
                                        "2", "--deterministic", "--set", "partition_bytes=65536", "--set",
                                        "replication=1"};
  LocalRun grown = ExpectFaultsChangeNoWeight(job, {"--add-server", "20"});
  if (grown.exit_code != 0) return;
  EXPECT_THAT(grown.err, ContainsRegex("server 2 \\(tcp://[^)]*\\) joins the running job as one more server.*"
                                       "replication 1: each as an extra copy"));
  ExpectHoldsItsShareOfCopies(grown.err, grown.err, 2);
  EXPECT_THAT(grown.err, ContainsRegex("primary of partition [0-9]+ handed off from server [01] to 2"));
  EXPECT_THAT(grown.err, ContainsRegex("copy moves done: partition [0-9]+ \\([01]->2, primary\\)"));
  EXPECT_THAT(grown.err, Not(HasSubstr("not drained within")));
  EXPECT_THAT(grown.err, Not(HasSubstr("no answer within")));
  EXPECT_THAT(grown.err, Not(HasSubstr("no live replica")));
}

TEST(FailureTest, ADrainedServerHandsItsPartitionsToTheOthersAndStopsWithoutChangingAWeight) {
  // `shardps drain` while the job trains: server 2's copies move to servers
  // 0 and 1 (its primaries by hand-off), then it stops by itself (exit 0)
  // and leaves; the weights are bitwise those of the run without the drain.
  LocalRun drained = ExpectFaultsChangeNoWeight(kSmallPartitionsJob, {"--drain", "2@20"});
  if (drained.exit_code != 0) return;
  EXPECT_THAT(drained.err, HasSubstr("copy moves drain server 2"));
  EXPECT_THAT(drained.err, ContainsRegex("copy moves done: partition [0-9]+ \\(2->[01], primary\\)"));
  EXPECT_THAT(drained.err, ContainsRegex("server 2 \\(tcp://[^)]*\\) drained: its copies moved to the other servers"));
  EXPECT_THAT(drained.err, HasSubstr("shardps local: server 2 drained and stopped"));
  EXPECT_THAT(drained.err, Not(HasSubstr("fail over")));
  EXPECT_THAT(drained.err, Not(HasSubstr("no answer within")));
  EXPECT_THAT(drained.err, Not(HasSubstr("declared dead")));
}

TEST(FailureTest, ADrainedServerOfAJobWithoutBackupsLosesNoPartition) {
  // Replication 1: the server's partitions have no other copy, so each is
  // copied to server 0 before the role is handed to it.
  const std::vector<std::string> job = {"--servers", "2", "--workers", "2", "--train-limit", "9000", "--epochs",
                                        "2", "--deterministic", "--set", "partition_bytes=65536", "--set",
                                        "replication=1"};
  LocalRun drained = ExpectFaultsChangeNoWeight(job, {"--drain", "1@20"});
  if (drained.exit_code != 0) return;
  EXPECT_THAT(drained.err, HasSubstr("shardps local: server 1 drained and stopped"));
  EXPECT_THAT(drained.err, Not(HasSubstr("no live replica")));
}

TEST(FailureTest, ADrainThatAnotherServersDeathEndsIsReportedAsEndedAndItsServerServesOn) {
  // Server 1 dies while server 2 drains: only server 0 would be left for
  // replication 2's copies, so the scheduler ends the drain and server 2
  // takes copies again; the launcher says so (exit 1: a drain asked for did
  // not happen), and no update is lost or doubled.
  std::vector<std::string> job = kSmallPartitionsJob;
  job.insert(job.end(), {"--drain", "2@20", "--kill", "server:1@21"});
  LocalRun run = RunLocal(job);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr("the drain of server 2 ends: too few servers would be left"));
  EXPECT_THAT(run.err, HasSubstr("re-created on the surviving servers"));
  EXPECT_THAT(run.err, HasSubstr("a drain did not finish: server 2: the scheduler ended its drain"));
  EXPECT_THAT(run.out, HasSubstr("\"lost_updates\": 0,"));
  EXPECT_THAT(run.out, HasSubstr("\"duplicate_updates\": 0,"));
}

// The replacement for server 1 holds primaries within one partition (16384
// elements) of the mean once the hand-offs are done.
void ExpectReplacementHoldsPrimaries(const LocalRun& run) {
  const Balance b = LastPrimaryBalance(run.err);
  ASSERT_GT(b.moves, 0) << run.err;
  EXPECT_TRUE(b.within) << run.err;
  ASSERT_EQ(b.loads.size(), 3u) << run.err;
  uint64_t total = 0;
  for (const auto& [server, elements] : b.loads) total += elements;
  EXPECT_GE(b.loads.at(1) + 16384, total / 3) << "the replacement serves less than its share: " << run.err;
  EXPECT_THAT(run.err, ContainsRegex("primary of partition [0-9]+ handed off from server [02] to 1 at shard map epoch"));
  EXPECT_THAT(run.err, Not(HasSubstr("not drained within")));
  EXPECT_THAT(run.err, Not(HasSubstr("before its copy was complete")));
}

TEST(FailureTest, AReplacementServerTakesOverPrimariesByHandOffsWithoutChangingAWeight) {
  // Once the copies are balanced, the survivors hand primary roles to the
  // replacement (each drains the partition, then the scheduler switches):
  // it serves workers again, and the weights are bitwise the fault-free
  // run's, nothing lost or applied twice. Three epochs leave the hand-offs
  // time to finish before the job does.
  std::vector<std::string> job = kSmallPartitionsJob;
  job[std::find(job.begin(), job.end(), "--epochs") - job.begin() + 1] = "3";
  LocalRun killed = ExpectFaultsChangeNoWeight(job, {"--replace", "--kill", "server:1@20"});
  if (killed.exit_code != 0) return;
  ExpectReplacementHoldsPrimaries(killed);
}

TEST(FailureTest, CompressedRoundsSurviveAFailoverAReplacementAndHandOffsBitwiseUnchanged) {
  // The 2bit recipe's shape (sum-only, onebit aggregates with the servers'
  // error feedback): compressed rounds reach the backups as the workers'
  // pushes, a promoted backup counts those it holds, the replacement's
  // copies are re-created from snapshots that carry the feedback residual,
  // and primaries are handed to it: bitwise the fault-free run throughout.
  std::vector<std::string> job = kSmallPartitionsJob;
  job[std::find(job.begin(), job.end(), "--epochs") - job.begin() + 1] = "3";
  for (const char* flag : {"--compression", "2bit:scale=1", "--set", "update_mode=SUM_ONLY", "--set",
                           "compression.pull_codec=onebit", "--set", "compression.uncompressed_rounds=5"}) {
    job.push_back(flag);
  }
  LocalRun killed = ExpectFaultsChangeNoWeight(job, {"--replace", "--kill", "server:1@20"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.err, ContainsRegex("fails? over to (its backup|their backups)"));
  EXPECT_THAT(killed.err, Not(HasSubstr("refused update")));
  ExpectReplacementHoldsPrimaries(killed);
}

TEST(FailureTest, AsyncPrimariesAreHandedOffToAReplacementLosingNoPush) {
  LocalRun run = RunLocal({"--servers", "3", "--workers", "2", "--train-limit", "9000", "--epochs", "3",
                           "--consistency", "async", "--set", "partition_bytes=65536", "--replace", "--kill",
                           "server:1@20"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.6) << run.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
  ExpectReplacementHoldsPrimaries(run);
}

TEST(FailureTest, AServerKilledWhilePrimariesAreHandedOffLosesNothing) {
  // Server 0 (the old primary of some hand-offs) is killed as soon as the
  // scheduler has started handing primaries off to server 1's replacement,
  // then replaced in turn: its hand-offs end (the failover promotes a backup)
  // and the weights stay bitwise the fault-free run's.
  std::vector<std::string> job = kSmallPartitionsJob;
  job[std::find(job.begin(), job.end(), "--epochs") - job.begin() + 1] = "3";
  LocalRun killed =
      ExpectFaultsChangeNoWeight(job, {"--replace", "--kill", "server:1@20", "--kill", "server:0@handoff"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.err, HasSubstr("primary hand-offs balance the primaries"));
  EXPECT_THAT(killed.err, ContainsRegex("server 0 \\(tcp://[^)]*\\) joins the running job"));
  EXPECT_THAT(killed.err, Not(HasSubstr("no live replica")));
  EXPECT_THAT(killed.err, Not(HasSubstr("before its copy was complete")));
}

TEST(FailureTest, AServerKilledWhileCopiesMoveToAReplacementLosesNothing) {
  // Server 0 (primary of some moving partitions, holder of old copies of
  // others) is killed as soon as the scheduler starts moving copies to
  // server 1's replacement; it is replaced in turn. Balance after that may
  // be short of one partition of the mean (the survivors hold primaries,
  // which stay), but nothing is lost.
  LocalRun killed = ExpectFaultsChangeNoWeight(
      kSmallPartitionsJob, {"--replace", "--kill", "server:1@20", "--kill", "server:0@moving"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.err, HasSubstr("copy moves balance the servers"));
  EXPECT_THAT(killed.out, HasSubstr("{\"role\": \"server\", \"index\": 0"));
  EXPECT_THAT(killed.err, ContainsRegex("server 0 \\(tcp://[^)]*\\) joins the running job"));
  EXPECT_THAT(killed.err, Not(HasSubstr("no live replica")));
  EXPECT_THAT(killed.err, Not(HasSubstr("before its copy was complete")));
}

TEST(FailureTest, ASecuredClustersReplacementServersAreAdmittedWithTheirNewKeys) {
  // A replacement has a new address and a new CURVE key: the workers and
  // its peers must reach it with that key, and it must admit them as soon
  // as it has its first map.
  const std::vector<std::string> job = {"--servers", "3", "--workers", "2", "--train-limit", "9000",
                                        "--epochs", "2", "--deterministic"};
  LocalRun killed =
      ExpectFaultsChangeNoWeight(job, {"--secure", "--replace", "--kill", "server:1@20", "--kill", "server:0@150"});
  if (killed.exit_code != 0) return;
  EXPECT_THAT(killed.out, HasSubstr("\"secure\": true"));
  EXPECT_THAT(killed.err, ContainsRegex("server 0 \\(tcp://[^)]*\\) joins the running job"));
  EXPECT_THAT(killed.err, Not(HasSubstr("unregistered CURVE key")));
}

TEST(FailureTest, AsyncTrainingGoesOnWhenAServerIsKilled) {
  LocalRun run = RunLocal({"--servers", "3", "--workers", "2", "--train-limit", "9000", "--consistency", "async",
                           "--kill", "server:0@20"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, ContainsRegex("fails? over to (its backup|their backups)"));
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.6) << run.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

// An SSP job (bound 2, worker 2 slowed down so the others run ahead) whose
// server 1 is killed at step 20, plus `mode` flags: it fails over, finishes,
// and loses or repeats no update. 18000 images (187 steps), not 9000 (93):
// which weights each step computes on depends on timing, and after 93 steps
// the accuracy is still on the steep part of the curve: 0.59-0.71 over 30
// runs of the in-rounds job, and 0.576 failed the 0.6 floor in a full test
// run. After 187 steps it was 0.73-0.79 with two CPU hogs running.
void ExpectSspSurvivesAServerKill(const std::vector<std::string>& mode) {
  std::vector<std::string> job = {"--servers", "3", "--workers", "3", "--train-limit", "18000", "--consistency",
                                  "ssp", "--set", "staleness=2", "--slow", "worker:2=3", "--kill", "server:1@20"};
  job.insert(job.end(), mode.begin(), mode.end());
  LocalRun run = RunLocal(job);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, ContainsRegex("fails? over to (its backup|their backups)"));
  EXPECT_GT(Field(run.out, "test_accuracy"), 0.6) << run.out;
  EXPECT_EQ(Field(run.out, "lost_updates"), 0) << run.out;
  EXPECT_EQ(Field(run.out, "duplicate_updates"), 0) << run.out;
}

TEST(FailureTest, SspPushesAnsweredAheadOfTheirRoundSurviveAServerKill) {
  // SSP in rounds: the pushes of the open rounds were forwarded to the
  // backups, so the promoted copies count them.
  ExpectSspSurvivesAServerKill({"--set", "ssp_in_rounds=true"});
}

TEST(FailureTest, SspAppliedOnArrivalSurvivesAServerKillWithoutStallingOnTheBound) {
  // SSP applied on arrival (the default): the promoted copies know no
  // worker's pace until its next push, and re-sent answers are held by the
  // bound there like any other.
  ExpectSspSurvivesAServerKill({});
}

// Forwards to a real scheduler client; the test can publish shard maps of
// its own to the watchers and make every call fail as if the scheduler died.
class ControlledScheduler : public SchedulerClient {
 public:
  explicit ControlledScheduler(std::unique_ptr<SchedulerClient> real)
      : SchedulerClient(real->address()), real_(std::move(real)) {}

  void Publish(const ShardMap& map) {
    std::vector<std::function<void(const ShardMap&)>> watchers;
    {
      absl::MutexLock lock(&mu_);
      watchers = watchers_;
    }
    absl::MutexLock deliver(&deliver_mu_);
    for (auto& on_map : watchers) on_map(map);
  }
  // From now on watchers see only the maps the test publishes: the real
  // scheduler's (its first map, a later epoch) could undo a made-up one.
  // Returns once no real map is being delivered.
  void Isolate() {
    absl::MutexLock deliver(&deliver_mu_);
    isolated_ = true;
  }
  void Die() { dead_ = true; }
  // The next `n` DefineTensors calls fail as a dropped connection does.
  void DropDefineTensors(int n) { drops_ = n; }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& r, absl::Duration t) override {
    if (dead_) return Gone();
    return real_->Register(r, t);
  }
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& r, absl::Duration t) override {
    if (dead_) return Gone();
    return real_->Heartbeat(r, t);
  }
  absl::StatusOr<ShardMap> DefineTensors(const DefineTensorsRequest& r, absl::Duration t) override {
    if (dead_) return Gone();
    if (drops_.fetch_sub(1) > 0) return absl::UnavailableError("connection dropped by the test");
    return real_->DefineTensors(r, t);
  }
  absl::Status Barrier(const BarrierRequest& r, absl::Duration t, BarrierResponse* out) override {
    return dead_ ? Gone() : real_->Barrier(r, t, out);
  }
  absl::StatusOr<CheckpointResponse> RequestCheckpoint(const CheckpointRequest& r, absl::Duration t) override {
    return dead_ ? absl::StatusOr<CheckpointResponse>(Gone()) : real_->RequestCheckpoint(r, t);
  }
  absl::StatusOr<StatusResponse> Status(absl::Duration t) override {
    if (dead_) return Gone();
    return real_->Status(t);
  }
  std::unique_ptr<Watch> WatchShardMap(uint64_t node, std::function<void(const ShardMap&)> on_map,
                                       std::function<void(const absl::Status&)> on_error) override {
    {
      absl::MutexLock lock(&mu_);
      watchers_.push_back(on_map);
    }
    auto forward = [this, on_map](const ShardMap& map) {
      absl::MutexLock deliver(&deliver_mu_);
      if (!isolated_) on_map(map);
    };
    return real_->WatchShardMap(node, forward, on_error);
  }

 private:
  static absl::Status Gone() { return absl::UnavailableError("scheduler killed by the test"); }
  std::unique_ptr<SchedulerClient> real_;
  std::atomic<bool> dead_{false};
  std::atomic<int> drops_{0};
  absl::Mutex mu_;
  std::vector<std::function<void(const ShardMap&)>> watchers_ ABSL_GUARDED_BY(mu_);
  absl::Mutex deliver_mu_ ABSL_ACQUIRED_AFTER(mu_);  // held while a map is handed to the watchers
  bool isolated_ ABSL_GUARDED_BY(deliver_mu_) = false;
};

// A ControlledScheduler forwarding to the scheduler at `address`; null
// (and a failure) when no client of it can be made.
std::shared_ptr<ControlledScheduler> Controlled(const std::string& address) {
  auto real = SchedulerClient::Create(address);
  EXPECT_TRUE(real.ok()) << real.status();
  return real.ok() ? std::make_shared<ControlledScheduler>(*std::move(real)) : nullptr;
}

// Runs a server's engine on a thread, stopped and joined when it goes out of
// scope: a failed ASSERT must not leave the thread joinable.
class EngineThread {
 public:
  explicit EngineThread(ParameterServer& server) : server_(server), thread_([this] { status_ = server_.Run(); }) {}
  ~EngineThread() { (void)Stop(); }
  // What Run() returned.
  absl::Status Stop() {
    server_.RequestStop();
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  ParameterServer& server_;
  absl::Status status_ = absl::UnknownError("running");
  std::thread thread_;  // last: started once the others are set
};

ClusterConfig SmallConfig(int servers) {
  ClusterConfig c;
  c.set_num_servers(servers);
  c.set_replication(1);
  c.set_num_workers(1);
  c.set_partition_bytes(1024);
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(1.0f);
  return c;
}

TensorSpec Tensor(const std::string& name, int64_t n) { return Float32Tensor(name, n); }

TEST(FailureTest, AWorkerFailsRequestsToAServerTheMapDeclaresDeadAtOnceNamingIt) {
  ClusterConfig config = SmallConfig(2);
  config.set_consistency(ASYNC);  // pulls are answered at once, whatever was pushed
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto scheduler = Controlled((*cluster)->scheduler_address());
  ASSERT_NE(scheduler, nullptr);
  auto worker = Worker::Create({.rank = 0, .scheduler_client = scheduler});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Tensor("w", 1000)}).ok());
  auto status = scheduler->Status(absl::Seconds(5));
  ASSERT_TRUE(status.ok());
  // The real servers never serve a map the test makes up: keep its epoch, so
  // requests to the live server are answered.
  ShardMap map = status->shard_map();
  scheduler->Isolate();
  map.mutable_servers(1)->set_dead(true);
  map.mutable_servers(1)->set_dead_reason("no heartbeat for 10s");
  const uint32_t dead_index = map.servers(1).index();
  scheduler->Publish(map);
  std::vector<float> grad(1000, 1.0f), out(1000);
  auto h = (*worker)->PushPull("w", grad, absl::MakeSpan(out));
  ASSERT_TRUE(h.ok());
  absl::Status s = (*worker)->Wait(*h, absl::Seconds(60));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("server ", dead_index, " was declared dead by the scheduler")));
  EXPECT_THAT(s.message(), HasSubstr("no heartbeat for 10s"));
  // A server that takes the dead one's place at the same address: the map
  // lists the index alive again, and requests to it are sent again.
  scheduler->Publish(status->shard_map());
  auto pulled = (*worker)->Pull("w", absl::MakeSpan(out));
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE((*worker)->Wait(*pulled, absl::Seconds(60)).ok()) << "still refused after the map revived the server";
}

// A scheduler that stalls for a few seconds (a loaded host; here SIGSTOP)
// is no partition: a control call waiting on it, here a worker's
// registration waiting for the second worker, goes on once it answers again,
// well inside the heartbeat timeout, instead of failing with the connection.
TEST(FailureTest, AControlCallOutlivesASchedulerStalledForSeconds) {
  ClusterConfig config = SmallConfig(1);
  config.set_num_workers(2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Worker>> first = absl::UnknownError("not registered");
  std::thread registering([&] {
    first = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
  });
  absl::SleepFor(absl::Seconds(1));  // rank 0 waits for rank 1 in its Register call
  const pid_t scheduler = (*cluster)->scheduler_pid();
  ASSERT_EQ(kill(scheduler, SIGSTOP), 0);
  absl::SleepFor(absl::Seconds(4));
  ASSERT_EQ(kill(scheduler, SIGCONT), 0);
  auto second = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 1});
  registering.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
}

// A worker whose job ends says so: sync rounds go on without it at once,
// not after the heartbeat timeout, and the scheduler lists it as left, not
// dead (before, a finished job's workers stayed SILENT for good).
TEST(FailureTest, AWorkerThatIsDestroyedLeavesTheJobAndSyncRoundsGoOnWithoutIt) {
  ClusterConfig config = SmallConfig(1);
  config.set_num_workers(2);
  config.set_heartbeat_timeout_ms(60000);  // a removal inside this test is the leave's
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Worker>> workers[2];
  {
    std::thread second([&] { workers[1] = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 1}); });
    workers[0] = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0});
    second.join();
  }
  for (auto& w : workers) ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> grad = {1, 2, 3, 4}, out[2] = {std::vector<float>(4), std::vector<float>(4)};
  for (int r = 0; r < 2; ++r) ASSERT_TRUE((*workers[r])->DefineTensors({Tensor("w", 4)}).ok());
  absl::StatusOr<Worker::Handle> h[2];
  for (int r = 0; r < 2; ++r) {
    h[r] = (*workers[r])->PushPull("w", grad, absl::MakeSpan(out[r]));
    ASSERT_TRUE(h[r].ok()) << h[r].status();
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE((*workers[r])->Wait(*h[r], absl::Seconds(10)).ok());
  EXPECT_EQ(out[0][3], -4.0f) << "round 1: the mean of both gradients";

  workers[1]->reset();
  auto alone = (*workers[0])->PushPull("w", grad, absl::MakeSpan(out[0]));
  ASSERT_TRUE(alone.ok()) << alone.status();
  absl::Status s = (*workers[0])->Wait(*alone, absl::Seconds(20));
  ASSERT_TRUE(s.ok()) << s << " (round 2 waited for the worker that left)";
  EXPECT_EQ(out[0][3], -8.0f) << "round 2: worker 0's gradient alone";

  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  bool seen = false;
  for (const NodeStatus& n : status->nodes()) {
    if (n.role() != WORKER || n.rank() != 1) continue;
    seen = true;
    EXPECT_TRUE(n.left()) << n.ShortDebugString();
    EXPECT_FALSE(n.declared_dead()) << n.ShortDebugString();
  }
  EXPECT_TRUE(seen);
}

// DefineTensors is idempotent: a call the connection dropped is asked again
// until its deadline, and a scheduler that stays away fails it at that
// deadline, not before and not later.
TEST(FailureTest, DefineTensorsIsAskedAgainAfterADroppedConnectionUntilItsDeadline) {
  ClusterConfig config = SmallConfig(1);
  auto daemon = SchedulerDaemon::Create({.listen_address = "127.0.0.1:0", .config = config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto server = ParameterServer::Create({.scheduler_address = (*daemon)->address(), .bind_address = "tcp://127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  EngineThread engine(**server);
  auto scheduler = Controlled((*daemon)->address());
  ASSERT_NE(scheduler, nullptr);
  auto worker = Worker::Create({.scheduler_address = (*daemon)->address(), .rank = 0, .scheduler_client = scheduler});
  ASSERT_TRUE(worker.ok()) << worker.status();
  scheduler->DropDefineTensors(2);
  EXPECT_TRUE((*worker)->DefineTensors({Tensor("w", 4)}, absl::Seconds(30)).ok());

  scheduler->Die();
  const absl::Time start = absl::Now();
  absl::Status gone = (*worker)->DefineTensors({Tensor("w", 4)}, absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(gone)) << gone;
  EXPECT_GE(took, absl::Seconds(1)) << "gave up before its deadline";
  EXPECT_LT(took, absl::Seconds(10)) << "waited past its deadline";
}

TEST(FailureTest, AServerKeepsServingWhenItsSchedulerDies) {
  ClusterConfig config = SmallConfig(1);
  config.set_heartbeat_interval_ms(50);
  auto daemon = SchedulerDaemon::Create({.listen_address = "127.0.0.1:0", .config = config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto scheduler = Controlled((*daemon)->address());
  ASSERT_NE(scheduler, nullptr);
  auto server = ParameterServer::Create({.bind_address = "tcp://127.0.0.1:0", .scheduler_client = scheduler});
  ASSERT_TRUE(server.ok()) << server.status();
  EngineThread engine(**server);
  auto worker = Worker::Create({.scheduler_address = (*daemon)->address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Tensor("w", 4)}).ok());
  std::vector<float> grad = {1, 2, 3, 4}, out(4);
  scheduler->Die();
  (*daemon)->Shutdown();
  absl::SleepFor(absl::Milliseconds(300));  // several failed heartbeats
  for (int round = 1; round <= 3; ++round) {
    auto h = (*worker)->PushPull("w", grad, absl::MakeSpan(out));
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*worker)->Wait(*h, absl::Seconds(10)).ok());
    EXPECT_EQ(out[3], -4.0f * round);
  }
  absl::Status run_status = engine.Stop();
  EXPECT_TRUE(run_status.ok()) << run_status;
}

// A backup whose address ends every connection in its handshake (a port
// whose owner refuses it): the primary's connection to it carried nothing,
// and ZeroMQ makes it again by itself (100 ms apart). Made again at once,
// with a snapshot of each copy it had not confirmed, it looped as fast as
// the primary's engine turns.
TEST(FailureTest, APrimaryDoesNotHammerABackupThatEndsItsConnectionsInTheHandshake) {
  ClusterConfig config = SmallConfig(2);
  config.set_replication(2);
  auto daemon = SchedulerDaemon::Create({.listen_address = "127.0.0.1:0", .config = config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto scheduler = Controlled((*daemon)->address());
  ASSERT_NE(scheduler, nullptr);
  auto primary = ParameterServer::Create({.bind_address = "tcp://127.0.0.1:0", .scheduler_client = scheduler});
  ASSERT_TRUE(primary.ok()) << primary.status();
  EngineThread primary_engine(**primary);
  auto other = ParameterServer::Create({.scheduler_address = (*daemon)->address(), .bind_address = "tcp://127.0.0.1:0"});
  ASSERT_TRUE(other.ok()) << other.status();
  EngineThread other_engine(**other);
  auto worker = Worker::Create({.scheduler_address = (*daemon)->address(), .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->DefineTensors({Tensor("w", 1000)}).ok());
  std::vector<float> grad(1000, 1.0f), out(1000);
  auto h = (*worker)->PushPull("w", grad, absl::MakeSpan(out));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*worker)->Wait(*h, absl::Seconds(30)).ok());
  auto status = scheduler->Status(absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();

  // The other server's index moves to the listener's address: each copy
  // there is a new one, which its primary sends a snapshot.
  ClosingListener listener;
  ShardMap map = status->shard_map();
  scheduler->Isolate();
  map.set_epoch(map.epoch() + 100);
  const uint32_t me = (*primary)->index();
  for (ServerInfo& s : *map.mutable_servers()) {
    if (s.index() != me) s.set_data_address(listener.address());
  }
  scheduler->Publish(map);
  absl::SleepFor(absl::Milliseconds(500));  // the new copies' snapshots sent
  const int before = listener.accepted();
  absl::SleepFor(absl::Seconds(1));
  EXPECT_GT(listener.accepted(), 0) << "the primary never connected to its backup";
  EXPECT_LT(listener.accepted() - before, 25) << "connections made in one second";
}

}  // namespace
}  // namespace shardps
