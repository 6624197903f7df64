#include "tools/status_view.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shardps
