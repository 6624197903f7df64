// The scheduler's etcd backend against a real etcd (tests/test_etcd.h):
// fencing of a deposed scheduler's writes, a corrupt state refused, and a
// sync job whose active scheduler is SIGKILLed while a standby takes over;
// and (without etcd) what a node hears from a standby.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/scheduler_client.h"
#include "scheduler/etcd_client.h"
#include "scheduler/etcd_election.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_service.h"
#include "tests/test_etcd.h"
#include "tests/test_training.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class EtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto etcd = TestEtcd::Start();
    if (etcd.ok()) {
      etcd_ = etcd->release();
    } else {
      error_ = new std::string(etcd.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(etcd_, nullptr) << "cannot start etcd: " << *error_; }
  static const std::string& endpoint() { return etcd_->endpoint(); }
  // A key prefix no other test uses.
  static std::string Prefix(const std::string& test) { return absl::StrCat("/shardps-test-", getpid(), "/", test); }

  static TestEtcd* etcd_;
  static std::string* error_;
};
TestEtcd* EtcdTest::etcd_ = nullptr;
std::string* EtcdTest::error_ = nullptr;

// The daemon's own answer to a Status call.
absl::StatusOr<StatusResponse> StatusOfDaemon(SchedulerDaemon& daemon) {
  auto client = SchedulerClient::Create(daemon.address());
  if (!client.ok()) return client.status();
  return (*client)->Status(absl::Seconds(2));
}

// Before its first campaign a standby knows no active scheduler; a node must
// still read its answer as a standby's, not as a scheduler it cannot reach.
TEST(StandbyTest, ANodeAskingAStandbyThatKnowsNoActiveSchedulerIsToldItIsAStandby) {
  auto port = FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  std::unique_ptr<Scheduler::Service> standby = NewStandbySchedulerService(ClusterConfig(), address);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(standby.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr) << "cannot listen on " << address;
  auto client = SchedulerClient::Create(address);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<StatusResponse> status = (*client)->Status(absl::Seconds(5));
  server->Shutdown();
  ASSERT_TRUE(absl::IsUnavailable(status.status())) << status.status();
  const std::string message(status.status().message());
  EXPECT_THAT(message, HasSubstr(absl::StrCat("standby scheduler at ", address, "; no active scheduler known yet")));
  EXPECT_THAT(message, Not(HasSubstr("cannot reach")));
}

TEST_F(EtcdTest, ADeposedSchedulersStateWriteIsRefusedAndItsSuccessorsStateStands) {
  const std::string prefix = Prefix("fence");
  auto a = EtcdElection::Create({.endpoints = endpoint(), .prefix = prefix, .address = "a:1", .ttl = absl::Seconds(2)});
  auto b = EtcdElection::Create({.endpoints = endpoint(), .prefix = prefix, .address = "b:2", .ttl = absl::Seconds(2)});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::string active;
  absl::StatusOr<bool> a_won = (*a)->Campaign(&active), b_won = (*b)->Campaign(&active);
  ASSERT_TRUE(a_won.ok() && *a_won) << a_won.status();
  ASSERT_TRUE(b_won.ok() && !*b_won) << b_won.status();
  EXPECT_EQ(active, "a:1");
  ASSERT_TRUE((*a)->StoreState("a's state").ok());

  // `a` stalls (no renewals): its lease expires and `b` wins.
  absl::StatusOr<bool> won = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (won.ok() && !*won && absl::Now() < deadline) {
    ASSERT_TRUE((*b)->KeepAlive().ok());
    absl::SleepFor((*b)->poll_period());
    won = (*b)->Campaign(&active);
  }
  ASSERT_TRUE(won.ok() && *won) << "the standby never took over the expired leadership: " << won.status();
  ASSERT_TRUE((*b)->StoreState("b's state").ok());

  absl::Status late = (*a)->StoreState("a's late state");
  EXPECT_TRUE(absl::IsFailedPrecondition(late)) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr(prefix + "/leader"));
  auto saved = (*b)->LoadState();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*saved, "b's state");
  absl::Status renewed = (*a)->KeepAlive();
  EXPECT_TRUE(absl::IsFailedPrecondition(renewed)) << "a deposed scheduler must learn it lost its lease: " << renewed;
}

