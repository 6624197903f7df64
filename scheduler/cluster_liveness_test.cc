// Failure handling in the scheduler's rules: declaring silent nodes dead,
// removing dead workers from the job, and resuming from a persisted state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <functional>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/scheduler_refusal.h"
#include "common/shard_map.h"
#include "common/tensor_spec.h"
#include "common/warning_lines_test_util.h"
#include "scheduler/cluster_state.h"
#include "scheduler/model_limits.h"

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

RegisterRequest Node(Role role, uint32_t rank, const std::string& addr = "") {
  RegisterRequest r;
  r.set_protocol_version(kProtocolVersion);
  r.set_role(role);
  r.set_rank(rank);
  r.set_data_address(addr);
  r.set_host("h");
  return r;
}

TensorSpec Tensor(const std::string& name, int64_t n) { return Float32Tensor(name, n); }

// Returns once `calls` registrations of `rank` wait for the servers'
// reports before it rejoins (a fixed sleep lost that race on a loaded
// machine, and the reports the test sends next came before the call).
void AwaitRejoinCalls(ClusterState& state, uint32_t rank, int calls = 1) {
  for (int i = 0; i < 1000 && state.RejoinCallsWaiting(rank) < calls; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(state.RejoinCallsWaiting(rank), calls) << "rank " << rank << "'s registration does not wait";
}

// Defines tensors w, v and u (1000 floats each) while `beat(epoch)` has the
// servers report epoch 0, then, a moment later, the map's epoch 1.
absl::StatusOr<ShardMap> DefineThreeTensors(ClusterState& state, const std::function<void(uint64_t)>& beat) {
  beat(0);
  std::thread serve([&beat] {
    absl::SleepFor(absl::Milliseconds(50));
    beat(1);
  });
  auto defined = state.DefineTensors({Tensor("w", 1000), Tensor("v", 1000), Tensor("u", 1000)},
                                     absl::Now() + absl::Seconds(5));
  serve.join();
  return defined;
}

// Registers a process for removed rank `rank` as Worker::Create does: it
// asks again while told to (its rejoin's wait goes on).
absl::StatusOr<RegisterResponse> Rejoin(ClusterState& state, uint32_t rank) {
  absl::StatusOr<RegisterResponse> r;
  do {
    r = state.RegisterWorker(Node(WORKER, rank));
  } while (absl::IsAborted(r.status()) && IsRejoinAskAgainRefusal(r.status().message()));
  return r;
}

// A 2-server, 3-worker cluster on a clock the test moves; tensors defined.
class LivenessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.set_num_servers(2);
    config_.set_num_workers(3);
    config_.set_heartbeat_timeout_ms(1000);
    state_ = std::make_unique<ClusterState>(config_, [this] { return now_; },
                                            [this](const SchedulerState& s) {
                                              if (on_write_) on_write_(s);
                                              if (!write_result_.ok()) return write_result_;
                                              saved_ = s;
                                              return absl::OkStatus();
                                            });
    for (uint32_t i = 0; i < 2; ++i) {
      auto r = state_->RegisterServer(Node(SERVER, 0, "tcp://s:" + std::to_string(i + 1)));
      ASSERT_TRUE(r.ok()) << r.status();
      server_ids_.push_back(r->node_id());
    }
    for (uint32_t r = 0; r < 3; ++r) worker_ids_.push_back(state_->RegisterWorker(Node(WORKER, r))->node_id());
    Beat({0, 1}, {0, 1, 2}, 0);  // not serving an epoch yet: DefineTensors waits for epoch 1
    std::thread serve([this] {
      absl::SleepFor(absl::Milliseconds(50));
      Beat({0, 1}, {}, 1);
    });
    auto map = state_->DefineTensors({Tensor("w", 1000)}, absl::Now() + absl::Seconds(5));
    serve.join();
    ASSERT_TRUE(map.ok()) << map.status();
    ASSERT_THAT(state_->CheckLiveness(), IsEmpty());  // the cluster has formed: clocks start
  }

  // Moves the clock in 100 ms ticks, checking liveness at each as the
  // scheduler does; returns every line declared.
  std::vector<std::string> Advance(int ms) {
    std::vector<std::string> lines;
    for (int t = 0; t < ms; t += 100) {
      now_ += absl::Milliseconds(std::min(100, ms - t));
      for (std::string& l : state_->CheckLiveness()) lines.push_back(std::move(l));
    }
    return lines;
  }

  void Beat(std::vector<int> servers, std::vector<int> workers, uint64_t epoch) {
    for (int i : servers) {
      HeartbeatRequest h;
      h.set_node_id(server_ids_[i]);
      h.set_applied_epoch(epoch);
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
    for (int r : workers) {
      HeartbeatRequest h;
      h.set_node_id(worker_ids_[r]);
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
  }

  // Node `id`'s last heartbeat, saying it leaves the job.
  absl::Status Leave(uint64_t id) {
    HeartbeatRequest leaving;
    leaving.set_node_id(id);
    leaving.set_leaving(true);
    return state_->Heartbeat(leaving).status();
  }

  // Servers report round 0, then a second later `round` (server 0) and a
  // little less (server 1): `round` rounds a second.
  // Rounds reported at 50, then every worker leaves and rank 0 asks to
  // rejoin; each server i then reports at the removal's epoch what
  // `report(i, h)` sets. Returns rank 0's registration.
  absl::StatusOr<RegisterResponse> RejoinAloneAfterEveryWorkerLeft(
      const std::function<void(size_t, HeartbeatRequest&)>& report) {
    ReportRounds(50);
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_TRUE(Leave(worker_ids_[r]).ok());
    }
    absl::StatusOr<RegisterResponse> first;
    std::thread rejoin([&] { first = Rejoin(*state_, 0); });
    AwaitRejoinCalls(*state_, 0);
    now_ += absl::Milliseconds(100);
    const uint64_t epoch = state_->Status().shard_map().epoch();  // the one that removed the workers
    for (size_t i = 0; i < server_ids_.size(); ++i) {
      HeartbeatRequest h;
      h.set_node_id(server_ids_[i]);
      h.set_applied_epoch(epoch);
      report(i, h);
      EXPECT_TRUE(state_->Heartbeat(h).ok());
    }
    rejoin.join();
    return first;
  }

  // Every worker leaves after 50 rounds a second, server 1 falls silent,
  // and rank 0 asks to rejoin; server 0 reports (completed round 50, and what
  // `report` adds with the map it serves) every 100 ms until server 1 was
  // declared dead. Returns rank 0's registration; `lines` gets what
  // CheckLiveness declared.
  absl::StatusOr<RegisterResponse> RejoinAloneWhileServerOneDies(
      const std::function<void(const ShardMap&, HeartbeatRequest&)>& report, std::vector<std::string>& lines) {
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_TRUE(Leave(worker_ids_[r]).ok());
    }
    Report(0, 0);
    Report(1, 0);
    EXPECT_THAT(Advance(1000), IsEmpty());
    Report(0, 50);  // 50 rounds a second
    Report(1, 48);
    auto beat_server0 = [&] {
      const ShardMap map = state_->Status().shard_map();
      HeartbeatRequest h;
      h.set_node_id(server_ids_[0]);
      h.set_applied_epoch(map.epoch());
      h.set_completed_round(50);
      report(map, h);
      EXPECT_TRUE(state_->Heartbeat(h).ok());
    };
    EXPECT_THAT(Advance(500), IsEmpty());  // server 1 is silent from here on
    beat_server0();
    absl::StatusOr<RegisterResponse> rejoined;
    std::thread rejoin([&] { rejoined = Rejoin(*state_, 0); });
    AwaitRejoinCalls(*state_, 0);
    for (int t = 0; t < 8; ++t) {
      for (std::string& l : Advance(100)) lines.push_back(std::move(l));
      absl::SleepFor(absl::Milliseconds(20));  // a registration that need not wait for it goes on
      beat_server0();
    }
    rejoin.join();
    return rejoined;
  }

  // Servers 0 and 1 report `round0` and `round1` (rounds stall) and workers
  // 0 and 1 heartbeat, every 100 ms for 1.2 s, worker 2 silent; returns what
  // CheckLiveness declared.
  std::vector<std::string> StallUntilWorkerTwoIsDeclaredDead(uint64_t round0, uint64_t round1) {
    std::vector<std::string> declared;
    for (int k = 0; k < 12; ++k) {
      now_ += absl::Milliseconds(100);
      Report(0, round0);
      Report(1, round1);
      Beat({}, {0, 1}, 1);
      for (std::string& line : state_->CheckLiveness()) declared.push_back(line);
    }
    return declared;
  }

  void ReportRounds(uint64_t round) {
    Report(0, 0);
    Report(1, 0);
    now_ += absl::Seconds(1);
    Report(0, round);
    Report(1, round - 2);
  }
  void Report(int server, uint64_t completed) {
    HeartbeatRequest h;
    h.set_node_id(server_ids_[server]);
    h.set_applied_epoch(1);
    h.set_completed_round(completed);
    ASSERT_TRUE(state_->Heartbeat(h).ok());
  }

  ClusterConfig config_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::optional<SchedulerState> saved_;
  std::function<void(const SchedulerState&)> on_write_;  // called as each state is written
  absl::Status write_result_;  // what each write returns once on_write_ returned (OK: stored in saved_)
  std::unique_ptr<ClusterState> state_;
  std::vector<uint64_t> server_ids_, worker_ids_;
};

TEST_F(LivenessTest, NodesSilentPastTheTimeoutAreDeclaredDeadInANewEpoch) {
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);  // worker 2 stays silent
  std::vector<std::string> lines = Advance(200);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("worker rank 2"));
  EXPECT_THAT(lines[0], HasSubstr("declared dead: no heartbeat for 1.1s"));
  StatusResponse status = state_->Status();
  EXPECT_EQ(status.shard_map().epoch(), 2u);
  EXPECT_THAT(status.shard_map().excluded_workers(), ElementsAre(2));
  // Once declared dead, a node may not act as a member.
  HeartbeatRequest late;
  late.set_node_id(worker_ids_[2]);
  EXPECT_EQ(state_->Heartbeat(late).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(state_->CheckLiveness(), IsEmpty());  // declared once
}

TEST_F(LivenessTest, ANodeIsNotToldItWasDeclaredDeadBeforeTheDeclarationIsStored) {
  // fix20: a heartbeat handled while the write of a node's declaration was
  // under way (etcd) was refused as declared dead at once; the write was
  // then refused (another scheduler had taken over: this one was deposed),
  // so the job never stored the declaration, and the server told it was
  // dead stopped: a server lost for nothing.
  absl::Notification writing, answer;
  on_write_ = [&](const SchedulerState& s) {
    if (s.shard_map().servers(1).dead() && !writing.HasBeenNotified()) {
      writing.Notify();
      answer.WaitForNotification();
    }
  };
  ASSERT_THAT(Advance(600), IsEmpty());
  Beat({0}, {0, 1}, 1);  // server 1 and worker rank 2 are silent from here on (paused)
  ASSERT_THAT(Advance(400), IsEmpty());
  now_ += absl::Milliseconds(100);
  std::vector<std::string> declared;
  std::thread check([&] { declared = state_->CheckLiveness(); });
  writing.WaitForNotification();
  HeartbeatRequest resumed;  // server 1 resumes while its declaration is being written
  resumed.set_node_id(server_ids_[1]);
  resumed.set_applied_epoch(1);
  const absl::Status during = state_->Heartbeat(resumed).status();
  // So does rank 2, entering a barrier: told it was removed, a worker fails.
  const absl::Status barrier_during = state_->Barrier(worker_ids_[2], "epoch", absl::Now() + absl::Seconds(1));
  write_result_ = absl::FailedPreconditionError("etcd: refused to write the state: another scheduler holds the leadership");
  answer.Notify();
  check.join();
  ASSERT_THAT(declared, ElementsAre(HasSubstr("server 1"), HasSubstr("worker rank 2")));
  EXPECT_FALSE(IsDeclaredDeadRefusal(during.message())) << "told before the write was done: " << during;
  EXPECT_TRUE(absl::IsUnavailable(during)) << during;
  EXPECT_TRUE(absl::IsUnavailable(barrier_during)) << "told before the write was done: " << barrier_during;
  const absl::Status after = state_->Heartbeat(resumed).status();
  EXPECT_FALSE(IsDeclaredDeadRefusal(after.message())) << "the declaration was never stored: " << after;
  EXPECT_TRUE(absl::IsUnavailable(after)) << after;
  const absl::Status barrier_after = state_->Barrier(worker_ids_[2], "epoch", absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(barrier_after)) << "the declaration was never stored: " << barrier_after;
}

