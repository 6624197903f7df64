#include "common/tensor_spec.h"
#include "scheduler/cluster_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/protocol.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

ClusterConfig Config(int servers, int workers) {
  ClusterConfig c;
  c.set_num_servers(servers);
  c.set_num_workers(workers);
  return c;
}

RegisterRequest Server(const std::string& addr) {
  RegisterRequest r;
  r.set_protocol_version(kProtocolVersion);
  r.set_role(SERVER);
  r.set_data_address(addr);
  return r;
}

RegisterRequest Worker(uint32_t rank) {
  RegisterRequest r;
  r.set_protocol_version(kProtocolVersion);
  r.set_role(WORKER);
  r.set_rank(rank);
  return r;
}

absl::Time Soon() { return absl::Now() + absl::Milliseconds(300); }

TEST(ClusterStateTest, RendezvousTimeoutNamesMissingRanks) {
  ClusterState state(Config(1, 3));
  ASSERT_TRUE(state.RegisterServer(Server("tcp://a:1")).ok());
  ASSERT_TRUE(state.RegisterWorker(Worker(0)).ok());
  ASSERT_TRUE(state.RegisterWorker(Worker(2)).ok());
  absl::Status s = state.WaitForCluster(Soon());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("missing worker ranks: 1"));
  ASSERT_TRUE(state.RegisterWorker(Worker(1)).ok());
  EXPECT_TRUE(state.WaitForCluster(Soon()).ok());
}

TEST(ClusterStateTest, RefusesWrongVersionExtraServersAndBadRanks) {
  ClusterState state(Config(1, 1));
  RegisterRequest old = Server("tcp://a:1");
  old.set_protocol_version(kProtocolVersion + 7);
  EXPECT_THAT(state.RegisterServer(old).status().message(), HasSubstr("protocol version"));
  ASSERT_TRUE(state.RegisterServer(Server("tcp://a:1")).ok());
  EXPECT_EQ(state.RegisterServer(Server("tcp://b:1")).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(state.RegisterWorker(Worker(1)).status().message(), HasSubstr("outside [0, 1)"));
}

TEST(ClusterStateTest, ServerRegisteringAgainKeepsItsIndex) {
  ClusterState state(Config(2, 1));
  auto a = state.RegisterServer(Server("tcp://a:1"));
  auto b = state.RegisterServer(Server("tcp://b:1"));
  auto a2 = state.RegisterServer(Server("tcp://a:1"));
  ASSERT_TRUE(a.ok() && b.ok() && a2.ok());
  EXPECT_EQ(a->server_index(), 0u);
  EXPECT_EQ(b->server_index(), 1u);
  EXPECT_EQ(a2->server_index(), 0u);
}

TensorSpec Tensor(const std::string& name, int64_t n) { return Float32Tensor(name, n); }

TEST(ClusterStateTest, DefineTensorsWaitsUntilServersServeTheEpoch) {
  ClusterState state(Config(1, 1));
  auto server = state.RegisterServer(Server("tcp://a:1"));
  ASSERT_TRUE(server.ok());
  std::thread serving([&] {
    auto map = state.WaitForMap(0, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(map.has_value());
    HeartbeatRequest hb;
    hb.set_node_id(server->node_id());
    hb.set_applied_epoch(map->epoch());
    ASSERT_TRUE(state.Heartbeat(hb).ok());
  });
  auto map = state.DefineTensors({Tensor("w", 10)}, absl::Now() + absl::Seconds(5));
  serving.join();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 1u);
  EXPECT_EQ(map->partitions_size(), 1);
  // Same tensors again: same map; different ones: refused, naming the tensor.
  EXPECT_TRUE(state.DefineTensors({Tensor("w", 10)}, Soon()).ok());
  auto bad = state.DefineTensors({Tensor("w", 11)}, Soon());
  EXPECT_THAT(bad.status().message(), HasSubstr("'w'"));
}

TEST(ClusterStateTest, DefineTensorsTimesOutNamingTheLaggingServer) {
  ClusterState state(Config(1, 1));
  ASSERT_TRUE(state.RegisterServer(Server("tcp://a:1")).ok());
  auto map = state.DefineTensors({Tensor("w", 10)}, Soon());
  EXPECT_EQ(map.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(map.status().message(), HasSubstr("tcp://a:1"));
}

TEST(ClusterStateTest, BarrierReleasesWhenAllWorkersArriveAndIsReusable) {
  ClusterState state(Config(1, 2));
  auto w0 = state.RegisterWorker(Worker(0));
  auto w1 = state.RegisterWorker(Worker(1));
  ASSERT_TRUE(w0.ok() && w1.ok());
  for (int round = 0; round < 2; ++round) {
    absl::Status s0;
    std::thread t([&] { s0 = state.Barrier(w0->node_id(), "step", absl::Now() + absl::Seconds(5)); });
    EXPECT_TRUE(state.Barrier(w1->node_id(), "step", absl::Now() + absl::Seconds(5)).ok());
    t.join();
    EXPECT_TRUE(s0.ok()) << s0;
  }
  absl::Status alone = state.Barrier(w0->node_id(), "step", Soon());
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.message(), HasSubstr("missing worker ranks: 1"));
}

TEST(ClusterStateTest, StatusReportsLiveness) {
  absl::Time now = absl::Now();
  ClusterConfig config = Config(1, 1);
  config.set_heartbeat_timeout_ms(5000);
  ClusterState state(config, [&] { return now; });
  ASSERT_TRUE(state.RegisterServer(Server("tcp://a:1")).ok());
  EXPECT_TRUE(state.Status().nodes(0).alive());
  now += absl::Seconds(6);
  EXPECT_FALSE(state.Status().nodes(0).alive());
}

}  // namespace
}  // namespace shardps
