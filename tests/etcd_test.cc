// The scheduler's etcd backend against a real etcd (tests/test_etcd.h):
// fencing of a deposed scheduler's writes, a corrupt state refused, a sync
// job whose active scheduler is SIGKILLed while a standby takes over, and
// etcd over mutual TLS (a job trains; a missing client certificate or a
// wrong CA is refused naming the endpoint); and (without etcd) what a node
// hears from a standby.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/protocol.h"
#include "common/scheduler_client.h"
#include "common/tensor_spec.h"
#include "proto/etcd.grpc.pb.h"
#include "scheduler/etcd_client.h"
#include "scheduler/etcd_election.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_service.h"
#include "tests/test_etcd.h"
#include "tests/test_training.h"
#include "tools/cluster_credentials.h"
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
  // An election on `prefix` for a scheduler at `address`, with a 2 s lease.
  static absl::StatusOr<std::unique_ptr<EtcdElection>> Rival(const std::string& prefix, const std::string& address) {
    return EtcdElection::Create({.endpoints = endpoint(), .prefix = prefix, .address = address, .ttl = absl::Seconds(2)});
  }

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
  auto a = Rival(prefix, "a:1");
  auto b = Rival(prefix, "b:2");
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

TEST_F(EtcdTest, AStandbyWatchingTheLeaderKeyWakesWhenTheActiveOnesLeaseGoes) {
  const std::string prefix = Prefix("watch");
  auto a = Rival(prefix, "a:1");
  auto b = Rival(prefix, "b:2");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::string active;
  ASSERT_TRUE(*(*a)->Campaign(&active));
  ASSERT_FALSE(*(*b)->Campaign(&active));
  absl::StatusOr<bool> held = (*b)->AwaitLeaderGone(absl::Milliseconds(300));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(*held) << "the watch reported a leader key that is still held as gone";

  // `a` hands its lease back (as on SIGTERM) while `b` watches with a
  // deadline far beyond: only the deletion can end the wait with true.
  absl::StatusOr<bool> gone = false;
  std::thread watcher([&] { gone = (*b)->AwaitLeaderGone(absl::Seconds(60)); });
  a->reset();
  watcher.join();
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(*gone) << "the watch missed the leader key's deletion";
  EXPECT_TRUE(*(*b)->Campaign(&active)) << "the standby lost the campaign after the leader key went";
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

// The only scheduler of a `servers`-server, 1-worker job without backups on
// `prefix`, active, and a
// client of it; no renewal of its lease falls due during a test
// (heartbeat_timeout 60 s), so a lost leadership is found by its next
// state write.
struct ActiveScheduler {
  std::unique_ptr<SchedulerDaemon> daemon;
  std::unique_ptr<SchedulerClient> client;
};
absl::StatusOr<ActiveScheduler> StartActiveScheduler(const std::string& endpoint, const std::string& prefix,
                                                     uint32_t servers = 1) {
  SchedulerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.config.set_num_servers(servers);
  options.config.set_replication(1);
  options.config.set_num_workers(1);
  options.config.set_heartbeat_timeout_ms(60000);
  options.etcd_endpoints = endpoint;
  options.etcd_prefix = prefix;
  auto daemon = SchedulerDaemon::Create(options);
  if (!daemon.ok()) return daemon.status();
  if (absl::Status s = StatusOfDaemon(**daemon).status(); !s.ok()) return s;
  auto client = SchedulerClient::Create((*daemon)->address());
  if (!client.ok()) return client.status();
  return ActiveScheduler{*std::move(daemon), *std::move(client)};
}

// Revokes the lease P/leader is held on, as when etcd expires it and a
// standby wins: the active scheduler's next state write is refused.
absl::Status RevokeLeadership(const std::string& endpoint, const std::string& prefix) {
  auto etcd = EtcdClient::Create(endpoint);
  if (!etcd.ok()) return etcd.status();
  auto leader = (*etcd)->Get(prefix + "/leader");
  if (!leader.ok()) return leader.status();
  if (!leader->has_value()) return absl::NotFoundError(prefix + "/leader is not held");
  return (*etcd)->RevokeLease((*leader)->lease);
}

// A server's registration; its data address `address` must accept connections.
RegisterRequest ServerAt(const std::string& address) {
  RegisterRequest server;
  server.set_protocol_version(kProtocolVersion);
  server.set_role(SERVER);
  server.set_data_address(absl::StrCat("tcp://", address));
  return server;
}

RegisterRequest WorkerRankZero() {
  RegisterRequest worker;
  worker.set_protocol_version(kProtocolVersion);
  worker.set_role(WORKER);
  return worker;
}

// An active scheduler with a server and worker rank 0 registered, then
// deposed (another holds the leadership): its next write is refused.
struct DeposedWithAWorker {
  ActiveScheduler active;
  uint64_t worker_node_id = 0;
};
absl::StatusOr<DeposedWithAWorker> DeposeAfterAServerAndAWorkerRegistered(const std::string& endpoint,
                                                                         const std::string& prefix) {
  auto active = StartActiveScheduler(endpoint, prefix);
  if (!active.ok()) return active.status();
  SchedulerClient& client = *active->client;
  if (auto s = client.Register(ServerAt(active->daemon->address()), absl::Seconds(5)); !s.ok()) return s.status();
  auto registered = client.Register(WorkerRankZero(), absl::Seconds(5));
  if (!registered.ok()) return registered.status();
  if (absl::Status s = RevokeLeadership(endpoint, prefix); !s.ok()) return s;
  return DeposedWithAWorker{.active = *std::move(active), .worker_node_id = registered->node_id()};
}

// Defines one tensor while the servers of node ids `servers` report
// serving each epoch `daemon` publishes; returns the definition's answer.
absl::StatusOr<ShardMap> DefineOneTensor(SchedulerDaemon& daemon, SchedulerClient& client,
                                         const std::vector<uint64_t>& servers) {
  std::atomic<bool> defined{false};
  std::thread serve([&] {
    while (!defined.load()) {
      auto status = StatusOfDaemon(daemon);
      for (uint64_t id : servers) {
        HeartbeatRequest serving;
        serving.set_node_id(id);
        if (status.ok()) serving.set_applied_epoch(status->shard_map().epoch());
        (void)client.Heartbeat(serving, absl::Seconds(5));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  DefineTensorsRequest define;
  *define.add_tensors() = Float32Tensor("w", 16);
  auto map = client.DefineTensors(define, absl::Seconds(10));
  defined = true;
  serve.join();
  return map;
}

// Asks `stub` with a context of its own (a proxy's answer to its caller).
template <typename Stub, typename Request, typename Response>
grpc::Status Forward(grpc::Status (Stub::*call)(grpc::ClientContext*, const Request&, Response*), Stub& stub,
                     const Request& request, Response* response) {
  grpc::ClientContext ctx;
  return (stub.*call)(&ctx, request, response);
}

// An etcd member as a leader resumed after a pause (SIGSTOP) is until it hears
// of its successor: it answers a renewal of a lease granted meanwhile, which
// it has not applied, with TTL 0 ("not found"), though the lease lives. Here
// the next `stale` renewals are answered so; everything else goes on to the
// real etcd at `target` (host:port). Serves the KV and Lease calls an
// election makes (no watch).
class StaleLeaderMember final {
 public:
  explicit StaleLeaderMember(const std::string& target)
      : kv_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        lease_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), &stale_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&kv_);
    builder.RegisterService(&lease_);
    server_ = builder.BuildAndStart();
  }
  ~StaleLeaderMember() { server_->Shutdown(); }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  void AnswerRenewalsStale(int stale) { stale_ = stale; }

 private:
  class Kv final : public etcdserverpb::KV::Service {
   public:
    explicit Kv(const std::shared_ptr<grpc::Channel>& channel) : etcd_(etcdserverpb::KV::NewStub(channel)) {}
    grpc::Status Range(grpc::ServerContext*, const etcdserverpb::RangeRequest* request,
                        etcdserverpb::RangeResponse* response) override {
      return Forward(&etcdserverpb::KV::Stub::Range, *etcd_, *request, response);
    }
    grpc::Status Put(grpc::ServerContext*, const etcdserverpb::PutRequest* request,
                        etcdserverpb::PutResponse* response) override {
      return Forward(&etcdserverpb::KV::Stub::Put, *etcd_, *request, response);
    }
    grpc::Status Txn(grpc::ServerContext*, const etcdserverpb::TxnRequest* request,
                        etcdserverpb::TxnResponse* response) override {
      return Forward(&etcdserverpb::KV::Stub::Txn, *etcd_, *request, response);
    }

   private:
    std::unique_ptr<etcdserverpb::KV::Stub> etcd_;
  };
  class Lease final : public etcdserverpb::Lease::Service {
   public:
    Lease(const std::shared_ptr<grpc::Channel>& channel, std::atomic<int>* stale)
        : etcd_(etcdserverpb::Lease::NewStub(channel)), stale_(stale) {}
    grpc::Status LeaseGrant(grpc::ServerContext*, const etcdserverpb::LeaseGrantRequest* request,
                        etcdserverpb::LeaseGrantResponse* response) override {
      return Forward(&etcdserverpb::Lease::Stub::LeaseGrant, *etcd_, *request, response);
    }
    grpc::Status LeaseRevoke(grpc::ServerContext*, const etcdserverpb::LeaseRevokeRequest* request,
                        etcdserverpb::LeaseRevokeResponse* response) override {
      return Forward(&etcdserverpb::Lease::Stub::LeaseRevoke, *etcd_, *request, response);
    }
    grpc::Status LeaseKeepAlive(
        grpc::ServerContext*,
        grpc::ServerReaderWriter<etcdserverpb::LeaseKeepAliveResponse, etcdserverpb::LeaseKeepAliveRequest>* stream)
        override {
      etcdserverpb::LeaseKeepAliveRequest request;
      while (stream->Read(&request)) {
        etcdserverpb::LeaseKeepAliveResponse response;
        response.set_id(request.id());
        if (stale_->fetch_sub(1) <= 0) {
          grpc::ClientContext ctx;
          auto renewal = etcd_->LeaseKeepAlive(&ctx);
          if (!renewal->Write(request) || !renewal->Read(&response)) return renewal->Finish();
          ctx.TryCancel();
          renewal->Finish();
        }
        if (!stream->Write(response)) break;
      }
      return grpc::Status::OK;
    }

   private:
    std::unique_ptr<etcdserverpb::Lease::Stub> etcd_;
    std::atomic<int>* stale_;
  };

  std::atomic<int> stale_{0};
  Kv kv_;
  Lease lease_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// chaos16: with a three-member etcd and 2 s leases, a scheduler that took
// over while the leader member was SIGSTOPped exited "lost its etcd lease"
// when the member resumed, its lease alive. Told so, the active scheduler
// reads its leader key before it steps down.
TEST_F(EtcdTest, AnActiveSchedulerToldOfAnExpiryByAStaleMemberKeepsItsLeaseWhileItsLeaderKeyStands) {
  const std::string prefix = Prefix("stale");
  StaleLeaderMember member(std::string(absl::StripPrefix(endpoint(), "http://")));
  auto a = EtcdElection::Create({.endpoints = member.endpoint(), .prefix = prefix, .address = "a:1",
                                 .ttl = absl::Seconds(2)});
  ASSERT_TRUE(a.ok()) << a.status();
  std::string active;
  ASSERT_TRUE(*(*a)->Campaign(&active));

  member.AnswerRenewalsStale(1);
  absl::SleepFor((*a)->UntilRenewal());
  absl::Status renewed = (*a)->KeepAlive();
  EXPECT_FALSE(absl::IsFailedPrecondition(renewed)) << "a live lease was taken for lost: " << renewed;
  renewed = (*a)->KeepAlive();  // the stale answer is over: renewed now
  EXPECT_TRUE(renewed.ok()) << renewed;

  // A lease really gone (revoked, as when etcd expires it) is still lost.
  ASSERT_TRUE(RevokeLeadership(endpoint(), prefix).ok());
  absl::SleepFor((*a)->UntilRenewal());
  renewed = (*a)->KeepAlive();
  EXPECT_TRUE(absl::IsFailedPrecondition(renewed)) << renewed;
  EXPECT_THAT(std::string(renewed.message()), HasSubstr("lost its etcd lease"));
}

TEST_F(EtcdTest, ASchedulerDeposedByTheWriteOfAMapSendsThatMapToNoWatcher) {
  // A map goes out once the state holding it is written (fab4bb3). A write
  // refused because another scheduler holds the leadership deposes this one,
  // and the map stays unwritten: its successor resumes the older epoch and
  // may issue the same one with other contents, which a node holding this
  // map would ignore. Before, the watchers were sent it all the same.
  const std::string prefix = Prefix("unwritten-map");
  auto active = StartActiveScheduler(endpoint(), prefix);
  ASSERT_TRUE(active.ok()) << active.status();
  SchedulerDaemon* daemon = active->daemon.get();
  SchedulerClient* client = active->client.get();
  auto registered = client->Register(ServerAt(daemon->address()), absl::Seconds(5));
  ASSERT_TRUE(registered.ok()) << registered.status();
  absl::Mutex mu;
  std::vector<uint64_t> epochs;
  auto watch = client->WatchShardMap(
      registered->node_id(),
      [&](const ShardMap& map) {
        absl::MutexLock lock(&mu);
        epochs.push_back(map.epoch());
      },
      [](const absl::Status&) {});
  absl::SleepFor(absl::Milliseconds(500));  // the watch waits for a map past epoch 0

  // The server leaving makes epoch 1, whose write is refused.
  ASSERT_TRUE(RevokeLeadership(endpoint(), prefix).ok());
  HeartbeatRequest leaving;
  leaving.set_node_id(registered->node_id());
  leaving.set_leaving(true);
  (void)client->Heartbeat(leaving, absl::Seconds(5));  // refused: the leave was not written
  absl::SleepFor(absl::Seconds(1));
  watch.reset();
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
  absl::MutexLock lock(&mu);
  EXPECT_THAT(epochs, ::testing::IsEmpty()) << "a deposed scheduler sent a map it could not write";
}

TEST_F(EtcdTest, ARegistrationWhoseWriteDeposesTheSchedulerIsRefusedSoTheNodeAsksItsSuccessor) {
  // Found in review: the registration's write was refused (another
  // scheduler holds the leadership), and the server was given an index and
  // node id all the same, which the successor never heard of: its
  // heartbeats there were refused as from a node not registered, instead
  // of it registering with the successor (a scheduler's refusal sends a
  // node to the next address).
  const std::string prefix = Prefix("unwritten-registration");
  auto active = StartActiveScheduler(endpoint(), prefix);
  ASSERT_TRUE(active.ok()) << active.status();
  SchedulerDaemon* daemon = active->daemon.get();
  SchedulerClient* client = active->client.get();
  ASSERT_TRUE(RevokeLeadership(endpoint(), prefix).ok());
  auto registered = client->Register(ServerAt(daemon->address()), absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(registered.status())) << "registered by a deposed scheduler: " << registered.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
}

TEST_F(EtcdTest, ABarrierWhosePassDeposesTheSchedulerIsRefusedSoTheRanksEnterItWithTheSuccessor) {
  // Found in review: the pass's write was refused (another scheduler holds
  // the leadership), and the ranks were told it passed all the same: the
  // successor never heard of the pass, and a rank rejoining there waited at
  // a barrier the others had gone on from (as before 20f156d).
  auto deposed = DeposeAfterAServerAndAWorkerRegistered(endpoint(), Prefix("unwritten-barrier"));
  ASSERT_TRUE(deposed.ok()) << deposed.status();
  SchedulerDaemon* daemon = deposed->active.daemon.get();
  SchedulerClient* client = deposed->active.client.get();
  BarrierRequest init;
  init.set_node_id(deposed->worker_node_id);
  init.set_name("init");
  absl::Status passed = client->Barrier(init, absl::Seconds(20));
  EXPECT_TRUE(absl::IsUnavailable(passed)) << "passed by a deposed scheduler: " << passed;
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
  // review18: the refused write was tried again until the call's deadline,
  // and the deposed scheduler, whose gRPC server waits for its calls, could
  // not stop until then.
  const absl::Time stopping = absl::Now();
  daemon->Shutdown();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(5)) << "stopped only at the barrier's deadline";
}

TEST_F(EtcdTest, ALeaveWhoseWriteDeposesTheSchedulerIsRefusedSoTheNodeTellsItsSuccessor) {
  // Found in review: a leaving heartbeat's write was refused (another
  // scheduler holds the leadership), and the node was answered OK all the
  // same: a worker or a SIGTERMed server took its leave as heard and
  // stopped, while the successor never heard of it (it waits out the
  // heartbeat timeout before failing the server's partitions over, and
  // refuses a process started again at its address until then). The
  // refusal sends the leave on to the next scheduler.
  auto deposed = DeposeAfterAServerAndAWorkerRegistered(endpoint(), Prefix("unwritten-leave"));
  ASSERT_TRUE(deposed.ok()) << deposed.status();
  SchedulerDaemon* daemon = deposed->active.daemon.get();
  SchedulerClient* client = deposed->active.client.get();
  HeartbeatRequest leaving;
  leaving.set_node_id(deposed->worker_node_id);
  leaving.set_leaving(true);
  auto said = client->Heartbeat(leaving, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(said.status())) << "a leave answered by a deposed scheduler: " << said.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
}

TEST_F(EtcdTest, ACheckpointRequestWhoseWriteDeposesTheSchedulerIsRefusedNotPromised) {
  // Found in review: the request's write was refused (another scheduler
  // holds the leadership), and `shardps checkpoint` was told the round all
  // the same: no server is ever asked (the map that asks is not written,
  // and no watcher is sent it), and the successor knows of no request.
  const std::string prefix = Prefix("unwritten-checkpoint");
  auto active = StartActiveScheduler(endpoint(), prefix);
  ASSERT_TRUE(active.ok()) << active.status();
  SchedulerDaemon* daemon = active->daemon.get();
  SchedulerClient* client = active->client.get();
  auto server = client->Register(ServerAt(daemon->address()), absl::Seconds(5));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client->Register(WorkerRankZero(), absl::Seconds(5)).ok());
  // The tensors defined; the server reports serving their map, then a round.
  auto map = DefineOneTensor(*daemon, *client, {server->node_id()});
  ASSERT_TRUE(map.ok()) << map.status();
  HeartbeatRequest round;
  round.set_node_id(server->node_id());
  round.set_applied_epoch(map->epoch());
  round.set_completed_round(5);
  ASSERT_TRUE(client->Heartbeat(round, absl::Seconds(5)).ok());

  ASSERT_TRUE(RevokeLeadership(endpoint(), prefix).ok());
  CheckpointRequest checkpoint;
  checkpoint.set_dir("/tmp/shardps-unwritten-checkpoint");
  auto asked = client->RequestCheckpoint(checkpoint, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(asked.status())) << "promised by a deposed scheduler: " << asked.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
}

TEST_F(EtcdTest, ADrainWhoseWriteDeposesTheSchedulerIsRefusedNotStarted) {
  // Found in review: the drain's write was refused (another scheduler holds
  // the leadership), and `shardps drain` was told the server drains: no
  // server is sent the map that moves its copies, and the successor never
  // heard of the drain.
  const std::string prefix = Prefix("unwritten-drain");
  auto active = StartActiveScheduler(endpoint(), prefix, /*servers=*/2);
  ASSERT_TRUE(active.ok()) << active.status();
  SchedulerDaemon* daemon = active->daemon.get();
  SchedulerClient* client = active->client.get();
  // Two addresses that accept connections: the scheduler's and etcd's.
  const std::string etcd_address(absl::StripPrefix(endpoint(), "http://"));
  std::vector<uint64_t> servers;
  for (const std::string& address : {daemon->address(), etcd_address}) {
    auto server = client->Register(ServerAt(address), absl::Seconds(5));
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(server->node_id());
  }
  ASSERT_TRUE(client->Register(WorkerRankZero(), absl::Seconds(5)).ok());
  auto map = DefineOneTensor(*daemon, *client, servers);
  ASSERT_TRUE(map.ok()) << map.status();

  ASSERT_TRUE(RevokeLeadership(endpoint(), prefix).ok());
  DrainRequest drain;
  drain.set_server(1);
  auto draining = client->Drain(drain, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(draining.status())) << "started by a deposed scheduler: " << draining.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(daemon->Failure())) << "not deposed: " << daemon->Failure();
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
  // When the killed scheduler's leader key goes (its lease expires), seen on
  // a watch of our own: the standby's share of the takeover starts there.
  auto watcher_client = EtcdClient::Create(endpoint());
  ASSERT_TRUE(watcher_client.ok()) << watcher_client.status();
  auto leader = (*watcher_client)->Get(prefix + "/leader");
  ASSERT_TRUE(leader.ok() && leader->has_value()) << leader.status();
  absl::Time key_gone = absl::InfinitePast();
  std::thread key_watcher([&] {
    auto gone = (*watcher_client)->AwaitDeletion(prefix + "/leader", (*leader)->read_revision + 1, absl::Seconds(30));
    if (gone.ok() && *gone) key_gone = absl::Now();
  });
  Kill(processes.list[0]);
  const absl::Time killed = absl::Now();
  absl::StatusOr<StatusResponse> after = absl::UnavailableError("not asked");
  while (!after.ok() && absl::Now() < killed + absl::Seconds(30)) {
    after = StatusOf(*second);
    if (!after.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Time served = absl::Now();
  key_watcher.join();
  ASSERT_TRUE(after.ok()) << "the standby did not take over: " << after.status();
  std::cout << "takeover: the standby served " << absl::ToDoubleSeconds(served - killed)
            << " s after the active scheduler's SIGKILL (lease TTL 2 s), "
            << absl::ToDoubleSeconds(served - key_gone) * 1000 << " ms after its leader key went\n";
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

// etcd over TLS with --client-cert-auth. `shardps certs` material: etcd
// serves the certificate made for the scheduler host (it names 127.0.0.1),
// and schedulers show the node certificate as etcd clients; a second,
// unrelated CA plays the wrong one.
class EtcdTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::filesystem::temp_directory_path() / absl::StrCat("shardps-etcd-tls-", getpid()));
    error_ = new std::string();
    auto ours = WriteClusterCredentials(*dir_ + "/ca", {}, /*mutual=*/true);
    auto other = WriteClusterCredentials(*dir_ + "/other", {}, /*mutual=*/true);
    if (!ours.ok() || !other.ok()) {
      *error_ = absl::StrCat("cannot make certificates: ", ours.status().ToString(), other.status().ToString());
      return;
    }
    auto etcd = TestEtcd::Start({.cert_file = *dir_ + "/ca/scheduler.pem",
                                 .key_file = *dir_ + "/ca/scheduler.key",
                                 .client_ca_file = *dir_ + "/ca/ca.pem",
                                 .client = Client()});
    if (etcd.ok()) {
      etcd_ = etcd->release();
    } else {
      *error_ = etcd.status().ToString();
    }
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    std::filesystem::remove_all(*dir_);
  }
  void SetUp() override { ASSERT_NE(etcd_, nullptr) << "cannot start etcd over TLS: " << *error_; }
  static const std::string& endpoint() { return etcd_->endpoint(); }
  // The right CA and a client certificate of it.
  static EtcdTlsFiles Client() {
    return {.ca_file = *dir_ + "/ca/ca.pem", .cert_file = *dir_ + "/ca/node.pem", .key_file = *dir_ + "/ca/node.key"};
  }
  static std::string Other(const std::string& file) { return *dir_ + "/other/" + file; }
  // Why an in-process scheduler on etcd with `tls` did not start; empty if
  // it started.
  static std::string Refusal(const EtcdTlsFiles& tls, const std::string& test) {
    SchedulerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.etcd_endpoints = endpoint();
    options.etcd_prefix = absl::StrCat("/shardps-tls-", getpid(), "/", test);
    options.etcd_tls = tls;
    auto daemon = SchedulerDaemon::Create(options);
    return daemon.ok() ? "" : daemon.status().ToString();
  }
  // host:port of the endpoint, as errors name it.
  static std::string HostPort() { return endpoint().substr(std::string("https://").size()); }

  static TestEtcd* etcd_;
  static std::string* dir_;
  static std::string* error_;
};
TestEtcd* EtcdTlsTest::etcd_ = nullptr;
std::string* EtcdTlsTest::dir_ = nullptr;
std::string* EtcdTlsTest::error_ = nullptr;