TEST_F(LivenessTest, ANodeIsToldItWasDeclaredDeadOnceTheMapThatFailedItOverWentOutThoughItsWriteFailed) {
  // review21: a write that failed without deposing this scheduler (a full
  // disk, etcd slow to answer) still sends its map to the servers
  // (WaitForMap), which fail the node over; the node itself was told "ask
  // again" until a write succeeded, and served on. A scheduler restarted
  // meanwhile on the older state (or a standby taking over from etcd) found
  // it alive and the primary of what it held before its pause, whose copies
  // missed the rounds the failover's primaries served.
  ASSERT_THAT(Advance(600), IsEmpty());
  Beat({0}, {0, 1, 2}, 1);  // server 1 is silent from here on (paused)
  write_result_ = absl::UnavailableError("disk full");
  const uint64_t before = state_->Status().shard_map().epoch();
  ASSERT_THAT(Advance(500), ElementsAre(HasSubstr("server 1")));
  const std::optional<ShardMap> published = state_->WaitForMap(before, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(published.has_value()) << "the failover's map went out to no server";
  ASSERT_TRUE(published->servers(1).dead());
  HeartbeatRequest resumed;  // server 1 resumes
  resumed.set_node_id(server_ids_[1]);
  resumed.set_applied_epoch(1);
  const absl::Status told = state_->Heartbeat(resumed).status();
  EXPECT_TRUE(IsDeclaredDeadRefusal(told.message())) << "the servers act on the declaration, the node is not told: "
                                                     << told;
}

TEST_F(LivenessTest, ADeadServerIsMarkedInTheMapWithTheReason) {
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0}, {0, 1, 2}, 1);
  ASSERT_THAT(Advance(600), SizeIs(1));
  ShardMap map = state_->Status().shard_map();
  for (const ServerInfo& s : map.servers()) {
    EXPECT_EQ(s.dead(), s.index() == 1);
    if (s.dead()) {
      EXPECT_THAT(s.dead_reason(), HasSubstr("no heartbeat for 1.1s"));
    }
  }
  EXPECT_THAT(map.excluded_workers(), IsEmpty());
}

TEST_F(LivenessTest, AServerThatStopsOnceEveryWorkerLeftIsMarkedInTheMapWithWhyAlsoInAnOlderState) {
  // fix20: a scheduler restarted on such a state and a worker started again
  // for the job: the worker was told "server 0 was declared dead by the
  // scheduler at shard map epoch 6 (); its partitions have no live replica".
  // Every other removal from the map says why (RemoveServer); this one did
  // not.
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(Leave(worker_ids_[r]).ok());
  }
  ASSERT_TRUE(Leave(server_ids_[0]).ok());
  const ShardMap map = state_->Status().shard_map();
  ASSERT_TRUE(map.servers(0).dead());
  EXPECT_THAT(map.servers(0).dead_reason(), HasSubstr("stopped after every worker had left the job"));
  // A state saved before it said so is told it on its restart.
  ASSERT_TRUE(saved_.has_value());
  SchedulerState older = *saved_;
  older.mutable_shard_map()->mutable_servers(0)->clear_dead_reason();
  const ShardMap restored = ClusterState::Restore(older, [this] { return now_; })->Status().shard_map();
  EXPECT_THAT(restored.servers(0).dead_reason(), HasSubstr("stopped after every worker had left the job"));
}

TEST_F(LivenessTest, ABarrierPassesWhenTheWorkerItWaitsForIsDeclaredDead) {
  absl::Status passed[2] = {absl::UnknownError("not run"), absl::UnknownError("not run")};
  std::vector<std::thread> waiters;
  for (int r = 0; r < 2; ++r) {
    waiters.emplace_back([&, r] { passed[r] = state_->Barrier(worker_ids_[r], "done", absl::Now() + absl::Seconds(10)); });
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(1));
  for (std::thread& t : waiters) t.join();
  EXPECT_TRUE(passed[0].ok()) << passed[0];
  EXPECT_TRUE(passed[1].ok()) << passed[1];
  EXPECT_EQ(state_->Barrier(worker_ids_[2], "done", absl::Now()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LivenessTest, AReplacementServerTakesTheDeadOnesPlace) {
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(2));
  // While the server at an address is alive, no second one takes it over.
  EXPECT_EQ(state_->RegisterServer(Node(SERVER, 0, "tcp://s:1")).status().code(), absl::StatusCode::kAlreadyExists);
  const uint64_t epoch = state_->Status().shard_map().epoch();
  const uint64_t dead_process = state_->Status().shard_map().servers(1).node_id();
  EXPECT_NE(dead_process, 0u);
  // Every partition had a copy on server 0 (replication 2), so a new server,
  // at another address, takes server 1's index and gets copies again.
  auto replacement = state_->RegisterServer(Node(SERVER, 0, "tcp://t:1"));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ(replacement->server_index(), 1u);
  EXPECT_TRUE(replacement->joins_running_job());
  const ShardMap map = state_->Status().shard_map();
  EXPECT_GT(map.epoch(), epoch);
  EXPECT_EQ(map.servers(1).data_address(), "tcp://t:1");
  EXPECT_FALSE(map.servers(1).dead());
  // Another process at the index: a worker that skipped the maps in between
  // tells it from the dead one by its node id.
  EXPECT_EQ(map.servers(1).node_id(), replacement->node_id());
  EXPECT_NE(map.servers(1).node_id(), dead_process);
  for (const PartitionInfo& p : map.partitions()) {
    EXPECT_EQ(p.server(), 0u) << p.ShortDebugString();  // primaries stay where workers send
    EXPECT_THAT(p.backups(), ElementsAre(1u)) << p.ShortDebugString();
    // Listed anew: a server that skipped this map takes its copy as new.
    auto listed = p.listed_at().find(1);
    ASSERT_NE(listed, p.listed_at().end()) << p.ShortDebugString();
    EXPECT_EQ(listed->second, map.epoch());
  }
  // The cluster is whole again: a third server joins as one more.
  auto third = state_->RegisterServer(Node(SERVER, 0, "tcp://u:2"));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->server_index(), 2u);
}

TEST_F(LivenessTest, AServerStartedWhileEveryPlaceIsAliveJoinsAsOneMoreAndCanBeReplacedInTurn) {
  Beat({0, 1}, {0, 1, 2}, 1);
  const uint64_t epoch = state_->Status().shard_map().epoch();
  auto joined = state_->RegisterServer(Node(SERVER, 0, "tcp://u:1"));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->server_index(), 2u);
  EXPECT_TRUE(joined->joins_running_job());  // its copies start empty and get snapshots
  ShardMap map = state_->Status().shard_map();
  EXPECT_GT(map.epoch(), epoch);
  ASSERT_EQ(map.servers_size(), 3);
  EXPECT_EQ(map.servers(2).index(), 2u);
  EXPECT_EQ(map.servers(2).data_address(), "tcp://u:1");
  EXPECT_EQ(map.servers(2).node_id(), joined->node_id());
  EXPECT_FALSE(map.servers(2).dead());
  // A worker defining its tensors now (one that rejoins) gets the map of
  // the grown cluster once its servers serve it, not a wait for num_servers.
  std::thread serve([&] {
    absl::SleepFor(absl::Milliseconds(50));
    HeartbeatRequest h;
    h.set_node_id(joined->node_id());
    h.set_applied_epoch(map.epoch());
    ASSERT_TRUE(state_->Heartbeat(h).ok());
    Beat({0, 1}, {}, map.epoch());
  });
  auto defined = state_->DefineTensors({Tensor("w", 1000)}, absl::Now() + absl::Seconds(5));
  serve.join();
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->servers_size(), 3);
  for (const PartitionInfo& p : map.partitions()) {
    EXPECT_EQ(p.server(), 0u) << "a primary moved before the joined server held a copy: " << p.ShortDebugString();
  }
  // Watched like the others: silent past the timeout, it is declared dead,
  // and another server takes its place rather than growing the cluster.
  server_ids_.push_back(joined->node_id());
  for (int t = 0; t < 12; ++t) {
    Beat({0, 1}, {0, 1, 2}, map.epoch());
    now_ += absl::Milliseconds(100);
    state_->CheckLiveness();
  }
  map = state_->Status().shard_map();
  ASSERT_TRUE(map.servers(2).dead()) << map.ShortDebugString();
  auto replacement = state_->RegisterServer(Node(SERVER, 0, "tcp://v:1"));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ(replacement->server_index(), 2u);
  EXPECT_EQ(state_->Status().shard_map().servers_size(), 3);
}

TEST_F(LivenessTest, AWorkerDefiningTheTensorsAfterTheClusterGrewIsNotKeptWaiting) {
  // A worker that rejoins (or a restarted one) defines the tensors again
  // once a server joined as one more: 3 servers registered of num_servers
  // 2 is a cluster that has them all, not one still waiting for some.
  auto joined = state_->RegisterServer(Node(SERVER, 0, "tcp://u:1"));
  ASSERT_TRUE(joined.ok()) << joined.status();
  server_ids_.push_back(joined->node_id());
  const uint64_t epoch = state_->Status().shard_map().epoch();
  Beat({0, 1, 2}, {0, 1, 2}, epoch);
  const absl::Time start = absl::Now();
  auto map = state_->DefineTensors({Tensor("w", 1000)}, absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "waited for a server count the cluster had passed";
  EXPECT_EQ(map->servers_size(), 3);
  EXPECT_EQ(map->epoch(), epoch);
}

TEST_F(LivenessTest, AServerThatCannotHoldItsShareOfTheCopiesIsRefusedBeforeItJoins) {
  // It joined, took copies it had no memory for and died (std::bad_alloc, or
  // killed by its container's limit) as they arrived.
  Beat({0, 1}, {0, 1, 2}, 1);
  const ShardMap before = state_->Status().shard_map();
  RegisterRequest small = Node(SERVER, 0, "tcp://u:1");
  // 1000 elements in 2 copies over 3 servers: a share of 667 elements.
  small.set_memory_bytes(600 * ServerBytesPerElement(config_));
  auto refused = state_->RegisterServer(small);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("reported it can hold"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), before.epoch()) << "the refused server changed the map";
  EXPECT_EQ(state_->Status().shard_map().servers_size(), 2);
  RegisterRequest enough = small;
  enough.set_memory_bytes(700 * ServerBytesPerElement(config_));
  auto joined = state_->RegisterServer(enough);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->server_index(), 2u);
}

TEST_F(LivenessTest, ServersJoinARunningJobUpToTheMostAClusterTakes) {
  for (uint32_t i = 2; i < kMaxServers; ++i) {
    auto r = state_->RegisterServer(Node(SERVER, 0, absl::StrCat("tcp://g:", i)));
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    ASSERT_EQ(r->server_index(), i);
  }
  auto over = state_->RegisterServer(Node(SERVER, 0, "tcp://g:9999"));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(over.status().message(), HasSubstr(absl::StrCat(kMaxServers, " servers, all alive, the most")));
}

// A server stopped while every worker is out of the job fails over unless
// the workers all left (the job is over): workers declared dead may be
// started again, and must find the stopped server's partitions on its
// backups rather than on a server listed dead.
TEST_F(LivenessTest, AServerStoppedWhileTheWorkersAreDeadNotLeftFailsOver) {
  // One at a time: the scheduler declares nodes dead only while it hears a
  // majority of the live ones.
  for (std::vector<int> beating : {std::vector<int>{0, 1}, {0}, {}}) {
    for (int t = 0; t < 12; ++t) {
      Beat({0, 1}, beating, 1);
      Advance(100);
    }
  }
  ASSERT_EQ(state_->Status().shard_map().excluded_workers_size(), 3) << "every worker declared dead";
  ASSERT_EQ(state_->Status().shard_map().left_workers_size(), 0);
  HeartbeatRequest leaving;
  leaving.set_node_id(server_ids_[0]);
  leaving.set_leaving(true);
  ASSERT_TRUE(state_->Heartbeat(leaving).ok());
  const ShardMap map = state_->Status().shard_map();
  EXPECT_TRUE(map.servers(0).dead());
  for (const PartitionInfo& p : map.partitions()) {
    EXPECT_EQ(p.server(), 1u) << "not failed over: " << p.ShortDebugString();
  }
}

TEST_F(LivenessTest, AWorkerThatLeavesOnAnErrorIsListedAsFailedWithItEvenAfterARestart) {
  HeartbeatRequest leaving;
  leaving.set_node_id(worker_ids_[1]);
  leaving.set_leaving(true);
  leaving.set_leaving_error("uncaught ValueError: loss is nan (train.py:42 in step)" + std::string(5000, '!'));
  WarningLines log;
  ASSERT_TRUE(state_->Heartbeat(leaving).ok());
  EXPECT_THAT(log.Joined(), HasSubstr("worker rank 1 (host h) failed and left the job: uncaught ValueError: loss "
                                      "is nan (train.py:42 in step)"));
  EXPECT_THAT(state_->Status().shard_map().excluded_workers(), ElementsAre(1)) << "the job goes on without it";
  auto error_of = [](const StatusResponse& status) {
    for (const NodeStatus& n : status.nodes()) {
      if (n.role() == WORKER && n.rank() == 1) return n.left_error();
    }
    return std::string("no worker 1");
  };
  const std::string error = error_of(state_->Status());
  EXPECT_EQ(error.size(), 4096u) << "kept to a bound";
  EXPECT_EQ(error.rfind("uncaught ValueError", 0), 0u) << error;
  auto restored = ClusterState::Restore(*saved_, [this] { return now_; });
  EXPECT_EQ(error_of(restored->Status()), error);
}