TEST_F(EtcdTest, ASchedulerRefusesACorruptStateNamingTheKey) {
  const std::string prefix = Prefix("corrupt");
  auto client = EtcdClient::Create(endpoint());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put(prefix + "/state", "not a sealed record").ok());
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.etcd_endpoints = endpoint();
  options.etcd_prefix = prefix;
  auto daemon = SchedulerDaemon::Create(options);
  ASSERT_FALSE(daemon.ok());
  EXPECT_THAT(std::string(daemon.status().message()), HasSubstr("etcd key " + prefix + "/state"));
}

TEST_F(EtcdTest, AnActiveSchedulerThatLosesItsLeaseStopsServingAndSaysWhy) {
  const std::string prefix = Prefix("lost");
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.config.set_heartbeat_timeout_ms(2000);
  options.etcd_endpoints = endpoint();
  options.etcd_prefix = prefix;
  auto daemon = SchedulerDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE(StatusOfDaemon(**daemon).ok()) << "the only scheduler should be active";
  // The lease goes (as when etcd expires it): the leader key goes with it.
  auto client = EtcdClient::Create(endpoint());
  ASSERT_TRUE(client.ok()) << client.status();
  auto leader = (*client)->Get(prefix + "/leader");
  ASSERT_TRUE(leader.ok() && leader->has_value()) << leader.status();
  ASSERT_TRUE((*client)->RevokeLease((*leader)->lease).ok());

  absl::Notification stopped;
  std::thread waiter([&] {
    (*daemon)->Wait();
    stopped.Notify();
  });
  const bool stopped_by_itself = stopped.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!stopped_by_itself) (*daemon)->Shutdown();
  waiter.join();
  ASSERT_TRUE(stopped_by_itself) << "a scheduler without its lease kept serving";
  absl::Status failure = (*daemon)->Failure();
  EXPECT_TRUE(absl::IsFailedPrecondition(failure)) << failure;
  EXPECT_THAT(std::string(failure.message()), HasSubstr("lost its etcd lease"));
}

