#include "tools/run_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

Env Mx(const std::string& role) {
  return {{"DMLC_ROLE", role},          {"DMLC_PS_ROOT_URI", "job-scheduler-0"}, {"DMLC_PS_ROOT_PORT", "9091"},
          {"DMLC_NUM_SERVER", "2"},     {"DMLC_NUM_WORKER", "3"}};
}

TEST(RunPlanTest, SchedulerListensOnRootPortAndSizesTheCluster) {
  auto plan = PlanRun({"--config", "/etc/shardps/cluster.pbtxt"}, Mx("scheduler"), "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->command, "scheduler");
  EXPECT_THAT(plan->args, ElementsAre("--listen", "0.0.0.0:9091", "--set", "num_servers=2", "--set",
                                      "num_workers=3", "--config", "/etc/shardps/cluster.pbtxt"));
}

TEST(RunPlanTest, ServerGetsSchedulerAddressPortAndAdvertisedHost) {
  Env env = Mx("SERVER");
  env["DMLC_NODE_HOST"] = "10.1.2.3";
  env["PORT"] = "7001";
  auto plan = PlanRun({}, env, "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->command, "server");
  EXPECT_THAT(plan->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--listen", "tcp://*:7001",
                                      "--advertise-host", "10.1.2.3"));
  plan = PlanRun({}, Mx("server"), "node7");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--listen", "tcp://*:0",
                                      "--advertise-host", "node7"));
}

TEST(RunPlanTest, WorkerRankFromTheFirstVariableSet) {
  Env env = Mx("worker");
  env["JOB_COMPLETION_INDEX"] = "2";
  env["MX_CONFIG"] = R"({"task": {"type": "worker", "index": 1}})";
  auto plan = PlanRun({"--max-steps", "10"}, env, "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->command, "train");
  EXPECT_THAT(plan->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--rank", "2", "--max-steps", "10"));
  env["DMLC_WORKER_ID"] = "0";
  EXPECT_THAT(PlanRun({}, env, "h")->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--rank", "0"));
  env.erase("DMLC_WORKER_ID");
  env["JOB_COMPLETION_INDEX"] = "";  // unset label through the downward API
  EXPECT_THAT(PlanRun({}, env, "h")->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--rank", "1"));
}

TEST(RunPlanTest, ExplicitFlagsWin) {
  Env env = Mx("worker");
  env["DMLC_WORKER_ID"] = "5";
  auto plan = PlanRun({"--role", "server", "--scheduler=10.0.0.1:7000", "--listen", "tcp://*:7100",
                       "--advertise-host", "a"},
                      env, "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->command, "server");
  EXPECT_THAT(plan->args,
              ElementsAre("--scheduler=10.0.0.1:7000", "--listen", "tcp://*:7100", "--advertise-host", "a"));
  plan = PlanRun({"--role=worker", "--rank", "1", "--dry-run"}, env, "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->dry_run);
  EXPECT_THAT(plan->args, ElementsAre("--scheduler", "job-scheduler-0:9091", "--rank", "1"));
}

TEST(RunPlanTest, Ipv6SchedulerHostGetsBrackets) {
  Env env = Mx("worker");
  env["DMLC_PS_ROOT_URI"] = "fd00::1";
  env["DMLC_WORKER_ID"] = "0";
  EXPECT_THAT(PlanRun({}, env, "h")->args, ElementsAre("--scheduler", "[fd00::1]:9091", "--rank", "0"));
}

TEST(RunPlanTest, ErrorsNameTheVariable) {
  EXPECT_THAT(PlanRun({}, {}, "h").status().message(), HasSubstr("DMLC_ROLE"));
  EXPECT_THAT(PlanRun({}, {{"DMLC_ROLE", "ps"}}, "h").status().message(), HasSubstr("'ps'"));
  EXPECT_THAT(PlanRun({}, {{"DMLC_ROLE", "scheduler"}}, "h").status().message(), HasSubstr("DMLC_PS_ROOT_PORT"));
  Env env = Mx("scheduler");
  env["DMLC_PS_ROOT_PORT"] = "70000";
  EXPECT_THAT(PlanRun({}, env, "h").status().message(), HasSubstr("DMLC_PS_ROOT_PORT=70000"));
  env = Mx("scheduler");
  env["DMLC_NUM_WORKER"] = "two";
  EXPECT_THAT(PlanRun({}, env, "h").status().message(), HasSubstr("DMLC_NUM_WORKER=two"));
  EXPECT_THAT(PlanRun({}, Mx("worker"), "h").status().message(), HasSubstr("JOB_COMPLETION_INDEX"));
  env = Mx("worker");
  env["MX_CONFIG"] = "{not json";
  EXPECT_THAT(PlanRun({}, env, "h").status().message(), HasSubstr("MX_CONFIG"));
  env = Mx("server");
  env.erase("DMLC_PS_ROOT_URI");
  EXPECT_THAT(PlanRun({}, env, "h").status().message(), HasSubstr("DMLC_PS_ROOT_URI"));
  EXPECT_THAT(PlanRun({"--role"}, {}, "h").status().message(), HasSubstr("--role"));
}

TEST(RunPlanTest, HelpNeedsNoEnvironment) {
  auto plan = PlanRun({"--help"}, {}, "h");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->help);
}

}  // namespace
}  // namespace shardps