TEST_F(LivenessTest, AnErrorCutToItsBoundKeepsWholeCharactersSoTheSavedStateStillParses) {
  // The bound falls inside a two-byte character ("é"): cut there, the field
  // would not be UTF-8, and protobuf refuses to parse a proto3 string that
  // is not: the saved state would not load, nor `shardps status` read it.
  HeartbeatRequest leaving;
  leaving.set_node_id(worker_ids_[1]);
  leaving.set_leaving(true);
  leaving.set_leaving_error(std::string(4095, 'x') + "\xc3\xa9 and more");
  ASSERT_TRUE(state_->Heartbeat(leaving).ok());
  SchedulerState parsed;
  ASSERT_TRUE(parsed.ParseFromString(saved_->SerializeAsString())) << "the saved state does not parse";
  StatusResponse status;
  ASSERT_TRUE(status.ParseFromString(state_->Status().SerializeAsString())) << "the status does not parse";
  for (const NodeStatus& n : status.nodes()) {
    if (n.role() == WORKER && n.rank() == 1) {
      EXPECT_EQ(n.left_error(), std::string(4095, 'x'));
    }
  }
}

TEST_F(LivenessTest, AWorkerThatLeavesIsRemovedAtOnceAndListedAsLeftNotDead) {
  // Workers 0 and 1 wait at a barrier; worker 2's job ends and it says so.
  absl::Status passed[2] = {absl::UnknownError("not run"), absl::UnknownError("not run")};
  std::vector<std::thread> waiters;
  for (int r = 0; r < 2; ++r) {
    waiters.emplace_back([&, r] { passed[r] = state_->Barrier(worker_ids_[r], "done", absl::Now() + absl::Seconds(10)); });
  }
  HeartbeatRequest leaving;
  leaving.set_node_id(worker_ids_[2]);
  leaving.set_leaving(true);
  auto r = state_->Heartbeat(leaving);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch(), 2u);
  for (std::thread& t : waiters) t.join();
  EXPECT_TRUE(passed[0].ok()) << passed[0] << " (the barrier does not wait for a worker that left)";
  EXPECT_TRUE(passed[1].ok()) << passed[1];
  StatusResponse status = state_->Status();
  EXPECT_EQ(status.shard_map().epoch(), 2u);
  EXPECT_THAT(status.shard_map().excluded_workers(), ElementsAre(2));
  EXPECT_THAT(status.shard_map().left_workers(), ElementsAre(2));
  for (const NodeStatus& n : status.nodes()) {
    if (n.role() != WORKER) continue;
    EXPECT_EQ(n.left(), n.rank() == 2) << n.ShortDebugString();
    EXPECT_FALSE(n.declared_dead()) << n.ShortDebugString();
  }
  // Said twice (a retried call) changes nothing; an ordinary heartbeat after
  // it is refused, naming the leave.
  ASSERT_TRUE(state_->Heartbeat(leaving).ok());
  HeartbeatRequest late;
  late.set_node_id(worker_ids_[2]);
  EXPECT_THAT(state_->Heartbeat(late).status().message(), HasSubstr("worker rank 2 left the job"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 2u);
  // Its silence from now on is no death; another worker's still is.
  Beat({0, 1}, {0, 1}, 2);
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0}, 2);
  std::vector<std::string> lines = Advance(200);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("worker rank 1"));
  // A restarted scheduler knows it left; the rank may rejoin the job.
  auto restored = ClusterState::Restore(*saved_, [this] { return now_; });
  const StatusResponse after_restart = restored->Status();
  for (const NodeStatus& n : after_restart.nodes()) {
    if (n.role() == WORKER && n.rank() == 2) {
      EXPECT_TRUE(n.left()) << n.ShortDebugString();
    }
  }
  ReportRounds(50);
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_THAT(state_->Status().shard_map().left_workers(), IsEmpty());
  EXPECT_THAT(state_->Status().shard_map().excluded_workers(), ElementsAre(1));
}

TEST_F(LivenessTest, APassedBarrierIsWrittenWhenItPassesNotWithTheNextHeartbeat) {
  // Found with real processes (shardps local --kill scheduler@20
  // --restart-after 1 --kill worker:1@22 --replace): the scheduler was
  // killed before any call wrote the state the "init" barrier's pass
  // changed; the restarted one told the rejoining rank that no barrier had
  // passed, and it waited at "init" for a rank that had passed it long ago.
  ASSERT_TRUE(saved_.has_value());
  std::vector<std::thread> others;
  for (int r : {1, 2}) {
    others.emplace_back([this, r] { EXPECT_TRUE(state_->Barrier(worker_ids_[r], "init", absl::Now() + absl::Seconds(5)).ok()); });
  }
  EXPECT_TRUE(state_->Barrier(worker_ids_[0], "init", absl::Now() + absl::Seconds(5)).ok());
  for (std::thread& t : others) t.join();
  ASSERT_EQ(saved_->barriers_size(), 1) << "written by the barrier's last arrival";
  EXPECT_EQ(saved_->barriers(0).name(), "init");
}

TEST_F(LivenessTest, ARemovedWorkerRejoinsAtARoundPastEveryServersPaceInANewEpoch) {
  // Worker 2 dies; the other two pass the barrier of epoch 1 without it.
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(1));
  std::thread other([this] { EXPECT_TRUE(state_->Barrier(worker_ids_[0], "epoch 1", absl::Now() + absl::Seconds(5)).ok()); });
  ASSERT_TRUE(state_->Barrier(worker_ids_[1], "epoch 1", absl::Now() + absl::Seconds(5)).ok());
  other.join();
  ReportRounds(50);  // 50 rounds a second, up to round 50
  // Then rounds stalled (waiting for the dead worker) and resumed: the
  // last two reports say 5 rounds a second, an understatement.
  now_ += absl::Seconds(2);
  Report(0, 60);
  Report(1, 58);
  const uint64_t epoch = state_->Status().shard_map().epoch();

  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  // Two heartbeat intervals (1 s each) at the peak 50 rounds a second past
  // round 60, and one more: no server has completed it yet.
  EXPECT_EQ(rejoined->rejoin_round(), 60u + 100u + 1u);
  EXPECT_GT(rejoined->node_id(), worker_ids_[2]);
  ASSERT_EQ(rejoined->passed_barriers_size(), 1);
  EXPECT_EQ(rejoined->passed_barriers(0).name(), "epoch 1");
  EXPECT_THAT(rejoined->passed_barriers(0).live_ranks(), ElementsAre(0u, 1u));
  const ShardMap map = state_->Status().shard_map();
  EXPECT_EQ(map.epoch(), epoch + 1);
  EXPECT_THAT(map.excluded_workers(), IsEmpty());
  ASSERT_EQ(map.rejoined_workers_size(), 1);
  EXPECT_EQ(map.rejoined_workers(0).rank(), 2u);
  EXPECT_EQ(map.rejoined_workers(0).round(), rejoined->rejoin_round());
  EXPECT_EQ(map.rejoined_workers(0).incarnation(), rejoined->node_id());
  ASSERT_TRUE(saved_.has_value());
  EXPECT_EQ(saved_->shard_map().rejoined_workers_size(), 1) << "persisted for a restarted scheduler";
  // The rank is held again: a second process for it is refused.
  EXPECT_EQ(state_->RegisterWorker(Node(WORKER, 2)).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(LivenessTest, ARankRejoiningBeforeAnyServerReportedARoundWaitsForOneInsteadOfJoiningAtRoundOne) {
  // Found with real processes (a rank SIGTERMed and started again at once,
  // 100 steps into a job with 1 s heartbeats): no server had reported a
  // round yet, the rank was placed at round 1, and every partition refused
  // its pushes ("had completed 148 rounds without it").
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(1));
  absl::StatusOr<RegisterResponse> rejoined;
  std::thread rejoin([&] { rejoined = Rejoin(*state_, 2); });
  AwaitRejoinCalls(*state_, 2);
  ReportRounds(50);
  rejoin.join();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_GT(rejoined->rejoin_round(), 50u) << "placed before the rounds the servers report";
}

TEST_F(LivenessTest, ARankRejoiningWhereNoOtherWorkerTrainsJoinsAtTheServersRound) {
  // Found with real processes: a one-worker job SIGTERMed and started again,
  // or both workers of a job restarted at once, rejoined a pace past the
  // servers' rounds (904 of 937), which nobody else would complete: the
  // first pull waited for them until the request timeout and the job failed.
  absl::StatusOr<RegisterResponse> first = RejoinAloneAfterEveryWorkerLeft([](size_t, HeartbeatRequest& h) {
    h.set_completed_round(52);  // the last rounds the workers completed before they left
  });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->rejoin_round(), 52u) << "the open round: 52 completed";
  // Rank 0 has trained past round 52: the next rank is placed past the pace.
  Report(0, 60);
  Report(1, 59);
  auto second = Rejoin(*state_, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->rejoin_round(), 60u + 50u);
}

TEST_F(LivenessTest, RanksRestartedTogetherAfterEveryWorkerLeftAllJoinAtTheServersRound) {
  // Found by chaos15 with real processes: both workers of a job killed and
  // started again together; the second to register counted the first,
  // placed at the open round moments before, as a worker training there and
  // was placed a pace past the servers: it idled while the first trained
  // alone, and near the job's end (round 643 of 500) exited 1, "nothing to
  // train".
  absl::StatusOr<RegisterResponse> first = RejoinAloneAfterEveryWorkerLeft([](size_t, HeartbeatRequest& h) {
    h.set_completed_round(52);
  });
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->rejoin_round(), 52u);
  absl::StatusOr<RegisterResponse> second;
  std::thread rejoin([&] { second = Rejoin(*state_, 1); });
  AwaitRejoinCalls(*state_, 1);
  now_ += absl::Milliseconds(100);
  const uint64_t epoch = state_->Status().shard_map().epoch();  // the one that rejoined rank 0
  for (size_t i = 0; i < server_ids_.size(); ++i) {
    HeartbeatRequest h;  // rank 0 trained a few rounds while rank 1 waited for these
    h.set_node_id(server_ids_[i]);
    h.set_applied_epoch(epoch);
    h.set_completed_round(57);
    h.set_fewest_completed_round(i == 0 ? 56 : 57);
    EXPECT_TRUE(state_->Heartbeat(h).ok());
  }
  rejoin.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->rejoin_round(), 56u) << "the fewest rounds a partition completed, not a pace past them";
  const ShardMap map = state_->Status().shard_map();
  ASSERT_EQ(map.rejoined_workers_size(), 2);
  EXPECT_TRUE(map.rejoined_workers(1).catch_up()) << "partitions past 56 take its pushes of their rounds for retries";
}

TEST_F(LivenessTest, ARankRejoiningAloneJoinsAtTheFewestRoundsAPartitionCompletedAndCatchesUpElsewhere) {
  // Every worker removed mid-step: partitions whose round held a push
  // completed it on the removal, the others did not (review12 confirmed it
  // with the engine). A rank joining at the most rounds reported (53) would
  // wait forever on a partition at 52: nobody is counted in its open round.
  absl::StatusOr<RegisterResponse> first = RejoinAloneAfterEveryWorkerLeft([](size_t i, HeartbeatRequest& h) {
    h.set_completed_round(53);
    h.set_fewest_completed_round(i == 0 ? 52 : 53);
  });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->rejoin_round(), 52u) << "the fewest: server 0 has a partition at 52";
  const ShardMap map = state_->Status().shard_map();
  ASSERT_EQ(map.rejoined_workers_size(), 1);
  EXPECT_TRUE(map.rejoined_workers(0).catch_up()) << "partitions at 53 take its push of 52 for a retry";
}

TEST_F(LivenessTest, ANewProcessForASilentRankWaitsUntilTheOldOneIsDeclaredDeadThenRejoins) {
  // Found under load (python_test_torch_rejoin): the new process registered
  // after worker 2 was silent past the timeout but before the liveness check
  // declared it dead, took the rank as at the start (rejoin round 0), and
  // waited on a barrier the job had passed.
  ASSERT_TRUE(state_->WaitForCluster(absl::Now(), worker_ids_[2]).ok());  // past its rendezvous
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  now_ += absl::Milliseconds(150);  // worker 2 1.05 s silent: past the timeout, no check since
  auto early = state_->RegisterWorker(Node(WORKER, 2));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kAlreadyExists) << early.status();
  EXPECT_TRUE(IsRankStillHeldRefusal(early.status().message())) << early.status();
  ASSERT_THAT(state_->CheckLiveness(), ElementsAre(HasSubstr("worker rank 2")));
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_GT(rejoined->rejoin_round(), 0u) << "registered as at the start of the job";
}

TEST_F(LivenessTest, ARankThatDiesAgainAfterRejoiningIsCountedAgain) {
  EXPECT_EQ(state_->NodesDeclaredDead(), 0u);
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);  // worker 2 stays silent
  ASSERT_THAT(Advance(200), SizeIs(1));
  EXPECT_EQ(state_->NodesDeclaredDead(), 1u);
  ReportRounds(50);
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  worker_ids_[2] = rejoined->node_id();
  // No node is dead now, and the death still counts.
  const StatusResponse rejoined_status = state_->Status();
  for (const NodeStatus& n : rejoined_status.nodes()) EXPECT_FALSE(n.declared_dead()) << n.ShortDebugString();
  EXPECT_EQ(state_->NodesDeclaredDead(), 1u);
  // The rejoined process goes silent as well. (ReportRounds moved the clock
  // a second with no check: the next check forgives that pause first.)
  EXPECT_THAT(state_->CheckLiveness(), IsEmpty());
  const uint64_t epoch = state_->Status().shard_map().epoch();
  Beat({0, 1}, {0, 1, 2}, epoch);
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, epoch);
  std::vector<std::string> lines = Advance(200);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("worker rank 2"));
  EXPECT_EQ(state_->NodesDeclaredDead(), 2u);
}