TEST_F(EtcdTest, TwoConcurrentShutdownsBothReturnAndHandTheLeadershipBack) {
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.config.set_heartbeat_timeout_ms(60000);  // only a handed-back lease lets the next one win in time
  options.etcd_endpoints = endpoint();
  options.etcd_prefix = Prefix("shutdowns");
  auto first = SchedulerDaemon::Create(options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(StatusOfDaemon(**first).ok()) << "the only scheduler should be active";
  std::thread other([&] { (*first)->Shutdown(); });
  (*first)->Shutdown();
  other.join();
  EXPECT_TRUE((*first)->Failure().ok()) << (*first)->Failure();
  auto next = SchedulerDaemon::Create(options);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(StatusOfDaemon(**next).ok()) << "the lease was not handed back on shutdown";
}

TEST_F(EtcdTest, EtcdAndAStateDirectoryExcludeEachOther) {
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.etcd_endpoints = endpoint();
  options.state_dir = "/tmp/unused";
  auto daemon = SchedulerDaemon::Create(options);
  EXPECT_TRUE(absl::IsInvalidArgument(daemon.status())) << daemon.status();
}

// Processes stopped (SIGTERM, then SIGKILL) when the test ends.
struct Processes {
  ~Processes() {
    for (ChildProcess& p : list) {
      if (p.running()) Stop(p, absl::Seconds(5));
    }
  }
  std::vector<ChildProcess> list;
};

// Whether the scheduler at `address` alone answers as the active one.
absl::StatusOr<StatusResponse> StatusOf(const std::string& address) {
  auto client = SchedulerClient::Create(address);
  if (!client.ok()) return client.status();
  return (*client)->Status(absl::Seconds(2));
}

// Starts a scheduler with --etcd and returns its address once it serves.
absl::StatusOr<std::string> StartScheduler(const std::string& config_file, const std::string& etcd,
                                           const std::string& prefix, const std::string& port_file,
                                           Processes& processes) {
  auto child = Spawn("scheduler", {SHARDPS_BINARY, "scheduler", "--listen", "127.0.0.1:0", "--config", config_file,
                                   "--etcd", etcd, "--etcd-prefix", prefix, "--port-file", port_file},
                     true);
  if (!child.ok()) return child.status();
  processes.list.push_back(*child);
  std::vector<ChildProcess> watch = {*child};
  return WaitForAddressFile(port_file, watch, absl::Now() + absl::Seconds(30));
}

// Every server and worker of `config` heartbeats to the scheduler at
// `address` (it took over with their ids); false at the deadline.
bool EveryNodeFollowed(const std::string& address, const ClusterConfig& config, absl::Time deadline) {
  while (absl::Now() < deadline) {
    auto status = StatusOf(address);
    size_t heard = 0;
    if (status.ok()) {
      for (const NodeStatus& n : status->nodes()) heard += n.heard_since_start() && n.alive() ? 1 : 0;
    }
    if (heard == config.num_servers() + config.num_workers()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_F(EtcdTest, TheStandbyTakesOverFromAKilledSchedulerAndTheJobEndsWithTheFaultFreeWeights) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST is not installed (tools/setup.sh installs it)";
  ClusterConfig config = TrainingConfig(SYNC, 3, 2);
  config.set_deterministic(true);
  config.set_heartbeat_interval_ms(200);
  config.set_heartbeat_timeout_ms(2000);  // the lease's TTL: 2 s
  config.set_request_timeout_ms(120000);
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("shardps-etcd-job-", getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cluster.pbtxt") << config.DebugString();
  Processes processes;
  const std::string prefix = Prefix("job");
  auto first = StartScheduler(dir + "/cluster.pbtxt", endpoint(), prefix, dir + "/a.addr", processes);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StartScheduler(dir + "/cluster.pbtxt", endpoint(), prefix, dir + "/b.addr", processes);
  ASSERT_TRUE(second.ok()) << second.status();
  // The first one won; the second is a standby that names it.
  ASSERT_TRUE(StatusOf(*first).ok());
  absl::StatusOr<StatusResponse> standby = StatusOf(*second);
  ASSERT_TRUE(absl::IsUnavailable(standby.status())) << standby.status();
  EXPECT_THAT(std::string(standby.status().message()),
              HasSubstr(absl::StrCat("standby scheduler at ", *second, "; active is ", *first)));

  // Nodes name the standby first: they must move past it.
  const std::string schedulers = absl::StrCat(*second, ",", *first);
  for (int i = 0; i < 3; ++i) {
    auto server = Spawn(absl::StrCat("server ", i),
                        {SHARDPS_BINARY, "server", "--scheduler", schedulers, "--listen", "tcp://127.0.0.1:0"}, true);
    ASSERT_TRUE(server.ok()) << server.status();
    processes.list.push_back(*server);
  }
  TrainOptions options = QuietRun(1, 8000, 500);
  std::vector<absl::StatusOr<TrainResult>> results(2, absl::UnknownError("not run"));
  absl::Notification release;  // workers keep heartbeating until the test has seen them follow
  std::vector<std::thread> workers;
  for (uint32_t r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      TrainOptions o = options;
      if (r == 0) o.progress_file = dir + "/progress";
      auto w = Worker::Create({.scheduler_address = schedulers, .rank = r});
      if (!w.ok()) {
        results[r] = w.status();
        return;
      }
      std::ostringstream log;
      results[r] = RunTrainingWorker(**w, o, log);
      release.WaitForNotificationWithTimeout(absl::Seconds(60));
    });
  }

  // SIGKILL the active scheduler once rank 0 has taken 15 steps.
  const absl::Time wait_until = absl::Now() + absl::Seconds(60);
  int steps = 0;
  while (steps < 15 && absl::Now() < wait_until) {
    std::ifstream(dir + "/progress") >> steps;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(steps, 15) << "training did not reach step 15";
  auto before = StatusOf(*first);
  ASSERT_TRUE(before.ok()) << before.status();
  Kill(processes.list[0]);
  const absl::Time killed = absl::Now();
  absl::StatusOr<StatusResponse> after = absl::UnavailableError("not asked");
  while (!after.ok() && absl::Now() < killed + absl::Seconds(30)) {
    after = StatusOf(*second);
    if (!after.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(after.ok()) << "the standby did not take over: " << after.status();
  std::cout << "takeover: the standby served " << absl::ToDoubleSeconds(absl::Now() - killed)
            << " s after the active scheduler's SIGKILL (lease TTL 2 s)\n";
  EXPECT_EQ(after->shard_map().epoch(), before->shard_map().epoch());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(after->shard_map(), before->shard_map()))
      << "the standby took over another map";
  EXPECT_TRUE(EveryNodeFollowed(*second, config, absl::Now() + absl::Seconds(20)))
      << "not every server and worker heartbeats to the new active scheduler";
  release.Notify();
  for (std::thread& t : workers) t.join();

  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  std::ostringstream log;
  auto reference = RunReference(config, options, log);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // Bitwise the fault-free job's weights: no update was lost or applied twice.
  EXPECT_EQ(WeightsSha256(results[0]->params), WeightsSha256(reference->params));
  EXPECT_EQ(WeightsSha256(results[1]->params), WeightsSha256(reference->params));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardps
