// Checkpoints end to end, multi-process: `shardps local` writes a checkpoint
// at the first epoch's last round, every process of the cluster is SIGKILLed,
// and `shardps local --resume` trains the second epoch. Also the other
// operator's command on a running job, `shardps drain`.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_store.h"
#include "common/durable_file.h"
#include "tests/sanitizer_slowdown.h"

namespace shardps {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// 2 workers x 32 images per step over 2560 images: 40 steps (rounds) an epoch.
constexpr int kStepsPerEpoch = 40;

struct LocalJob {
  pid_t pid = -1;  // leads its own process group: the launcher and every node
  std::string out_path, err_path;
};

// Starts `argv` (stdout and stderr to DIR/NAME.out and .err) as the leader
// of a new process group.
LocalJob Spawn(std::vector<std::string> argv, const std::string& dir, const std::string& name) {
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  LocalJob run{-1, dir + "/" + name + ".out", dir + "/" + name + ".err"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, run.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, run.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  if (posix_spawn(&run.pid, args[0], &actions, &attr, args.data(), environ) != 0) run.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return run;
}

// Starts `shardps local` on a small deterministic sync job plus `extra`
// (a flag given twice takes its last value).
LocalJob Start(const std::string& dir, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      SHARDPS_BINARY,  "local", "--servers",    "2",   "--workers",   "2", "--deterministic", "--epochs",  "2",
      "--train-limit", "2560",  "--test-limit", "500", "--log-every", "0", "--json",          "--timeout",
      absl::StrCat(120 * kTestSlowdown)};  // a sanitizer tree runs several times slower
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(argv, dir, name);
}

int Wait(const LocalJob& run) {
  int status = 0;
  if (run.pid <= 0 || waitpid(run.pid, &status, 0) != run.pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string JsonString(const std::string& json, const std::string& key) {
  std::smatch m;
  return std::regex_search(json, m, std::regex("\"" + key + "\": \"?([0-9a-f.]*)")) ? std::string(m[1]) : "";
}

// The scheduler address of `shardps local` job `running` (it writes that
// and rank 0's step count into its temporary directory) once rank 0 has
// made 60 steps, a few heartbeats in, so the scheduler has seen the pace;
// empty if that does not happen within a minute.
std::string SchedulerAfterSixtySteps(const LocalJob& running) {
  if (running.pid <= 0) return "";
  const fs::path local_dir = fs::temp_directory_path() / absl::StrCat("shardps-local-", running.pid);
  std::string address;
  int64_t steps = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60 * kTestSlowdown);
  while ((address.empty() || steps < 60) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    address = Slurp((local_dir / "scheduler.addr").string());
    std::istringstream(Slurp((local_dir / "progress.0").string())) >> steps;
  }
  return steps >= 60 ? address : "";
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / absl::StrCat("checkpoint-test-", getpid())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains with checkpoints every epoch and SIGKILLs the launcher and every
  // node as soon as the first epoch's checkpoint is complete. Returns its round directory.
  std::string CheckpointThenKillEverything() {
    const std::string ckpt = dir_ + "/ckpt";
    LocalJob run =
        Start(dir_, "checkpointed", {"--checkpoint-dir", ckpt, "--checkpoint-every", absl::StrCat(kStepsPerEpoch)});
    EXPECT_GT(run.pid, 0);
    const std::string round_dir = CheckpointRoundDir(ckpt, kStepsPerEpoch);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!VerifyCheckpointRound(round_dir).ok() && std::chrono::steady_clock::now() < deadline &&
           waitpid(run.pid, nullptr, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(-run.pid, SIGKILL);
    EXPECT_EQ(Wait(run), 128 + SIGKILL) << "the job ended before the kill: " << Slurp(run.err_path);
    fs::remove_all(fs::temp_directory_path() / absl::StrCat("shardps-local-", run.pid));  // the launcher's
    return round_dir;
  }

  // Runs the `shardps local` job `job` (*running), asks `shardps checkpoint`
  // into `ckpt` once rank 0 made 60 steps, waits for both to end well, and
  // sets *point to the checkpoint's restore point.
  void CheckpointMidTraining(const std::vector<std::string>& job, const std::string& ckpt, LocalJob* running,
                             RestorePoint* point) {
    *running = Start(dir_, "running", job);
    const std::string address = SchedulerAfterSixtySteps(*running);
    ASSERT_FALSE(address.empty()) << Slurp(running->err_path);
    LocalJob asked =
        Spawn({SHARDPS_BINARY, "checkpoint", "--scheduler", address, "--dir", ckpt, "--wait", "60"}, dir_, "asked");
    ASSERT_EQ(Wait(asked), 0) << Slurp(asked.err_path) << Slurp(running->err_path);
    EXPECT_THAT(Slurp(asked.out_path), HasSubstr("complete"));
    ASSERT_EQ(Wait(*running), 0) << Slurp(running->err_path);
    auto found = FindRestorePoint(ckpt);
    ASSERT_TRUE(found.ok()) << found.status();
    *point = *found;
  }

  std::string dir_;
};

TEST_F(CheckpointTest, ResumingAfterEveryProcessWasKilledEndsWithBitwiseTheStraightRunsWeights) {
  LocalJob straight = Start(dir_, "straight", {});
  ASSERT_EQ(Wait(straight), 0) << Slurp(straight.err_path);
  const std::string round_dir = CheckpointThenKillEverything();
  LocalJob resumed = Start(dir_, "resumed", {"--resume", round_dir});
  ASSERT_EQ(Wait(resumed), 0) << Slurp(resumed.err_path);
  const std::string a = Slurp(straight.out_path), b = Slurp(resumed.out_path);
  ASSERT_EQ(JsonString(a, "weights_sha256").size(), 64u) << a;
  EXPECT_EQ(JsonString(b, "weights_sha256"), JsonString(a, "weights_sha256")) << a << "\n" << b;
  // The resumed job trained the second epoch only.
  EXPECT_EQ(JsonString(a, "steps"), absl::StrCat(2 * kStepsPerEpoch));
  EXPECT_EQ(JsonString(b, "steps"), absl::StrCat(kStepsPerEpoch));
}

TEST_F(CheckpointTest, ACorruptCheckpointIsRefusedNamingTheFile) {
  const std::string round_dir = CheckpointThenKillEverything();
  std::string file;  // partition-0.server-I.ckpt, I its primary's index
  for (const fs::directory_entry& e : fs::directory_iterator(round_dir)) {
    if (e.path().filename().string().starts_with("partition-0.server-")) file = e.path().string();
  }
  ASSERT_FALSE(file.empty()) << "no file of partition 0 in " << round_dir;
  auto data = ReadWholeFile(file);
  ASSERT_TRUE(data.ok()) << data.status();
  (*data)[data->size() / 2] ^= 1;
  ASSERT_TRUE(WriteFileDurably(file, *data).ok());
  LocalJob resumed = Start(dir_, "resumed", {"--resume", round_dir});
  EXPECT_NE(Wait(resumed), 0);
  EXPECT_THAT(Slurp(resumed.err_path), HasSubstr(file));
}

TEST_F(CheckpointTest, ACheckpointAskedForMidTrainingResumesToBitwiseTheUninterruptedRunsWeights) {
  // 400 rounds; heartbeats every 0.1 s, so the scheduler knows each server's
  // round and pace, and places the checkpoint a few dozen rounds ahead.
  std::vector<std::string> job = {"--train-limit", "12800", "--set", "heartbeat_interval_ms=100"};
  const std::string ckpt = dir_ + "/asked";
  LocalJob running;
  RestorePoint point;
  ASSERT_NO_FATAL_FAILURE(CheckpointMidTraining(job, ckpt, &running, &point));
  EXPECT_GT(point.round, 0u);
  EXPECT_LT(point.round, 400u);
  job.insert(job.end(), {"--resume", ckpt});
  LocalJob resumed = Start(dir_, "resumed", job);
  ASSERT_EQ(Wait(resumed), 0) << Slurp(resumed.err_path);
  const std::string a = Slurp(running.out_path), b = Slurp(resumed.out_path);
  ASSERT_EQ(JsonString(a, "weights_sha256").size(), 64u) << a;
  EXPECT_EQ(JsonString(b, "weights_sha256"), JsonString(a, "weights_sha256")) << a << "\n" << b;
  EXPECT_EQ(JsonString(b, "steps"), absl::StrCat(400 - point.round));
  // The servers began at the checkpoint's round: those rounds are neither
  // lost nor applied twice.
  EXPECT_EQ(JsonString(b, "lost_updates"), "0") << b;
  EXPECT_EQ(JsonString(b, "duplicate_updates"), "0") << b;
}

TEST_F(CheckpointTest, AnAsyncCheckpointHoldsEachPartitionAtItsVersionAndAJobResumesFromIt) {
  // Async has no round at which every partition agrees: each primary writes
  // its partitions at once, at the versions they have; the checkpoint is
  // labelled with the workers' steps, where a restored job resumes.
  std::vector<std::string> job = {"--consistency", "async", "--deterministic=false", "--train-limit", "12800",
                                  "--set", "heartbeat_interval_ms=100"};
  const std::string ckpt = dir_ + "/async";
  LocalJob running;
  RestorePoint point;
  ASSERT_NO_FATAL_FAILURE(CheckpointMidTraining(job, ckpt, &running, &point));
  EXPECT_GE(point.round, 20u) << "labelled with the workers' steps (as last reported)";
  EXPECT_LT(point.round, 400u);
  const std::string round_dir = CheckpointRoundDir(ckpt, point.round);
  for (uint64_t id = 0; id < 6; ++id) {  // the MLP's six tensors, one partition each
    auto state = LoadPartitionCheckpoint(round_dir, id);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_TRUE(state->has_version()) << "partition " << id;
    EXPECT_GT(state->version(), 0u) << "partition " << id << ": updates applied before the checkpoint";
  }
  job.insert(job.end(), {"--resume", ckpt});
  LocalJob resumed = Start(dir_, "resumed", job);
  ASSERT_EQ(Wait(resumed), 0) << Slurp(resumed.err_path);
  const std::string out = Slurp(resumed.out_path);
  EXPECT_GT(std::stoi(JsonString(out, "steps")), 0) << out;
  // At most a step (the workers resume past --max-steps): the accuracy is
  // that of the checkpoint's trained weights (an MLP a step from its
  // initial weights scores about 0.1-0.3).
  std::vector<std::string> evaluate = job;
  evaluate.insert(evaluate.end(), {"--max-steps", "1"});
  LocalJob restored = Start(dir_, "restored", evaluate);
  ASSERT_EQ(Wait(restored), 0) << Slurp(restored.err_path);
  const std::string weights = Slurp(restored.out_path);
  EXPECT_LE(std::stoi(JsonString(weights, "steps")), 1) << weights;
  EXPECT_GT(std::stod(JsonString(weights, "test_accuracy")), 0.5) << weights;
  // Where a sync job refuses it: the checkpoint holds versions, not a round.
  LocalJob sync = Start(dir_, "sync", {"--train-limit", "12800", "--resume", ckpt});
  EXPECT_NE(Wait(sync), 0);
  EXPECT_THAT(Slurp(sync.err_path), HasSubstr("is an async checkpoint"));
}

TEST_F(CheckpointTest, AnSspCheckpointIsWrittenAsInAsyncAndAJobResumesFromIt) {
  // Ssp applies pushes on arrival (only answers wait for the bound), so its
  // checkpoints are async's: each partition at its version, on request.
  std::vector<std::string> job = {"--consistency", "ssp", "--set", "staleness=2", "--deterministic=false",
                                  "--train-limit", "12800", "--set", "heartbeat_interval_ms=100"};
  const std::string ckpt = dir_ + "/ssp";
  LocalJob running;
  RestorePoint point;
  ASSERT_NO_FATAL_FAILURE(CheckpointMidTraining(job, ckpt, &running, &point));
  auto state = LoadPartitionCheckpoint(point.round_dir, 0);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_GT(state->version(), 0u);
  job.insert(job.end(), {"--resume", ckpt});
  LocalJob resumed = Start(dir_, "resumed", job);
  ASSERT_EQ(Wait(resumed), 0) << Slurp(resumed.err_path);
  const std::string out = Slurp(resumed.out_path);
  EXPECT_GT(std::stoi(JsonString(out, "steps")), 0) << out;
  EXPECT_LT(std::stoi(JsonString(out, "steps")), 400) << "resumed at the checkpoint's label: " << out;
}

TEST_F(CheckpointTest, ACheckpointNoServerCanWriteFailsAtOnceNamingTheServerAndTrainingGoesOn) {
  // A regular file where the directory should be: no server can create the
  // round's directory. `shardps checkpoint` ends with the servers' reason
  // (heartbeats carry it) instead of waiting out --wait.
  LocalJob running = Start(dir_, "running", {"--train-limit", "12800", "--set", "heartbeat_interval_ms=100"});
  const std::string address = SchedulerAfterSixtySteps(running);
  ASSERT_FALSE(address.empty()) << Slurp(running.err_path);
  const std::string blocked = dir_ + "/not-a-directory";
  std::ofstream(blocked) << "a file";
  LocalJob asked =
      Spawn({SHARDPS_BINARY, "checkpoint", "--scheduler", address, "--dir", blocked, "--wait", "600"}, dir_, "asked");
  EXPECT_EQ(Wait(asked), 1) << Slurp(asked.err_path);
  const std::string err = Slurp(asked.err_path);
  EXPECT_THAT(err, HasSubstr("cannot complete: server "));
  EXPECT_THAT(err, HasSubstr("could not write its part"));
  EXPECT_THAT(err, Not(HasSubstr("not complete after")));
  ASSERT_EQ(Wait(running), 0) << Slurp(running.err_path);
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

// `shardps local --eval-every N` (next to the checkpoint tests for their
// launcher helpers): worker 0 alone evaluates every N of its steps and the
// final weights, and its last point is the job's reported accuracy.
TEST(LocalCommandTest, EvalEveryPrintsWorkerZerosAccuracyEndingAtTheJobsResult) {
  const std::string dir = (fs::temp_directory_path() / absl::StrCat("local-eval-test-", getpid())).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  LocalJob run = Start(dir, "eval", {"--epochs", "1", "--eval-every", "16"});
  ASSERT_EQ(Wait(run), 0) << Slurp(run.err_path);
  const std::string out = Slurp(run.out_path), err = Slurp(run.err_path);
  fs::remove_all(dir);
  std::vector<std::pair<int, std::string>> points;  // step, accuracy
  const std::regex point("\\{\"eval_step\": ([0-9]+),.*\"test_accuracy\": ([0-9.]+), \"final\": (true|false)\\}");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), point); it != std::sregex_iterator(); ++it) {
    points.emplace_back(std::stoi((*it)[1]), (*it)[2]);
    EXPECT_EQ((*it)[3] == "true", points.back().first == kStepsPerEpoch) << it->str();
  }
  ASSERT_EQ(points.size(), 3u) << "one point at steps 16, 32 and the final 40 (worker 0 only): " << err;
  EXPECT_EQ(points[0].first, 16);
  EXPECT_EQ(points[1].first, 32);
  EXPECT_EQ(points[2].first, kStepsPerEpoch);
  const std::string reported = JsonString(out, "test_accuracy");
  ASSERT_FALSE(reported.empty()) << out;
  EXPECT_NEAR(std::stod(points[2].second), std::stod(reported), 0.00005) << out;
}

using DrainCommandTest = CheckpointTest;

TEST_F(DrainCommandTest, ADrainedServerStopsAndLeavesAndTheJobTrainsOnWithTheOthers) {
  LocalJob running = Start(dir_, "running", {"--servers", "3", "--train-limit", "12800"});
  const std::string address = SchedulerAfterSixtySteps(running);
  ASSERT_FALSE(address.empty()) << Slurp(running.err_path);
  LocalJob missing = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "9"}, dir_, "missing");
  EXPECT_EQ(Wait(missing), 1);
  EXPECT_THAT(Slurp(missing.err_path), HasSubstr("there is no server 9 in the cluster"));
  LocalJob drain =
      Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "2", "--wait", "60"}, dir_, "drain");
  EXPECT_EQ(Wait(drain), 0) << Slurp(drain.err_path);
  const std::string said = Slurp(drain.out_path);
  EXPECT_THAT(said, HasSubstr("server 2 drains from shard map epoch"));
  EXPECT_THAT(said, HasSubstr("server 2 drained, stopped and left the job after"));
  // Two servers are left with replication 2: a second drain is refused.
  LocalJob second = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "1"}, dir_, "second");
  EXPECT_EQ(Wait(second), 1);
  EXPECT_THAT(Slurp(second.err_path), HasSubstr("start another server first"));
  // Nothing to cancel: a server that is not draining, and one that left.
  LocalJob idle = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "1", "--cancel"}, dir_, "idle");
  EXPECT_EQ(Wait(idle), 1);
  EXPECT_THAT(Slurp(idle.err_path), HasSubstr("is not draining"));
  LocalJob gone = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "2", "--cancel"}, dir_, "gone");
  EXPECT_EQ(Wait(gone), 1);
  EXPECT_THAT(Slurp(gone.err_path), HasSubstr("left the job already; there is no drain to cancel"));
  ASSERT_EQ(Wait(running), 0) << Slurp(running.err_path);
  EXPECT_THAT(Slurp(running.err_path), HasSubstr("stopped cleanly (drained, or a SIGTERM from outside)"));
}