// The same cluster with heartbeats every 200 ms (five to the timeout).
class FastHeartbeatTest : public LivenessTest {
 protected:
  void SetUp() override {
    config_.set_heartbeat_interval_ms(200);
    LivenessTest::SetUp();
  }

  // One second of heartbeats: server 0 reports rounds 10, 20, ... 50,
  // server 1 two behind; every node is heard.
  void ReportFiftyRoundsASecondUpToRoundFifty() {
    for (int k = 1; k <= 5; ++k) {
      now_ += absl::Milliseconds(200);
      Report(0, 10 * k);
      Report(1, 10 * k - 2);
      Beat({}, {0, 1, 2}, 1);
      ASSERT_THAT(state_->CheckLiveness(), IsEmpty());
    }
  }
};

TEST_F(FastHeartbeatTest, ARankRejoiningBeforeAKilledServerIsDeclaredDeadIsNotSentPastTheJob) {
  // Found with real processes (shardps local --kill worker:1@80 --kill
  // server:0@80 --replace): the worker was declared dead first, and its new
  // process registered while the killed server, silent for most of a
  // timeout, was not declared yet. That server's old report, at the peak
  // pace, put the rejoin round about 300 rounds past the others', after the
  // job's last round: the rank had nothing to train. Its age says nothing of
  // the live servers' rounds; the rejoin waits until it is heard or declared
  // dead.
  ASSERT_NO_FATAL_FAILURE(ReportFiftyRoundsASecondUpToRoundFifty());
  // Worker 2 dies now, server 1 200 ms later; rounds stall at 50.
  auto tick = [this](int k) {
    now_ += absl::Milliseconds(100);
    Report(0, 50);
    if (k <= 2) Report(1, 48);
    Beat({}, {0, 1}, 1);
    return state_->CheckLiveness();
  };
  for (int k = 1; k <= 10; ++k) ASSERT_THAT(tick(k), IsEmpty()) << k;
  ASSERT_THAT(tick(11), ElementsAre(HasSubstr("worker rank 2")));  // server 1 silent for 0.9 s
  absl::StatusOr<RegisterResponse> rejoined;
  std::thread rejoin([&] { rejoined = Rejoin(*state_, 2); });
  AwaitRejoinCalls(*state_, 2);
  EXPECT_THAT(tick(12), IsEmpty());
  EXPECT_THAT(tick(13), ElementsAre(HasSubstr("server 1")));
  rejoin.join();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  // Two heartbeat intervals at 50 rounds a second past server 0's fresh
  // report of round 50, and one more (not 50 + 65 + 1: server 1's 0.9 s).
  EXPECT_EQ(rejoined->rejoin_round(), 50u + 20u + 1u);
}

TEST_F(FastHeartbeatTest, NeitherAHeartbeatSentEarlyNorAJoinedServersFirstRoundCountsAsPaceForARejoin) {
  // Found with real processes (ssp in rounds, shardps local --kill
  // worker:1@80 --kill server:0@80 --replace): the peak rate that places a
  // rejoin round came from a server that joined in a dead one's place and
  // reported the job's round 29 ms after its round 0 (3461 rounds a second
  // where the job did 60), or from a heartbeat sent early, milliseconds after
  // the last, one round later (106). The round fell past the job's last.
  ASSERT_NO_FATAL_FAILURE(ReportFiftyRoundsASecondUpToRoundFifty());
  now_ += absl::Milliseconds(10);
  Report(0, 52);  // sent early (say a hand-off drained): 2 rounds in 10 ms
  // Server 1 and worker 2 die; rounds stall at 52.
  std::vector<std::string> declared;
  for (int k = 0; k < 12; ++k) {
    now_ += absl::Milliseconds(100);
    Report(0, 52);
    Beat({}, {0, 1}, 1);
    for (std::string& line : state_->CheckLiveness()) declared.push_back(line);
  }
  ASSERT_THAT(declared, ElementsAre(HasSubstr("server 1"), HasSubstr("worker rank 2")));
  auto joined = state_->RegisterServer(Node(SERVER, 0, "tcp://s:3"));
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(joined->joins_running_job());
  server_ids_.push_back(joined->node_id());
  for (int k = 0; k < 3; ++k) {  // not a primary yet: round 0
    now_ += absl::Milliseconds(100);
    Report(0, 52);
    Report(2, 0);
    Beat({}, {0, 1}, 1);
    ASSERT_THAT(state_->CheckLiveness(), IsEmpty());
  }
  now_ += absl::Milliseconds(150);
  Report(0, 52);
  Report(2, 52);  // a primary now (a hand-off): the job's round, not 347 a second
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  // Two intervals at 50 rounds a second past round 52, and one more.
  EXPECT_EQ(rejoined->rejoin_round(), 52u + 20u + 1u);
}

// A 1-server, 2-worker cluster on `config` whose worker 1 is declared dead,
// once the tensors are defined where `defined`; returns worker 1's second
// registration and, in `map`, the shard map after it.
absl::StatusOr<RegisterResponse> RegisterAgainAfterRemoval(ClusterConfig config, bool defined = true,
                                                           ShardMap* map = nullptr) {
  absl::Time now = absl::FromUnixSeconds(1000);
  config.set_num_servers(1);
  config.set_num_workers(2);
  config.set_heartbeat_timeout_ms(1000);
  ClusterState state(config, [&now] { return now; });
  std::vector<uint64_t> ids = {state.RegisterServer(Node(SERVER, 0, "tcp://s:1"))->node_id(),
                               state.RegisterWorker(Node(WORKER, 0))->node_id(),
                               state.RegisterWorker(Node(WORKER, 1))->node_id()};
  uint64_t rounds = 0;
  auto beat = [&](int i) {
    HeartbeatRequest h;
    h.set_node_id(ids[i]);
    h.set_applied_epoch(state.Status().shard_map().epoch());
    // Rounds and their pace reported: the rejoin waits for neither.
    if (i == 0 && defined) h.set_completed_round(++rounds);
    return state.Heartbeat(h).ok();
  };
  if (defined) {
    std::thread serve([&] {
      absl::SleepFor(absl::Milliseconds(50));
      beat(0);  // serving epoch 1: the definition waits for it
    });
    const bool ok = state.DefineTensors({Tensor("w", 10)}, absl::Now() + absl::Seconds(5)).ok();
    serve.join();
    if (!ok) return absl::InternalError("tensors not defined");
  }
  state.CheckLiveness();
  for (int t = 0; t < 12; ++t) {
    now += absl::Milliseconds(100);
    for (int i : {0, 1}) {
      if (!beat(i)) return absl::InternalError("heartbeat refused");
    }
    state.CheckLiveness();
  }
  if (state.Status().shard_map().excluded_workers_size() != 1) return absl::InternalError("worker 1 not removed");
  auto again = state.RegisterWorker(Node(WORKER, 1));
  if (map != nullptr) *map = state.Status().shard_map();
  return again;
}

TEST(WorkerRejoinTest, ARankRemovedBeforeTheTensorsWereDefinedIsTakenBackAsAtTheStart) {
  // Before 2026-11-25 it was refused for good ("a rank can rejoin only a job
  // that is training"): a job whose every worker died before DefineTensors
  // could never go on. Nothing has trained yet, so its new process simply
  // takes its place.
  ShardMap map;
  auto again = RegisterAgainAfterRemoval(ClusterConfig(), /*defined=*/false, &map);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rejoin_round(), 0u);
  EXPECT_THAT(map.excluded_workers(), IsEmpty());
  EXPECT_THAT(map.rejoined_workers(), IsEmpty());
}