TEST_F(EtcdTlsTest, ASchedulerWithTheCaAndAClientCertificateServesAJobAndAStandbyTakesOver) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST is not installed (tools/setup.sh installs it)";
  ClusterConfig config = TrainingConfig(SYNC, 1, 1);
  const std::string dir = *dir_ + "/job";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cluster.pbtxt") << config.DebugString();
  const EtcdTlsFiles tls = Client();
  Processes processes;
  // A scheduler process on the TLS etcd, serving once `port_file` exists.
  auto start_scheduler = [&](const std::string& port_file) {
    return Spawn("scheduler", {SHARDPS_BINARY, "scheduler", "--listen", "127.0.0.1:0", "--config",
                               dir + "/cluster.pbtxt", "--etcd", endpoint(), "--etcd-prefix",
                               absl::StrCat("/shardps-tls-", getpid(), "/job"), "--etcd-ca", tls.ca_file, "--etcd-cert",
                               tls.cert_file, "--etcd-key", tls.key_file, "--port-file", port_file},
                 true);
  };
  auto scheduler = start_scheduler(dir + "/scheduler.addr");
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  processes.list.push_back(*scheduler);
  std::vector<ChildProcess> watch = {*scheduler};
  auto address = WaitForAddressFile(dir + "/scheduler.addr", watch, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(address.ok()) << address.status();
  absl::StatusOr<StatusResponse> active = absl::UnavailableError("not asked");
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); !active.ok() && absl::Now() < deadline;) {
    active = StatusOf(*address);
    if (!active.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(active.ok()) << "the only scheduler on etcd over TLS never became active: " << active.status();

  auto server = Spawn("server", {SHARDPS_BINARY, "server", "--scheduler", *address, "--listen", "tcp://127.0.0.1:0"},
                      true);
  ASSERT_TRUE(server.ok()) << server.status();
  processes.list.push_back(*server);
  auto worker = Worker::Create({.scheduler_address = *address, .rank = 0});
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::ostringstream log;
  auto result = RunTrainingWorker(**worker, QuietRun(1, 2000, 500), log);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->steps, 0);
  EXPECT_GT(result->test_accuracy, 0.3) << "the job did not learn";
  // The state went to etcd over the same TLS connection.
  auto client = EtcdClient::Create(endpoint(), tls);
  ASSERT_TRUE(client.ok()) << client.status();
  auto state = (*client)->Get(absl::StrCat("/shardps-tls-", getpid(), "/job/state"));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->has_value()) << "the active scheduler saved no state in etcd";

  // A standby on the same etcd watches the leader key over TLS and takes over
  // once the active scheduler stops (SIGTERM hands its lease back).
  auto standby = start_scheduler(dir + "/standby.addr");
  ASSERT_TRUE(standby.ok()) << standby.status();
  processes.list.push_back(*standby);
  watch = {*standby};
  auto standby_address = WaitForAddressFile(dir + "/standby.addr", watch, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(standby_address.ok()) << standby_address.status();
  EXPECT_TRUE(absl::IsUnavailable(StatusOf(*standby_address).status())) << "a second scheduler is not a standby";
  Stop(processes.list[0], absl::Seconds(5));
  absl::StatusOr<StatusResponse> took_over = absl::UnavailableError("not asked");
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); !took_over.ok() && absl::Now() < deadline;) {
    took_over = StatusOf(*standby_address);
    if (!took_over.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(took_over.ok()) << "the standby never took over: " << took_over.status();
  EXPECT_EQ(took_over->nodes_size(), 2) << "the standby did not resume the cluster saved over TLS";
}

// A scheduler refused names the endpoint (and the request that failed) and
// the likely cause.
TEST_F(EtcdTlsTest, ASchedulerWithoutAClientCertificateIsRefusedNamingTheEndpoint) {
  const std::string refusal = Refusal({.ca_file = Client().ca_file}, "no-client-cert");
  EXPECT_THAT(refusal, HasSubstr("etcd " + HostPort() + ": granting a lease"));
  EXPECT_THAT(refusal, HasSubstr("refuses a client without a certificate"));
}

TEST_F(EtcdTlsTest, ASchedulerThatTrustsAnotherCaIsRefusedNamingTheEndpoint) {
  EtcdTlsFiles tls = Client();
  tls.ca_file = Other("ca.pem");
  const std::string refusal = Refusal(tls, "wrong-ca");
  EXPECT_THAT(refusal, HasSubstr("etcd " + HostPort() + ": granting a lease"));
  EXPECT_THAT(refusal, HasSubstr("not signed by --etcd-ca " + tls.ca_file));
}

TEST_F(EtcdTlsTest, AClientCertificateOfAnotherCaIsRefusedNamingTheEndpoint) {
  EtcdTlsFiles tls = Client();
  tls.cert_file = Other("node.pem");
  tls.key_file = Other("node.key");
  const std::string refusal = Refusal(tls, "foreign-client-cert");
  EXPECT_THAT(refusal, HasSubstr("etcd " + HostPort() + ": granting a lease"));
  EXPECT_THAT(refusal, HasSubstr("refuses --etcd-cert " + tls.cert_file));
}

// Bad TLS settings are refused before any connection, naming what is wrong.
TEST_F(EtcdTlsTest, BadTlsSettingsAreRefusedNamingTheFlagAndFile) {
  struct Case {
    std::string endpoints;
    EtcdTlsFiles tls;
    std::string expected;
  };
  const EtcdTlsFiles good = Client();
  const std::vector<Case> cases = {
      {"https://127.0.0.1:1,http://127.0.0.1:2", good, "mixes http:// and https://"},
      {"https://127.0.0.1:1", {}, "need --etcd-ca"},
      {"http://127.0.0.1:1", good, "need https://"},
      {"https://127.0.0.1:1", {.ca_file = *dir_ + "/missing.pem"}, "--etcd-ca: " + *dir_ + "/missing.pem does not exist"},
      {"https://127.0.0.1:1", {.ca_file = good.key_file}, "--etcd-ca " + good.key_file + ": holds no PEM certificate"},
      {"https://127.0.0.1:1", {.ca_file = good.ca_file, .cert_file = good.cert_file}, "give both or neither"},
      {"https://127.0.0.1:1",
       {.ca_file = good.ca_file, .cert_file = good.cert_file, .key_file = Other("node.key")},
       "--etcd-key " + Other("node.key") + " is not the key of --etcd-cert " + good.cert_file},
  };
  for (const Case& c : cases) {
    auto client = EtcdClient::Create(c.endpoints, c.tls);
    ASSERT_FALSE(client.ok()) << c.expected;
    EXPECT_TRUE(absl::IsInvalidArgument(client.status()) || absl::IsNotFound(client.status())) << client.status();
    EXPECT_THAT(std::string(client.status().message()), HasSubstr(c.expected));
  }
}

}  // namespace
}  // namespace shardps