TEST_F(DrainCommandTest, ACancelledDrainIsSaidOnlyOnceTheServerIsNoLongerDraining) {
  // A model of many partitions, so the drain is still under way when the
  // cancel comes; the command reads the map back before it says so.
  LocalJob running = Start(dir_, "running",
                           {"--servers", "3", "--train-limit", "6400", "--hidden", "1024,1024", "--set",
                            "partition_bytes=65536"});
  const std::string address = SchedulerAfterSixtySteps(running);
  ASSERT_FALSE(address.empty()) << Slurp(running.err_path);
  LocalJob drain = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "2", "--wait", "0"}, dir_, "drain");
  ASSERT_EQ(Wait(drain), 0) << Slurp(drain.err_path);
  LocalJob cancel = Spawn({SHARDPS_BINARY, "drain", "--scheduler", address, "--server", "2", "--cancel"}, dir_, "cancel");
  EXPECT_EQ(Wait(cancel), 0) << Slurp(cancel.err_path);
  EXPECT_THAT(Slurp(cancel.out_path), HasSubstr("the drain of server 2 is cancelled from shard map epoch"));
  LocalJob status = Spawn({SHARDPS_BINARY, "status", "--scheduler", address, "--json"}, dir_, "status");
  ASSERT_EQ(Wait(status), 0) << Slurp(status.err_path);
  EXPECT_THAT(Slurp(status.out_path), Not(ContainsRegex("\"draining\": ?true")));
  ASSERT_EQ(Wait(running), 0) << Slurp(running.err_path);
}

}  // namespace
}  // namespace shardps