TEST(WorkerRejoinTest, ANewProcessForARankStillHeardBeforeTheTensorsAreDefinedIsToldToAskAgain) {
  // Before 2026-11-25 only a training job's refusal said so: a process
  // started again for a rank killed before DefineTensors gave up at once.
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(1);
  ClusterState state(config, [] { return absl::FromUnixSeconds(1000); });
  ASSERT_TRUE(state.RegisterServer(Node(SERVER, 0, "tcp://s:1")).ok());
  auto first = state.RegisterWorker(Node(WORKER, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(state.WaitForCluster(absl::Now() + absl::Seconds(1), first->node_id()).ok());
  HeartbeatRequest h;
  h.set_node_id(first->node_id());
  ASSERT_TRUE(state.Heartbeat(h).ok());
  auto again = state.RegisterWorker(Node(WORKER, 0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(IsRankStillHeldRefusal(again.status().message())) << again.status();
}

TEST(WorkerRejoinTest, ARankIsRefusedWhereTheWorkersHoldTheWeights) {
  ClusterConfig sum_only;
  sum_only.set_update_mode(SUM_ONLY);
  EXPECT_THAT(RegisterAgainAfterRemoval(sum_only).status().message(), HasSubstr("update_mode sum_only"));
  ClusterConfig deltas;
  deltas.mutable_compression()->set_pull_codec("fp16");
  EXPECT_THAT(RegisterAgainAfterRemoval(deltas).status().message(), HasSubstr("weight deltas"));
}

// A heartbeat from each node ids[i], i in `which`, serving shard map `epoch`.
void BeatNodes(ClusterState& state, const std::vector<uint64_t>& ids, const std::vector<size_t>& which,
               uint64_t epoch) {
  for (size_t i : which) {
    HeartbeatRequest h;
    h.set_node_id(ids[i]);
    h.set_applied_epoch(epoch);
    ASSERT_TRUE(state.Heartbeat(h).ok());
  }
}

TEST(ReplacementServerTest, CannotTakeOverStateThatDiedWithoutAReplica) {
  absl::Time now = absl::FromUnixSeconds(1000);
  ClusterConfig config;
  config.set_num_servers(2);
  config.set_num_workers(1);
  config.set_replication(1);
  config.set_heartbeat_timeout_ms(1000);
  ClusterState state(config, [&now] { return now; });
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) ids.push_back(state.RegisterServer(Node(SERVER, 0, "tcp://s:" + std::to_string(i + 1)))->node_id());
  ids.push_back(state.RegisterWorker(Node(WORKER, 0))->node_id());
  auto beat = [&](std::vector<size_t> which, uint64_t epoch) { BeatNodes(state, ids, which, epoch); };
  beat({0, 1, 2}, 0);
  std::thread serve([&] {
    absl::SleepFor(absl::Milliseconds(50));
    beat({0, 1}, 1);
  });
  auto defined = state.DefineTensors({Tensor("w", 1000), Tensor("v", 1000)}, absl::Now() + absl::Seconds(5));
  serve.join();
  ASSERT_TRUE(defined.ok()) << defined.status();
  ASSERT_THAT(state.CheckLiveness(), IsEmpty());
  for (int t = 0; t < 12; ++t) {
    now += absl::Milliseconds(100);
    beat({0, 2}, 1);
    state.CheckLiveness();
  }
  ASSERT_TRUE(state.Status().shard_map().servers(1).dead());
  auto replacement = state.RegisterServer(Node(SERVER, 0, "tcp://s:2"));
  EXPECT_EQ(replacement.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(replacement.status().message(), HasSubstr("state died with it"));
  EXPECT_THAT(replacement.status().message(), HasSubstr("replication 1"));
}

// Server 1 reported room for exactly what it holds. Server 2 dies: the
// copy of its partition that server 0 holds is promoted, and the new
// backup's only candidate is server 1. It was given the copy whatever it
// could hold, and a server killed by its memory limit takes the last copies
// of its partitions with it. The partition keeps one copy instead.
TEST(RereplicateTest, ACopyIsNotRecreatedOnAServerThatReportedNoMemoryForIt) {
  absl::Time now = absl::FromUnixSeconds(1000);
  ClusterConfig config;
  config.set_num_servers(3);
  config.set_num_workers(1);
  config.set_heartbeat_timeout_ms(1000);
  config.set_partition_bytes(400 * sizeof(float));
  const uint64_t per_element = ServerBytesPerElement(config);
  const uint64_t room[] = {3000 * per_element, 800 * per_element, 3000 * per_element};
  ClusterState state(config, [&now] { return now; });
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    RegisterRequest server = Node(SERVER, 0, "tcp://m:" + std::to_string(i + 1));
    server.set_memory_bytes(room[i]);
    ids.push_back(state.RegisterServer(server)->node_id());
  }
  ids.push_back(state.RegisterWorker(Node(WORKER, 0))->node_id());
  auto beat = [&](std::vector<size_t> which, uint64_t epoch) { BeatNodes(state, ids, which, epoch); };
  beat({0, 1, 2, 3}, 0);
  std::thread serve([&] {
    absl::SleepFor(absl::Milliseconds(50));
    beat({0, 1, 2}, 1);
  });
  auto defined = state.DefineTensors({Tensor("w", 1200)}, absl::Now() + absl::Seconds(5));
  serve.join();
  ASSERT_TRUE(defined.ok()) << defined.status();
  auto held = [&](const ShardMap& map) {
    std::map<uint32_t, uint64_t> elements;
    for (const PartitionInfo& p : map.partitions()) {
      elements[p.server()] += p.num_elements();
      for (uint32_t b : p.backups()) elements[b] += p.num_elements();
    }
    return elements;
  };
  // The layout the test is built on (a placement that changes it needs
  // other memories here).
  ASSERT_EQ(defined->partitions_size(), 3) << defined->ShortDebugString();
  const PartitionInfo& on_two = defined->partitions(2);
  ASSERT_TRUE(on_two.server() == 2 && on_two.backups_size() == 1 && on_two.backups(0) == 0)
      << defined->ShortDebugString();
  ASSERT_EQ(held(*defined)[1], 800u) << defined->ShortDebugString();
  ASSERT_THAT(state.CheckLiveness(), IsEmpty());

  for (int t = 0; t < 12; ++t) {  // server 2 falls silent
    now += absl::Milliseconds(100);
    beat({0, 1, 3}, 1);
    state.CheckLiveness();
  }
  const ShardMap map = state.Status().shard_map();
  ASSERT_TRUE(map.servers(2).dead()) << map.ShortDebugString();
  EXPECT_EQ(map.partitions(2).server(), 0u) << map.ShortDebugString();
  EXPECT_EQ(map.partitions(2).backups_size(), 0) << "server 1 was given a copy it reported it cannot hold: "
                                                 << map.ShortDebugString();
  for (const auto& [server, elements] : held(map)) EXPECT_LE(elements * per_element, room[server]) << server;
}

// Replication 3, three servers and one worker: server 0's partitions each
// have two backups.
class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(3);
    config.set_num_workers(1);
    config.set_replication(3);
    config.set_heartbeat_timeout_ms(1000);
    state_ = std::make_unique<ClusterState>(config, [this] { return now_; },
                                            [this](const SchedulerState& s) {
                                              saved_ = s;
                                              return absl::OkStatus();
                                            });
    for (int i = 0; i < 3; ++i) {
      ids_.push_back(state_->RegisterServer(Node(SERVER, 0, "tcp://s:" + std::to_string(i + 1)))->node_id());
    }
    ids_.push_back(state_->RegisterWorker(Node(WORKER, 0))->node_id());
    auto defined = DefineThreeTensors(*state_, [this](uint64_t epoch) { Beat({0, 1, 2}, epoch); });
    ASSERT_TRUE(defined.ok()) << defined.status();
    ASSERT_THAT(state_->CheckLiveness(), IsEmpty());
    const ShardMap map = state_->Status().shard_map();
    for (const PartitionInfo& p : map.partitions()) {
      ASSERT_EQ(p.backups_size(), 2);
      if (p.server() == 0) second_backup_[p.id()] = p.backups(1);
    }
    ASSERT_FALSE(second_backup_.empty());
  }

  // Servers `servers` report every copy they hold synced, at `epoch`, but
  // the copies of server 0's partitions on their first backup; the worker
  // heartbeats.
  void Beat(std::vector<uint32_t> servers, uint64_t epoch) {
    const ShardMap map = state_->Status().shard_map();
    for (uint32_t i : servers) {
      HeartbeatRequest h;
      h.set_node_id(ids_[i]);
      h.set_applied_epoch(epoch);
      for (const PartitionInfo& p : map.partitions()) {
        const bool first_backup_of_zero = p.server() == 0 && p.backups(0) == i;
        if (!first_backup_of_zero) h.add_synced_copies(p.id());
      }
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
    HeartbeatRequest w;
    w.set_node_id(ids_[3]);
    ASSERT_TRUE(state_->Heartbeat(w).ok());
  }

  // Server 0 falls silent while the others report at `epoch`: its failover's
  // log line.
  std::string KillServerZero(uint64_t epoch) {
    std::vector<std::string> lines;
    for (int t = 0; t < 12; ++t) {
      now_ += absl::Milliseconds(100);
      Beat({1, 2}, epoch);
      for (std::string& l : state_->CheckLiveness()) lines.push_back(std::move(l));
    }
    EXPECT_THAT(lines, SizeIs(1));
    return lines.empty() ? "" : lines[0];
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<ClusterState> state_;
  std::optional<SchedulerState> saved_;
  std::vector<uint64_t> ids_;
  std::map<uint64_t, uint32_t> second_backup_;  // partition of server 0 -> its second backup
};

// 3 servers, replication 2, 3 workers (so that two servers silent are a
// minority); tensors defined, every copy of the first map reported synced.
class TwoServersDieTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(3);
    config.set_num_workers(3);
    config.set_replication(2);
    config.set_heartbeat_timeout_ms(1000);
    state_ = std::make_unique<ClusterState>(config, [this] { return now_; });
    for (int i = 0; i < 3; ++i) {
      ids_.push_back(state_->RegisterServer(Node(SERVER, 0, "tcp://s:" + std::to_string(i + 1)))->node_id());
    }
    for (uint32_t r = 0; r < 3; ++r) ids_.push_back(state_->RegisterWorker(Node(WORKER, r))->node_id());
    auto defined = DefineThreeTensors(*state_, [this](uint64_t epoch) { Beat({0, 1, 2}, epoch); });
    ASSERT_TRUE(defined.ok()) << defined.status();
    first_ = *defined;
    ASSERT_THAT(state_->CheckLiveness(), IsEmpty());
  }

  // Servers `servers` report synced, at `epoch`, the copies the first map
  // gave them (none re-created since has its snapshot); the workers heartbeat.
  void Beat(std::vector<uint32_t> servers, uint64_t epoch) {
    for (uint32_t i : servers) {
      HeartbeatRequest h;
      h.set_node_id(ids_[i]);
      h.set_applied_epoch(epoch);
      for (const PartitionInfo& p : first_.partitions()) {
        if (HoldsCopy(p, i)) h.add_synced_copies(p.id());
      }
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
    for (size_t w = 3; w < ids_.size(); ++w) {
      HeartbeatRequest h;
      h.set_node_id(ids_[w]);
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
  }

  // Ticks of 100 ms to `ms`, server 2 and the workers reporting at each and
  // `also` until `also_until`; returns what CheckLiveness declared.
  std::vector<std::string> Run(int ms, std::vector<uint32_t> also = {}, int also_until = 0) {
    std::vector<std::string> lines;
    for (int t = 100; t <= ms; t += 100) {
      now_ += absl::Milliseconds(100);
      std::vector<uint32_t> beating = {2};
      if (t <= also_until) beating.insert(beating.end(), also.begin(), also.end());
      Beat(beating, state_->Status().shard_map().epoch());
      for (std::string& l : state_->CheckLiveness()) lines.push_back(std::move(l));
    }
    return lines;
  }

  // Every partition of the first map that had a copy on server 2 is served
  // by it; every other one is lost (left on a dead server); none is served
  // by a copy listed since.
  void ExpectOnlyTheCopiesOnServerTwoServe() {
    const ShardMap after = state_->Status().shard_map();
    ASSERT_EQ(after.partitions_size(), first_.partitions_size());
    for (int k = 0; k < after.partitions_size(); ++k) {
      const PartitionInfo& p = after.partitions(k);
      if (HoldsCopy(first_.partitions(k), 2)) {
        EXPECT_EQ(p.server(), 2u) << "partition " << p.id();
      } else {
        EXPECT_NE(p.server(), 2u) << "partition " << p.id() << " promoted to a copy re-created on server 2";
        EXPECT_THAT(p.backups(), IsEmpty()) << "partition " << p.id() << " is lost: no copy of it is left";
      }
    }
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<ClusterState> state_;
  std::vector<uint64_t> ids_;  // servers 0-2, then workers
  ShardMap first_;
};

TEST_F(TwoServersDieTest, TwoServersDeclaredInOneCheckLoseThePartitionsOnlyTheyHeldAndPromoteNoCopyListedMeanwhile) {
  // fix20, 2 of 3 servers SIGKILLed at once (shardps local --servers 3
  // --kill server:0@60 --kill server:1@60): server 0's failover promoted
  // server 1's copies, about to be declared dead in the same check, and
  // re-created their backups on server 2; server 1's failover then promoted
  // those, which no snapshot would ever reach: server 2 answered DATA_LOSS,
  // and the lines said "fail over to their backups".
  ASSERT_TRUE(absl::c_any_of(first_.partitions(), [](const PartitionInfo& p) { return !HoldsCopy(p, 2); }));
  Beat({0, 1, 2}, 1);  // their last heartbeats, every copy synced
  const std::vector<std::string> lines = Run(1200);
  ASSERT_THAT(lines, SizeIs(2));
  for (const std::string& line : lines) {
    EXPECT_THAT(line, Not(HasSubstr("not reported synced"))) << line;
    EXPECT_THAT(line, Not(HasSubstr("re-created"))) << line;
  }
  EXPECT_THAT(lines[0] + lines[1], HasSubstr("lost"));
  ExpectOnlyTheCopiesOnServerTwoServe();
}

TEST_F(TwoServersDieTest, AFailoversLineCountsOnePartitionInTheSingular) {
  // fix20: "1 partitions fail over to their backups"; then "1 partition fails over to their backups".
  ASSERT_EQ(absl::c_count_if(first_.partitions(), [](const PartitionInfo& p) { return p.server() == 0; }), 1);
  Beat({0, 1, 2}, 1);
  const std::vector<std::string> lines = Run(1200, {1}, 1200);  // server 0 dies alone
  ASSERT_THAT(lines, ElementsAre(HasSubstr("server 0")));
  EXPECT_THAT(lines[0], HasSubstr("; 1 partition fails over to its backup;"));
  EXPECT_THAT(lines[0], Not(HasSubstr(" partitions ")));
}

TEST_F(TwoServersDieTest, ACopyListedAfterTheDeadPrimarysLastReportIsNotPromotedItsPartitionIsLost) {
  // The same kills, the two declared in different checks (their last
  // heartbeats an interval apart): server 0's failover promoted server 1's
  // copies and re-created their backups on server 2, listed in a map that
  // server 1, dead, never served, so never sent their snapshots; server 1's
  // failover promoted them.
  const std::vector<std::string> lines = Run(2000, {1}, 500);
  ASSERT_THAT(lines, SizeIs(2));
  EXPECT_THAT(lines[0], HasSubstr("server 0"));
  EXPECT_THAT(lines[1], HasSubstr("server 1"));
  EXPECT_THAT(lines[1], Not(HasSubstr("not reported synced"))) << lines[1];
  EXPECT_THAT(lines[1], HasSubstr("lost"));
  ExpectOnlyTheCopiesOnServerTwoServe();
}

TEST(RestartedFailoverTest, CopiesGivenToAReplacementAfterARestartAreNotPromotedForAPrimaryNeverHeardSince) {
  // fix20, by hand (2 servers, replication 2, --state-dir): server 1 killed
  // and declared dead, then the scheduler and server 0 stopped; the
  // scheduler restarted on its state, a new server took server 1's place
  // and was given copies of every partition, whose snapshots were to come
  // from server 0, which never came back. Declared dead after its fresh
  // timeout, server 0's partitions failed over to those copies ("6 of them
  // to a copy its server had not reported synced"), which answered
  // DATA_LOSS.
  ClusterConfig config;
  config.set_num_servers(2);
  config.set_num_workers(1);
  config.set_replication(2);
  config.set_heartbeat_timeout_ms(1000);
  absl::Time now = absl::FromUnixSeconds(1000);
  std::optional<SchedulerState> saved;
  auto persist = [&saved](const SchedulerState& s) {
    saved = s;
    return absl::OkStatus();
  };
  ClusterState state(config, [&now] { return now; }, persist);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) ids.push_back(state.RegisterServer(Node(SERVER, 0, absl::StrCat("tcp://s:", i + 1)))->node_id());
  ids.push_back(state.RegisterWorker(Node(WORKER, 0))->node_id());
  auto beat = [&](ClusterState& s, const std::vector<uint64_t>& nodes, bool synced) {
    const ShardMap map = s.Status().shard_map();
    for (uint64_t id : nodes) {
      HeartbeatRequest h;
      h.set_node_id(id);
      h.set_applied_epoch(map.epoch());
      for (const PartitionInfo& p : map.partitions()) {
        if (synced) h.add_synced_copies(p.id());
      }
      ASSERT_TRUE(s.Heartbeat(h).ok());
    }
  };
  ASSERT_TRUE(DefineThreeTensors(state, [&](uint64_t) { beat(state, ids, true); }).ok());
  ASSERT_THAT(state.CheckLiveness(), IsEmpty());
  std::vector<std::string> lines;
  for (int t = 0; t < 12; ++t) {  // server 1 killed
    now += absl::Milliseconds(100);
    beat(state, {ids[0], ids[2]}, true);
    for (std::string& l : state.CheckLiveness()) lines.push_back(l);
  }
  ASSERT_THAT(lines, ElementsAre(HasSubstr("server 1")));
  ASSERT_TRUE(saved.has_value());

  std::unique_ptr<ClusterState> restarted = ClusterState::Restore(*saved, [&now] { return now; }, persist);
  auto replacement = restarted->RegisterServer(Node(SERVER, 0, "tcp://s:9"));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  lines.clear();
  for (int t = 0; t < 12; ++t) {  // server 0 never heard again; no snapshot reaches the replacement
    now += absl::Milliseconds(100);
    beat(*restarted, {replacement->node_id(), ids[2]}, false);
    for (std::string& l : restarted->CheckLiveness()) lines.push_back(l);
  }
  ASSERT_THAT(lines, ElementsAre(HasSubstr("server 0")));
  EXPECT_THAT(lines[0], Not(HasSubstr("not reported synced")));
  EXPECT_THAT(lines[0], HasSubstr("lost"));
  const ShardMap after = restarted->Status().shard_map();
  for (const PartitionInfo& p : after.partitions()) {
    EXPECT_EQ(p.server(), 0u) << "partition " << p.id() << " promoted to a copy no snapshot reached";
    EXPECT_THAT(p.backups(), IsEmpty());
  }
}

// Server 0 dies while the first backup of its partitions (listed first) is
// being re-created and reports its copy not synced.
TEST_F(FailoverTest, APartitionFailsOverToABackupItsServerReportedSyncedRatherThanTheFirst) {
  Beat({0, 1, 2}, 1);
  const std::string line = KillServerZero(1);
  EXPECT_THAT(line, HasSubstr("1 partition fails over to its backup"));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("not reported synced")));
  const ShardMap after = state_->Status().shard_map();
  for (const PartitionInfo& p : after.partitions()) {
    if (!second_backup_.contains(p.id())) continue;
    EXPECT_EQ(p.server(), second_backup_[p.id()]) << "partition " << p.id() << " failed over to a copy not synced";
  }
}

// The second backup's copy was given back at epoch 2 (it had been dropped):
// its server's reports at epoch 1 are of the copy it held before, not synced
// with its primary. The failover does not take them for the new copy's.
TEST_F(FailoverTest, AReportFromBeforeTheMapThatGaveACopyBackDoesNotCountItSynced) {
  ASSERT_TRUE(saved_.has_value());
  SchedulerState state = *saved_;
  state.mutable_shard_map()->set_epoch(2);
  for (PartitionInfo& p : *state.mutable_shard_map()->mutable_partitions()) {
    if (p.server() == 0) (*p.mutable_listed_at())[p.backups(1)] = 2;
  }
  state_ = ClusterState::Restore(state, [this] { return now_; });
  Beat({0, 1, 2}, 1);
  EXPECT_THAT(KillServerZero(1), HasSubstr("not reported synced"));
  const ShardMap after = state_->Status().shard_map();
  for (const PartitionInfo& p : after.partitions()) {
    if (!second_backup_.contains(p.id())) continue;
    EXPECT_NE(p.server(), second_backup_[p.id()]) << "partition " << p.id() << " failed over to a stale copy";
  }
}

// The only worker removed mid-step left server 0's partitions at 52 rounds
// and the others' at 53; its rank asks to rejoin, and server 0 dies before
// it reported since. The reports the others sent before they applied the
// failover count none of the partitions they took over (at 52): placed at
// 53, the rank was counted in no open round of those, and the job hung.
TEST_F(FailoverTest, ARankRejoiningAloneWhileAServerFailsOverJoinsAtTheFewestRoundsOfTheCopiesPromoted) {
  auto report = [&](uint32_t server, uint64_t epoch, uint64_t fewest) {
    HeartbeatRequest h;
    h.set_node_id(ids_[server]);
    h.set_applied_epoch(epoch);
    h.set_completed_round(53);
    h.set_fewest_completed_round(fewest);
    ASSERT_TRUE(state_->Heartbeat(h).ok());
  };
  std::vector<std::string> declared;
  for (int t = 0; t < 12; ++t) {  // the worker falls silent and is removed
    now_ += absl::Milliseconds(100);
    const uint64_t epoch = state_->Status().shard_map().epoch();
    for (uint32_t s : {0u, 1u, 2u}) report(s, epoch, s == 0 ? 52 : 53);
    for (std::string& l : state_->CheckLiveness()) declared.push_back(std::move(l));
  }
  ASSERT_THAT(declared, SizeIs(1));
  absl::StatusOr<RegisterResponse> rejoined;
  std::thread rejoin([&] { rejoined = Rejoin(*state_, 0); });
  AwaitRejoinCalls(*state_, 0);
  const uint64_t removal = state_->Status().shard_map().epoch();
  for (int t = 0; t < 12; ++t) {  // server 0 falls silent and fails over
    now_ += absl::Milliseconds(100);
    for (uint32_t s : {1u, 2u}) report(s, removal, 53);
    for (std::string& l : state_->CheckLiveness()) declared.push_back(std::move(l));
  }
  ASSERT_THAT(declared, SizeIs(2));
  absl::SleepFor(absl::Milliseconds(100));
  const uint64_t failover = state_->Status().shard_map().epoch();
  ASSERT_GT(failover, removal);
  for (uint32_t s : {1u, 2u}) report(s, failover, 52);  // they promoted server 0's copies
  rejoin.join();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rejoin_round(), 52u) << "the partitions server 0 was primary for completed 52";
}

