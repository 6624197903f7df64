#include "tools/status_view.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardps {
namespace {

StatusResponse OneServer(uint64_t rounds, uint64_t ms_since_counters, double scheduler_rate) {
  StatusResponse status;
  status.mutable_config()->set_num_servers(1);
  NodeStatus* n = status.add_nodes();
  n->set_node_id(7);
  n->set_role(SERVER);
  n->set_alive(true);
  n->mutable_counters()->set_rounds_completed(rounds);
  n->mutable_counters()->set_bytes_out(rounds * 1000000);
  n->set_ms_since_counters(ms_since_counters);
  n->mutable_rates()->set_rounds(scheduler_rate);
  return status;
}

TEST(StatusViewTest, WatchRatesAreBetweenTheHeartbeatsOfTwoRefreshes) {
  const StatusResponse before = OneServer(10, 500, 3);
  // 2.4 s later; these counters are 0.1 s old: they came 2.8 s after the others.
  StatusResponse now = OneServer(38, 100, 3);
  RatesSinceSnapshot(before, 2.4, &now);
  EXPECT_DOUBLE_EQ(now.nodes(0).rates().rounds(), 10);
  EXPECT_DOUBLE_EQ(now.nodes(0).rates().bytes_out(), 10e6);
  const std::string table = StatusTable(now);
  EXPECT_NE(table.find("10.0 rounds/s"), std::string::npos) << table;
  EXPECT_NE(table.find("out 10.00 MB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("(data 100 ms old)"), std::string::npos) << table;
}

TEST(StatusViewTest, WatchKeepsTheSchedulerRatesWithoutNewCounters) {
  const StatusResponse before = OneServer(10, 500, 3);
  StatusResponse now = OneServer(10, 2900, 3);  // the same heartbeat, 2.4 s older
  RatesSinceSnapshot(before, 2.4, &now);
  EXPECT_DOUBLE_EQ(now.nodes(0).rates().rounds(), 3);
}

StatusResponse ThreeWorkers(Consistency consistency, uint32_t staleness, std::vector<uint64_t> steps) {
  StatusResponse status;
  status.mutable_config()->set_consistency(consistency);
  status.mutable_config()->set_staleness(staleness);
  for (uint32_t rank = 0; rank < steps.size(); ++rank) {
    NodeStatus* n = status.add_nodes();
    n->set_node_id(rank + 1);
    n->set_role(WORKER);
    n->set_rank(rank);
    n->set_alive(true);
    n->mutable_counters()->set_steps(steps[rank]);
  }
  return status;
}

TEST(StatusViewTest, AWorkerFarBehindTheOthersIsMarkedLagging) {
  const std::string table = StatusTable(ThreeWorkers(SYNC, 0, {100, 99, 80}));
  EXPECT_NE(table.find("lagging 20 steps"), std::string::npos) << table;
  EXPECT_EQ(table.find("lagging 1 "), std::string::npos) << table;  // one round apart is lockstep
}

TEST(StatusViewTest, SspWorkersWithinTheirStalenessAreNotLagging) {
  const std::string table = StatusTable(ThreeWorkers(SSP, 4, {100, 96, 94}));
  EXPECT_EQ(table.find("lagging"), std::string::npos) << table;
  EXPECT_NE(StatusTable(ThreeWorkers(SSP, 4, {100, 96, 90})).find("lagging 10 steps"), std::string::npos);
}

TEST(StatusViewTest, HandoffsUnderWayAreShownInTheTableAndTheJson) {
  StatusResponse status = OneServer(0, 0, 0);
  Handoff* h = status.mutable_shard_map()->add_handoffs();
  h->set_partition(4);
  h->set_from(0);
  h->set_to(2);
  h->set_epoch(9);
  status.set_handoffs_planned(3);
  EXPECT_NE(StatusTable(status).find("primary hand-offs under way: partition 4 (server 0 -> 2, since epoch 9)"),
            std::string::npos)
      << StatusTable(status);
  const std::string json = StatusJson(status);
  EXPECT_NE(json.find("\"handoffs\":[{\"partition\":\"4\",\"from\":0,\"to\":2,\"epoch\":\"9\"}]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"handoffs_planned\":\"3\""), std::string::npos) << json;
}

TEST(StatusViewTest, AServersCopiesAndHowManyAreSyncedAreShown) {
  StatusResponse status = OneServer(10, 100, 3);
  status.mutable_nodes(0)->set_copies(12);
  status.mutable_nodes(0)->set_copies_synced(9);
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find("copies 9/12 synced"), std::string::npos) << table;
}

TEST(StatusViewTest, ADrainingServerIsShownSo) {
  StatusResponse status = OneServer(10, 100, 3);
  EXPECT_EQ(StatusTable(status).find("draining"), std::string::npos);
  ServerInfo* info = status.mutable_shard_map()->add_servers();
  info->set_index(0);
  info->set_draining(true);
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find("alive, draining"), std::string::npos) << table;
}

// README: "a server still on an older map `behind`". One that left (drained,
// stopped) serves no map any more, as a dead one does not.
TEST(StatusViewTest, AServerThatLeftIsNotBehind) {
  StatusResponse status = OneServer(10, 100, 3);
  status.mutable_shard_map()->set_epoch(10);
  status.mutable_nodes(0)->set_applied_epoch(9);
  EXPECT_NE(StatusTable(status).find(" behind"), std::string::npos) << StatusTable(status);
  status.mutable_nodes(0)->set_alive(false);
  status.mutable_nodes(0)->set_left(true);
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find(" left (heartbeat"), std::string::npos) << table;
  EXPECT_EQ(table.find(" behind"), std::string::npos) << table;
}

TEST(StatusViewTest, AServerInADeadOnesPlaceSaysHowThatOneEnded) {
  StatusResponse status = OneServer(10, 100, 3);
  EXPECT_EQ(StatusTable(status).find("in the place of"), std::string::npos);
  status.mutable_nodes(0)->set_replaced("declared dead");
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find("    in the place of a server that was declared dead"), std::string::npos) << table;
  status.mutable_nodes(0)->set_replaced("left: stopped before its drain was done");
  EXPECT_NE(StatusTable(status).find("    in the place of a server that left: stopped before its drain was done"),
            std::string::npos)
      << StatusTable(status);
}

TEST(StatusViewTest, AWorkerThatLeftOnAnErrorIsShownAsFailedWithIt) {
  StatusResponse status = ThreeWorkers(SYNC, 0, {10, 10, 4});
  status.mutable_nodes(1)->set_left(true);
  status.mutable_nodes(2)->set_left(true);
  status.mutable_nodes(2)->set_left_error("uncaught ValueError: loss is nan (train.py:42 in step)");
  const std::string table = StatusTable(status);
  EXPECT_NE(table.find("worker 1   "), std::string::npos) << table;
  EXPECT_NE(table.find(" left (heartbeat"), std::string::npos) << table;
  EXPECT_NE(table.find("FAILED (left on an error)"), std::string::npos) << table;
  EXPECT_NE(table.find("    error: uncaught ValueError: loss is nan (train.py:42 in step)"), std::string::npos) << table;
  EXPECT_NE(StatusJson(status).find("\"left_error\":\"uncaught ValueError"), std::string::npos) << StatusJson(status);
}

}  // namespace
}  // namespace shardps