TEST_F(LivenessTest, ARestartedSchedulerStillTellsARejoiningWorkerWhichBarriersPassed) {
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(1));  // worker 2 is removed
  std::thread other([this] { EXPECT_TRUE(state_->Barrier(worker_ids_[0], "epoch 1", absl::Now() + absl::Seconds(5)).ok()); });
  ASSERT_TRUE(state_->Barrier(worker_ids_[1], "epoch 1", absl::Now() + absl::Seconds(5)).ok());
  other.join();
  Beat({0, 1}, {0, 1}, 1);  // a heartbeat writes what changed
  ASSERT_TRUE(saved_.has_value());
  state_ = ClusterState::Restore(*saved_, [this] { return now_; });
  ReportRounds(50);
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  ASSERT_EQ(rejoined->passed_barriers_size(), 1);
  EXPECT_EQ(rejoined->passed_barriers(0).name(), "epoch 1");
  EXPECT_THAT(rejoined->passed_barriers(0).live_ranks(), ElementsAre(0u, 1u));
}

TEST_F(LivenessTest, AWorkerAskingAgainForABarrierThatPassedBeforeARestartIsAnsweredAtOnce) {
  // Found by chaos15 (schedulers on etcd): the active scheduler was killed
  // as barrier 'epoch 1' passed, having answered rank 1 but not rank 0,
  // which asked the scheduler that took over: it waited for a pass rank 1
  // (already training the next epoch) would never join, and both ranks
  // failed at the deadline.
  std::vector<std::thread> others;
  for (int r : {1, 2}) {
    others.emplace_back([this, r] { EXPECT_TRUE(state_->Barrier(worker_ids_[r], "epoch 1", absl::Now() + absl::Seconds(5)).ok()); });
  }
  ASSERT_TRUE(state_->Barrier(worker_ids_[0], "epoch 1", absl::Now() + absl::Seconds(5)).ok());
  for (std::thread& t : others) t.join();
  ASSERT_TRUE(saved_.has_value());
  state_ = ClusterState::Restore(*saved_, [this] { return now_; });
  std::vector<uint32_t> live;
  absl::Status asked = state_->Barrier(worker_ids_[0], "epoch 1", absl::Now() + absl::Milliseconds(300), &live,
                                       /*passes_seen=*/0);
  EXPECT_TRUE(asked.ok()) << asked;
  EXPECT_THAT(live, ElementsAre(0u, 1u, 2u));
  absl::Status next = state_->Barrier(worker_ids_[0], "epoch 1", absl::Now() + absl::Milliseconds(200), nullptr,
                                      /*passes_seen=*/1);
  EXPECT_EQ(next.code(), absl::StatusCode::kDeadlineExceeded) << "its next pass of the name waits for the others";
}

TEST_F(LivenessTest, NoWorkerIsAnsweredBeforeABarriersPassIsWritten) {
  // With the write of a pass slow (an etcd member stopped), the ranks that
  // had waited were answered at once, the last one after the write: a
  // scheduler killed in between forgot a pass some ranks had gone past.
  absl::Notification release;
  std::atomic<bool> writing{false};
  on_write_ = [&](const SchedulerState& s) {
    for (const SchedulerState::Barrier& b : s.barriers()) {
      if (b.name() == "x" && b.generation() > 0 && !release.HasBeenNotified()) {
        writing = true;
        release.WaitForNotification();
      }
    }
  };
  std::atomic<int> answered{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      EXPECT_TRUE(state_->Barrier(worker_ids_[r], "x", absl::Now() + absl::Seconds(5)).ok());
      ++answered;
    });
  }
  for (int i = 0; i < 200 && !writing; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(writing);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(answered, 0) << "answered before the pass was written";
  release.Notify();
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(answered, 3);
}

TEST_F(LivenessTest, AWaitAtABarrierOfARanksOldProcessEndingDoesNotTakeItsNewProcessesArrivalAway) {
  // Found in review: a rank's process killed while it waited at a barrier
  // leaves its call waiting here until that call's deadline. The rank was
  // declared dead and rejoined, its new process entered the barrier, then
  // the old call's deadline took the rank's arrival away: the barrier
  // waited for a rank that was waiting at it, and every rank's call failed
  // at its deadline.
  for (uint64_t id : worker_ids_) ASSERT_TRUE(state_->WaitForCluster(absl::Now(), id).ok());  // past rendezvous
  ReportRounds(50);
  std::thread old_call([&] {
    EXPECT_FALSE(state_->Barrier(worker_ids_[2], "epoch", absl::Now() + absl::Milliseconds(600)).ok());
  });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_THAT(StallUntilWorkerTwoIsDeclaredDead(50, 48), ElementsAre(HasSubstr("worker rank 2")));
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  ASSERT_TRUE(state_->WaitForCluster(absl::Now(), rejoined->node_id()).ok());
  std::vector<std::thread> calls;
  for (uint64_t id : {rejoined->node_id(), worker_ids_[0]}) {
    calls.emplace_back([&, id] { EXPECT_TRUE(state_->Barrier(id, "epoch", absl::Now() + absl::Seconds(3)).ok()); });
  }
  old_call.join();  // its deadline passed while the new process waits
  EXPECT_TRUE(state_->Barrier(worker_ids_[1], "epoch", absl::Now() + absl::Seconds(3)).ok()) << "the last to arrive";
  for (std::thread& t : calls) t.join();
}

TEST_F(LivenessTest, ARestartedSchedulerPlacesARejoinRoundAtThePaceHeardBeforeItsRestart) {
  // Found with real processes (shardps local --kill scheduler@150 --kill
  // worker:2@300 --replace, with or without --secure): the worker died while
  // the scheduler was down, so every report the restarted one heard came
  // while rounds stalled for it. It knew no pace and placed the rejoin round
  // one past the reports; the two survivors completed it before the map
  // reached the servers, which refused the rank's pushes: it exited.
  ReportRounds(50);  // 50 rounds a second up to round 50
  ASSERT_TRUE(saved_.has_value());
  double saved_peak = 0;
  for (const SchedulerState::Node& n : saved_->nodes()) {
    if (n.role() == SERVER && n.rank() == 0) saved_peak = n.peak_round_rate();
  }
  EXPECT_DOUBLE_EQ(saved_peak, 50.0) << "the peak pace is written as soon as it rises";
  state_ = ClusterState::Restore(*saved_, [this] { return now_; });
  ASSERT_THAT(StallUntilWorkerTwoIsDeclaredDead(60, 58), ElementsAre(HasSubstr("worker rank 2")));
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  // Two heartbeat intervals at the peak heard before the restart past round
  // 60, and one more (61 without it).
  EXPECT_EQ(rejoined->rejoin_round(), 60u + 100u + 1u);
}

TEST_F(LivenessTest, ARestartedSchedulerThatKnowsNoPaceYetWaitsForTheSurvivorsPaceBeforePlacingARejoin) {
  // Found with real processes (shardps local --kill scheduler@20
  // --restart-after 1 --kill worker:1@22 --replace): the scheduler died in
  // the job's first intervals, before it measured a pace, and the worker
  // while it was down, so rounds stalled for every report it heard after
  // its restart. It placed the rank one past the reports (94); the survivor
  // had completed 101 when the map reached the servers, which refused the
  // rank's pushes: it exited 1.
  Report(0, 0);
  Report(1, 0);
  state_ = ClusterState::Restore(*saved_, [this] { return now_; });
  ASSERT_THAT(StallUntilWorkerTwoIsDeclaredDead(5, 5), ElementsAre(HasSubstr("worker rank 2")));
  absl::StatusOr<RegisterResponse> rejoined;
  std::thread rejoin([&] { rejoined = Rejoin(*state_, 2); });
  AwaitRejoinCalls(*state_, 2);
  now_ += absl::Milliseconds(500);  // the survivors resume at 100 rounds a second
  Report(0, 55);
  Report(1, 54);
  rejoin.join();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  // Placed by the pace measured since the removal resumed the rounds (100
  // rounds a second: two intervals past round 55, and one more), not by one
  // measured across the stall (119, which the survivors pass in 0.6 s), nor
  // one past the stalled reports (6 without the wait).
  EXPECT_GE(rejoined->rejoin_round(), 55u + 200u + 1u);
}

TEST_F(LivenessTest, ARestoredSchedulerWhoseStateLagsTheMapsItPublishedSkipsPastTheirEpochs) {
  // The state is written after the lock is released, so a scheduler killed
  // between publishing a map and writing it resumes an older epoch. The
  // nodes hold the newer maps and ignore any epoch not above theirs: the
  // restarted scheduler's next maps (a failover among them) must come after.
  ASSERT_TRUE(saved_.has_value());
  const SchedulerState lagging = *saved_;
  const uint64_t saved_epoch = lagging.shard_map().epoch();
  for (const char* address : {"tcp://u:1", "tcp://u:2"}) {  // two maps the state never saw
    auto joined = state_->RegisterServer(Node(SERVER, 0, address));
    ASSERT_TRUE(joined.ok()) << joined.status();
  }
  const uint64_t seen = state_->Status().shard_map().epoch();
  ASSERT_EQ(seen, saved_epoch + 2);
  state_ = ClusterState::Restore(lagging, [this] { return now_; });
  ASSERT_EQ(state_->Status().shard_map().epoch(), saved_epoch);
  Beat({0}, {}, seen);
  EXPECT_GT(state_->Status().shard_map().epoch(), seen) << "maps the nodes would ignore";
  // A failover from here reaches them.
  for (int t = 0; t < 12; ++t) {
    now_ += absl::Milliseconds(100);
    Beat({0}, {0, 1, 2}, seen);
    state_->CheckLiveness();
  }
  const ShardMap map = state_->Status().shard_map();
  ASSERT_TRUE(map.servers(1).dead()) << map.ShortDebugString();
  EXPECT_GT(map.epoch(), seen + 1);
}

TEST_F(LivenessTest, ARestoredSchedulerKnowsTheSameNodesMapAndEpoch) {
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);
  ASSERT_THAT(Advance(200), SizeIs(1));
  ASSERT_TRUE(saved_.has_value());
  auto restored = ClusterState::Restore(*saved_, [this] { return now_; });
  StatusResponse before = state_->Status(), after = restored->Status();
  EXPECT_EQ(after.shard_map().SerializeAsString(), before.shard_map().SerializeAsString());
  // The old node ids still heartbeat; the dead one is still dead.
  HeartbeatRequest h;
  h.set_node_id(server_ids_[1]);
  h.set_applied_epoch(2);
  EXPECT_TRUE(restored->Heartbeat(h).ok());
  h.set_node_id(worker_ids_[2]);
  EXPECT_EQ(restored->Heartbeat(h).status().code(), absl::StatusCode::kFailedPrecondition);
  h.set_node_id(server_ids_[0]);
  EXPECT_TRUE(restored->Heartbeat(h).ok());
  // Every live node gets a fresh heartbeat timeout to reconnect, and status
  // tells which have not yet.
  EXPECT_THAT(restored->CheckLiveness(), IsEmpty());
  const StatusResponse restored_status = restored->Status();
  for (const NodeStatus& n : restored_status.nodes()) {
    EXPECT_EQ(n.heard_since_start(), n.role() == SERVER) << n.ShortDebugString();
  }
  // The same tensors are accepted again (a worker's retried call), and new
  // node ids continue after the old ones (rank 2, declared dead, rejoins; a
  // live rank's is held by its old process, heard or not).
  auto map = restored->DefineTensors({Tensor("w", 1000)}, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 2u);
  for (uint64_t id : server_ids_) {
    h.set_node_id(id);
    h.set_completed_round(1);
    ASSERT_TRUE(restored->Heartbeat(h).ok());
  }
  auto rejoined = Rejoin(*restored, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_GT(rejoined->node_id(), worker_ids_[2]);
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(LivenessTest, AWorkerWaitingInRendezvousIsNotDeclaredDead) {
  // A second job on a fresh state: worker 0 registers long before worker 1.
  ClusterState state(config_, [this] { return now_; });
  ASSERT_TRUE(state.RegisterServer(Node(SERVER, 0, "tcp://s:1")).ok());
  ASSERT_TRUE(state.RegisterServer(Node(SERVER, 0, "tcp://s:2")).ok());
  ASSERT_TRUE(state.RegisterWorker(Node(WORKER, 0)).ok());
  for (int t = 0; t < 30; ++t) {
    now_ += absl::Milliseconds(100);
    EXPECT_THAT(state.CheckLiveness(), IsEmpty());
  }
  ASSERT_TRUE(state.RegisterWorker(Node(WORKER, 1)).ok());
  ASSERT_TRUE(state.RegisterWorker(Node(WORKER, 2)).ok());
  EXPECT_THAT(state.CheckLiveness(), IsEmpty()) << "clocks start when the cluster has formed";
}

TEST_F(LivenessTest, ASchedulerThatHearsFromNoMajorityDeclaresNoOne) {
  // Cut off: nobody's heartbeats arrive.
  std::vector<std::string> lines = Advance(1500);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u);
  // The partition heals: everyone heartbeats again, nobody was lost.
  Beat({0, 1}, {0, 1, 2}, 1);
  EXPECT_THAT(Advance(900), IsEmpty());
  // Two of five silent is a minority: they are declared dead.
  Beat({0, 1}, {0}, 1);
  EXPECT_THAT(Advance(200), SizeIs(2));
}

TEST_F(LivenessTest, NodesReconnectingLateAfterTheSchedulerWasCutOffGetAFreshTimeout) {
  // chaos16, `tools/chaos.sh sched`: when the link came back the servers
  // reconnected first, made a majority, and both workers, silent for the
  // whole cut, were declared dead before they had reconnected.
  ASSERT_THAT(Advance(1500), ElementsAre(HasSubstr("more likely cut off itself")));
  Beat({0, 1}, {0}, 1);  // back: three of five reconnect first
  EXPECT_THAT(Advance(100), ElementsAre(HasSubstr("again"))) << "the late ones declared dead at once";
  EXPECT_THAT(Advance(800), IsEmpty());
  Beat({0, 1}, {0, 1}, 1);  // rank 1 reconnects within the fresh timeout; rank 2 never does
  EXPECT_THAT(Advance(300), ElementsAre(HasSubstr("worker rank 2")));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 2u);
}

TEST_F(LivenessTest, ASchedulerCutOffFromEveryoneDeclaresNoOneWhateverTheHeartbeatsPhases) {
  // Found by `tools/chaos.sh sched`: the scheduler partitioned away from the
  // whole job. The nodes' last heartbeats were a fraction of an interval
  // apart, so when the first crossed the timeout the others, just short of
  // it, counted as heard: a majority, which declared the first dead.
  EXPECT_THAT(Advance(100), IsEmpty());
  Beat({}, {1, 2}, 1);  // their last heartbeats
  EXPECT_THAT(Advance(400), IsEmpty());
  Beat({0, 1}, {0}, 1);  // the others' last, a little later
  std::vector<std::string> lines = Advance(1200);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u) << "nobody declared dead";
  // The partition heals: everyone heartbeats again, nobody was lost.
  Beat({0, 1}, {0, 1, 2}, 1);
  EXPECT_THAT(Advance(300), IsEmpty());
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u);
}

TEST_F(LivenessTest, NodesWhoseConnectionsClosedCountAsHeardSoManyKilledAtOnceAreDeclaredDead) {
  // Found with real processes: 3 of 4 workers of a 2-server job SIGKILLed
  // at once were never declared dead (3 of 6 nodes heard: "more likely cut
  // off itself"), and the last rank waited out its request timeout. Their
  // kernels closed their connections, which a partition never does.
  for (uint64_t id : server_ids_) state_->WatchOpened(id);
  for (uint64_t id : worker_ids_) state_->WatchOpened(id);
  for (uint64_t id : worker_ids_) state_->WatchOpened(id);  // a second watch, as while one reconnects
  // Rank 0 only closed one of its two: its process may still be there.
  state_->WatchEnded(worker_ids_[0], /*peer_gone=*/true);
  state_->WatchEnded(worker_ids_[1], /*peer_gone=*/false);  // ended by this side (deposed, stopping)
  EXPECT_THAT(Advance(300), IsEmpty());
  Beat({0, 1}, {}, 1);
  std::vector<std::string> lines = Advance(800);
  Beat({0, 1}, {}, 1);
  for (std::string& l : Advance(700)) lines.push_back(std::move(l));
  ASSERT_THAT(lines, SizeIs(1)) << "3 of 5 silent and no connection closed: cut off";
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u);

  // The cut heals: everyone heartbeats again, nobody was lost.
  Beat({0, 1}, {0, 1, 2}, 1);
  lines = Advance(100);
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u);

  // Then their processes die: every watch of theirs ends from their side
  // as they fall silent, and they are declared dead at the timeout.
  state_->WatchEnded(worker_ids_[0], true);
  state_->WatchEnded(worker_ids_[1], true);
  state_->WatchEnded(worker_ids_[2], true);
  state_->WatchEnded(worker_ids_[2], true);
  lines.clear();
  for (int t = 0; t < 6; ++t) {
    Beat({0, 1}, {}, 1);
    for (std::string& l : Advance(200)) lines.push_back(std::move(l));
  }
  ASSERT_THAT(lines, SizeIs(3));
  for (const std::string& line : lines) EXPECT_THAT(line, HasSubstr("worker rank"));
}

TEST_F(LivenessTest, WatchesEndedByThisSchedulersOwnTransportWhileCutOffDoNotCountAsHeard) {
  // Found probing gRPC 1.51 in two network namespaces, the server's side
  // dropping everything (as tools/chaos.sh sched): a stream the server
  // wrote to while cut off ended with IsCancelled() 20 s after the write
  // (gRPC servers give up on unacknowledged data after 20 s,
  // TCP_USER_TIMEOUT), while its peer was alive. A cut scheduler writes
  // to its watches (a new map) and answers waiting calls (a barrier at its
  // deadline) on the same connections: each such node then counted as
  // heard, a majority, and the scheduler declared every node dead.
  for (uint64_t id : server_ids_) state_->WatchOpened(id);
  for (uint64_t id : worker_ids_) state_->WatchOpened(id);
  Beat({0, 1}, {0, 1, 2}, 1);  // the last heartbeats before the cut
  std::vector<std::string> lines = Advance(1200);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
  EXPECT_THAT(Advance(20000), IsEmpty());
  for (uint64_t id : server_ids_) state_->WatchEnded(id, /*peer_gone=*/true);
  for (uint64_t id : worker_ids_) state_->WatchEnded(id, /*peer_gone=*/true);
  EXPECT_THAT(Advance(3000), IsEmpty()) << "still cut off: nobody heard";
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u) << "nobody declared dead";
}

TEST_F(LivenessTest, ANodeThatOpensAWatchAgainNoLongerCountsAsClosed) {
  for (uint64_t id : worker_ids_) state_->WatchOpened(id);
  for (uint64_t id : worker_ids_) state_->WatchEnded(id, /*peer_gone=*/true);
  for (uint64_t id : worker_ids_) state_->WatchOpened(id);  // reconnected: alive, then cut off
  state_->WatchEnded(12345, true);                          // a node this scheduler does not know
  EXPECT_THAT(Advance(300), IsEmpty());
  Beat({0, 1}, {}, 1);
  std::vector<std::string> lines = Advance(800);
  Beat({0, 1}, {}, 1);
  for (std::string& l : Advance(700)) lines.push_back(std::move(l));
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
}

TEST_F(LivenessTest, RanksWhoseNewProcessesAskToRegisterCountAsHeardSoTheOldOnesAreDeclaredDead) {
  // Found with real processes: both workers of a 2-server job SIGKILLed and
  // started again at once were never declared dead (2 of 4 nodes heard:
  // "more likely cut off itself"), and the new processes gave up after
  // their rendezvous timeout.
  for (uint64_t id : worker_ids_) ASSERT_TRUE(state_->WaitForCluster(absl::Now(), id).ok());  // past rendezvous
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {}, 1);
  for (uint32_t r = 0; r < 3; ++r) {
    auto again = state_->RegisterWorker(Node(WORKER, r));
    EXPECT_TRUE(IsRankStillHeldRefusal(again.status().message())) << again.status();
  }
  const std::vector<std::string> lines = Advance(200);
  ASSERT_THAT(lines, SizeIs(3));
  for (const std::string& line : lines) EXPECT_THAT(line, HasSubstr("worker rank"));
}

TEST_F(LivenessTest, ARankWaitingToRejoinCountsAsHeardSoAServerThatDiedMeanwhileIsDeclaredDead) {
  // Found with real processes: both workers of a 2-server job SIGKILLed,
  // started again at once, and a server killed a second later. Once the
  // workers were removed, 1 of 2 live nodes was heard ("more likely cut off
  // itself"), so the server was never declared dead; the rejoining ranks'
  // wait for every server's report ran out and they were placed at the
  // silent server's age of rounds past the servers' (380 of 100): "nothing
  // to train", both failed.
  std::vector<std::string> lines;
  auto rejoined = RejoinAloneWhileServerOneDies([](const ShardMap&, HeartbeatRequest&) {}, lines);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("server 1"));
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rejoin_round(), 50u) << "where the live server stands: nobody else trains";
}

TEST_F(LivenessTest, CallsOfOneRankWaitingToRejoinCountAsOneNodeHeardNotAMajority) {
  // Found in review: each waiting call counted as a node heard. A rank's
  // process asking again while its earlier calls still waited (a pod
  // restarted twice, a call cut and sent again) made 3 of 5 nodes heard
  // while the scheduler heard no server: a majority that declared both
  // live servers dead.
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(Leave(worker_ids_[r]).ok());
  }
  const uint64_t epoch = state_->Status().shard_map().epoch();
  Beat({0, 1}, {}, epoch);  // the servers' last heartbeats: the scheduler is cut off from them
  std::vector<std::thread> calls;
  for (int k = 0; k < 3; ++k) calls.emplace_back([this] { (void)state_->RegisterWorker(Node(WORKER, 0)); });
  AwaitRejoinCalls(*state_, 0, 3);  // every call waits for the servers' reports
  const std::vector<std::string> lines = Advance(1200);
  for (std::thread& t : calls) t.join();
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("more likely cut off itself"));
  EXPECT_FALSE(state_->Status().shard_map().servers(0).dead());
  EXPECT_FALSE(state_->Status().shard_map().servers(1).dead());
}

TEST_F(LivenessTest, RanksWaitingToRejoinCountAsHeardOnlyWhileTheirAskIsRecentSoACutOffSchedulerDeclaresNoOne) {
  // fix20, as 9d0cdc3 for watches: every worker removed, each rank's new
  // process waiting to rejoin (for the servers' reports), and then the
  // scheduler cut off from everyone. Each waiting call counted as a node
  // heard for its whole wait (a heartbeat timeout and an interval): 3 of 5,
  // a majority that declared both live servers dead.
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(Leave(worker_ids_[r]).ok());
  }
  const uint64_t epoch = state_->Status().shard_map().epoch();
  Beat({0, 1}, {}, epoch);  // the servers' last heartbeats: the scheduler is cut off from here on
  std::vector<std::thread> calls;
  for (uint32_t r = 0; r < 3; ++r) calls.emplace_back([this, r] { (void)state_->RegisterWorker(Node(WORKER, r)); });
  for (uint32_t r = 0; r < 3; ++r) AwaitRejoinCalls(*state_, r);
  const std::vector<std::string> lines = Advance(1200);
  for (std::thread& t : calls) t.join();
  EXPECT_THAT(lines, ElementsAre(HasSubstr("more likely cut off itself")));
  EXPECT_FALSE(state_->Status().shard_map().servers(0).dead());
  EXPECT_FALSE(state_->Status().shard_map().servers(1).dead());
}

TEST_F(LivenessTest, ARankWaitingToRejoinIsPlacedByReportsOfTheMapThatFailedAServerOver) {
  // Found with real processes (4 workers, 2 servers): server 0's report at
  // the removal's map said its primaries had all completed 50 rounds; the
  // failover then made it primary of server 1's partitions, some at 49. The
  // ranks were placed at 50, where nobody is counted in those partitions'
  // open round 49: every rank's first pull waited for it until the request
  // timeout.
  std::vector<std::string> lines;
  auto rejoined = RejoinAloneWhileServerOneDies(
      [](const ShardMap& map, HeartbeatRequest& h) { h.set_fewest_completed_round(map.servers(1).dead() ? 49 : 50); },
      lines);
  ASSERT_THAT(lines, SizeIs(1));
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rejoin_round(), 49u) << "the fewest of its primaries after the failover";
}

TEST_F(LivenessTest, ARestartedSchedulerRefusesANewProcessForARankItHasNotHeardUntilTheOldOneIsDeclaredDead) {
  // Found with real processes: the scheduler killed, then every worker, the
  // scheduler restarted from its state and the workers started again. The
  // restarted scheduler had heard from no old process, so the new ones took
  // their ranks as at the start, with no rejoin round: rank 0's INIT was
  // refused (the partitions had trained 21 rounds) and rank 1's push of
  // round 0 ("worker 1 restarted"); both exited 1.
  ReportRounds(50);
  ASSERT_TRUE(saved_.has_value());
  std::unique_ptr<ClusterState> restarted = ClusterState::Restore(*saved_, [this] { return now_; });
  auto again = restarted->RegisterWorker(Node(WORKER, 0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(IsRankStillHeldRefusal(again.status().message())) << again.status();
}

TEST_F(LivenessTest, ALateCheckForgivesThePauseInsteadOfDeclaringEveryoneDead) {
  Beat({0, 1}, {0, 1, 2}, 1);
  now_ += absl::Seconds(5);  // the scheduler itself was paused
  EXPECT_THAT(state_->CheckLiveness(), IsEmpty());
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0}, 1);
  EXPECT_THAT(Advance(300), SizeIs(2)) << "silence after the pause still counts";
}

TEST_F(LivenessTest, AHeartbeatHeardAfterThePauseBeforeTheLateCheckIsNotPushedIntoTheFuture) {
  // Found in review: after a pause the heartbeats queued behind it may be
  // heard before the late check, which then added the pause to them too:
  // those nodes counted as heard a pause into the future, and one that died
  // right after was declared dead only after the pause and the timeout.
  Beat({0, 1}, {0, 1, 2}, 1);
  now_ += absl::Seconds(5);  // the scheduler itself was paused
  Beat({0, 1}, {0, 1, 2}, 1);  // heard as it resumes, before its liveness check
  EXPECT_THAT(state_->CheckLiveness(), IsEmpty());
  EXPECT_THAT(Advance(900), IsEmpty());
  Beat({0, 1}, {0}, 1);
  EXPECT_THAT(Advance(300), SizeIs(2)) << "silent past the timeout since their last heartbeat";
}

TEST_F(LivenessTest, ACheckpointIsPlacedPastEveryServersRoundByItsPaceInANewEpoch) {
  ReportRounds(50);
  auto r = state_->RequestCheckpoint("/ckpt");
  ASSERT_TRUE(r.ok()) << r.status();
  // Two heartbeat intervals (1 s each) at 50 rounds a second past round 50, and one more.
  EXPECT_EQ(r->round(), 50u + 100u + 1u);
  const ShardMap map = state_->Status().shard_map();
  EXPECT_EQ(map.epoch(), 2u);
  EXPECT_EQ(map.checkpoint().dir(), "/ckpt");
  EXPECT_EQ(map.checkpoint().round(), r->round());
  ASSERT_TRUE(saved_.has_value());
  EXPECT_EQ(saved_->shard_map().checkpoint().round(), r->round()) << "persisted for a restarted scheduler";
}

TEST_F(LivenessTest, ACheckpointAskedBeforeAnyServerReportedARoundIsRefusedNotPlacedAtRoundOne) {
  Report(0, 0);
  Report(1, 0);
  auto early = state_->RequestCheckpoint("/ckpt");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("no server has reported a completed round yet"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u) << "a refused request publishes nothing";
  ReportRounds(50);
  EXPECT_TRUE(state_->RequestCheckpoint("/ckpt").ok());
}

TEST_F(LivenessTest, ACheckpointAskedOnceEveryWorkerLeftIsRefusedNotPlacedAtARoundThatNeverComes) {
  // docwalk17: `shardps checkpoint` after a sync job's end waited out its
  // --wait for a round no worker would train.
  ReportRounds(50);
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(Leave(worker_ids_[r]).ok());
    if (r < 2) {
      EXPECT_TRUE(state_->RequestCheckpoint("/ckpt").ok()) << "rank 2 still trains";
    }
  }
  const uint64_t epoch = state_->Status().shard_map().epoch();
  auto late = state_->RequestCheckpoint("/ckpt");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("every worker has left the job"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), epoch) << "a refused request publishes nothing";
}

class AsyncLivenessTest : public LivenessTest {
 protected:
  void SetUp() override {
    config_.set_consistency(ASYNC);
    LivenessTest::SetUp();
  }

  // Worker rank 2's process reports `steps` (none: no report; only its
  // first process reports here), is declared dead, and a new process for
  // the rank registers.
  absl::StatusOr<RegisterResponse> RankTwoDiesAndRejoins(std::optional<uint64_t> steps) {
    if (steps) {
      HeartbeatRequest h;
      h.set_node_id(worker_ids_[2]);
      h.mutable_counters()->set_steps(*steps);
      EXPECT_TRUE(state_->Heartbeat(h).ok());
    }
    Beat({0, 1}, {0, 1}, 1);
    EXPECT_THAT(Advance(900), IsEmpty());
    Beat({0, 1}, {0, 1}, 1);
    EXPECT_THAT(Advance(200), SizeIs(1));  // declared dead
    return Rejoin(*state_, 2);
  }
};

TEST_F(AsyncLivenessTest, AnAsyncCheckpointAskedBeforeAnyWorkerReportedItsStepsIsRefusedNotLabelledOne) {
  // Labelled 1, a resumed job would train its first steps again on weights
  // past them (found by fault injection: asked a few steps in).
  auto early = state_->RequestCheckpoint("/ckpt");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("no worker has reported its steps yet"));
  EXPECT_EQ(state_->Status().shard_map().epoch(), 1u) << "a refused request publishes nothing";
  HeartbeatRequest h;
  h.set_node_id(worker_ids_[1]);
  h.mutable_counters()->set_steps(60);
  ASSERT_TRUE(state_->Heartbeat(h).ok());
  auto r = state_->RequestCheckpoint("/ckpt");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->round(), 60u);
}

TEST_F(AsyncLivenessTest, ARankRejoiningGoesOnAfterTheStepsItsOldProcessReported) {
  // Async servers report no rounds: the rank was placed at 1 and trained
  // its share of every epoch again.
  auto rejoined = RankTwoDiesAndRejoins(40);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rejoin_round(), 40u);
  EXPECT_EQ(state_->Status().shard_map().rejoined_workers(0).round(), 40u);
}

TEST_F(AsyncLivenessTest, ARankRejoiningAgainBeforeItsNewProcessReportedGoesOnAfterItsLastRejoinRound) {
  // Found in review: the rank rejoined at 40, and its new process died
  // before its first report of steps (a crash at start, a kill within a
  // heartbeat interval). Placed by those reports alone, the next process
  // went back to step 1 and trained its share again; it started at 40.
  auto first = RankTwoDiesAndRejoins(40);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->rejoin_round(), 40u);
  auto again = RankTwoDiesAndRejoins(std::nullopt);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rejoin_round(), 40u);
}

TEST_F(AsyncLivenessTest, ARankRejoiningAfterASchedulerTookOverGoesOnAfterTheStepsItsOldProcessReported) {
  // Found by chaos15 (the torch example, schedulers on etcd): both ranks
  // SIGKILLed at step 200 as the active scheduler was, and started again;
  // the standby, resumed from the saved state, knew no steps of theirs and
  // placed them at 1: each trained its share of the epoch again.
  HeartbeatRequest h;
  h.set_node_id(worker_ids_[2]);
  h.mutable_counters()->set_steps(40);
  ASSERT_TRUE(state_->Heartbeat(h).ok());
  ASSERT_TRUE(saved_.has_value());
  state_ = ClusterState::Restore(*saved_, [this] { return now_; });
  ASSERT_THAT(StallUntilWorkerTwoIsDeclaredDead(0, 0), ElementsAre(HasSubstr("worker rank 2")));
  auto rejoined = Rejoin(*state_, 2);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rejoin_round(), 40u);
}

// SSP applied on arrival (staleness 2): servers report the furthest round
// pushed to them.
class SspLivenessTest : public LivenessTest {
 protected:
  void SetUp() override {
    config_.set_consistency(SSP);
    config_.set_staleness(2);
    LivenessTest::SetUp();
  }
};

TEST_F(SspLivenessTest, RanksRestartedAfterEveryWorkerLeftJoinAtTheRoundThePushesReachedNotAPacePast) {
  // Found by chaos15 (the torch example and `shardps train`, both ranks
  // SIGKILLed and started again): with nobody training the pushes stand
  // still, yet each rank was placed a pace past them (rounds 338 and 343
  // where they had reached about 200) and skipped that many steps of its data.
  absl::StatusOr<RegisterResponse> first = RejoinAloneAfterEveryWorkerLeft([](size_t i, HeartbeatRequest& h) {
    h.set_completed_round(i == 0 ? 52 : 51);
  });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->rejoin_round(), 52u) << "the furthest round pushed";
}

TEST(CheckpointRequestTest, RefusedBeforeTheMapExistsAndWhereACheckpointWouldNotBeExact) {
  ClusterConfig config;
  ClusterState early(config);
  EXPECT_THAT(early.RequestCheckpoint("/ckpt").status().message(), HasSubstr("no tensors are defined yet"));
  config.set_consistency(SSP);
  config.set_staleness(2);
  config.set_ssp_in_rounds(true);
  ClusterState ssp(config);
  EXPECT_THAT(ssp.RequestCheckpoint("/ckpt").status().message(), HasSubstr("ssp_in_rounds holds pushes"));
}

}  // namespace
}  // namespace shardps
