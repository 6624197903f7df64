#include "common/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DefaultsAreValid) { EXPECT_TRUE(ValidateConfig(ClusterConfig()).ok()); }

TEST(ConfigTest, SwitchingToAsyncIsOneWord) {
  auto config = ParseConfigText("consistency: ASYNC num_workers: 4", "test");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->consistency(), ASYNC);
  EXPECT_TRUE(ValidateConfig(*config).ok());
}

TEST(ConfigTest, UnknownEnumNamesTheFieldAndLine) {
  auto config = ParseConfigText("num_workers: 2\nconsistency: BSP", "cluster.pbtxt");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("cluster.pbtxt"));
  EXPECT_THAT(config.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(config.status().message(), HasSubstr("BSP"));
}

TEST(ConfigTest, OverrideRejectsBadEnumListingAllowedValues) {
  ClusterConfig config;
  absl::Status s = SetConfigField(&config, "consistency=bsp");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("consistency"));
  EXPECT_THAT(s.message(), HasSubstr("sync, async"));
}

TEST(ConfigTest, OverrideSetsNestedFields) {
  ClusterConfig config;
  ASSERT_TRUE(SetConfigField(&config, "optimizer.learning_rate=0.25").ok());
  ASSERT_TRUE(SetConfigField(&config, "optimizer.kind=adam").ok());
  ASSERT_TRUE(SetConfigField(&config, "consistency=async").ok());
  EXPECT_FLOAT_EQ(config.optimizer().learning_rate(), 0.25f);
  EXPECT_EQ(config.optimizer().kind(), OptimizerConfig::ADAM);
  EXPECT_EQ(config.consistency(), ASYNC);
}

TEST(ConfigTest, OverrideRejectsUnknownFieldAndBadNumber) {
  ClusterConfig config;
  EXPECT_THAT(SetConfigField(&config, "optimiser.lr=1").message(), HasSubstr("unknown config field"));
  EXPECT_THAT(SetConfigField(&config, "num_workers=two").message(), HasSubstr("not an unsigned integer"));
  EXPECT_THAT(SetConfigField(&config, "num_workers").message(), HasSubstr("field=value"));
}

TEST(ConfigTest, ReadsOneFieldByPathWithDefaultsForUnsetFields) {
  ClusterConfig config;
  ASSERT_TRUE(SetConfigField(&config, "optimizer.kind=adam").ok());
  ASSERT_TRUE(SetConfigField(&config, "optimizer.learning_rate=0.25").ok());
  ASSERT_TRUE(SetConfigField(&config, "compression.codec=2bit:scale=0.5").ok());
  (*config.mutable_compression()->mutable_tensor_codecs())["fc2.weight"] = "topk:k=0.01";
  (*config.mutable_compression()->mutable_tensor_codecs())["fc1.weight"] = "fp16";
  EXPECT_EQ(*GetConfigField(config, "optimizer.kind"), "ADAM");
  EXPECT_EQ(*GetConfigField(config, "optimizer.learning_rate"), "0.25");
  EXPECT_EQ(*GetConfigField(config, "consistency"), "SYNC");  // unset: its default
  EXPECT_EQ(*GetConfigField(config, "optimizer.freeze_variance_after"), "0");
  EXPECT_EQ(*GetConfigField(config, "compression.codec"), "2bit:scale=0.5");
  EXPECT_EQ(*GetConfigField(config, "compression.tensor_codecs"), "fc1.weight=fp16\nfc2.weight=topk:k=0.01\n");
  EXPECT_THAT(*GetConfigField(config, "optimizer"), HasSubstr("learning_rate: 0.25"));
  EXPECT_THAT(GetConfigField(config, "optimiser.kind").status().message(), HasSubstr("unknown config field"));
  EXPECT_THAT(GetConfigField(config, "num_workers.x").status().message(), HasSubstr("not a message"));
  // A read never creates the messages on its path.
  EXPECT_TRUE(GetConfigField(config, "checkpoint.dir").ok());
  EXPECT_FALSE(config.has_checkpoint());
  // A flag still cannot set the map.
  EXPECT_THAT(SetConfigField(&config, "compression.tensor_codecs=x").message(), HasSubstr("unknown config field"));
  // Other repeated fields: one element a line (a read of one used to end
  // the process in protobuf's checks).
  EXPECT_EQ(*GetConfigField(config, "security.accepted_tokens"), "");
  config.mutable_security()->add_accepted_tokens("first-token-0123456789");
  config.mutable_security()->add_accepted_tokens("second-token-0123456789");
  EXPECT_EQ(*GetConfigField(config, "security.accepted_tokens"), "first-token-0123456789\nsecond-token-0123456789\n");
  EXPECT_THAT(SetConfigField(&config, "security.accepted_tokens=x").message(), HasSubstr("unknown config field"));
}

TEST(ConfigTest, ValidationNamesTheField) {
  ClusterConfig config;
  config.mutable_optimizer()->set_learning_rate(-1);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("optimizer.learning_rate"));
  config = ClusterConfig();
  config.set_partition_bytes(6);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("partition_bytes"));
  config = ClusterConfig();
  config.set_num_servers(0);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("num_servers"));
  config = ClusterConfig();
  config.set_consistency(ASYNC);
  config.set_deterministic(true);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("deterministic"));
  config = ClusterConfig();
  config.mutable_optimizer()->mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  config.mutable_optimizer()->mutable_schedule()->set_gamma(1.5);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("gamma"));
}

TEST(ConfigTest, FreezingTheVarianceNeedsAdam) {
  ClusterConfig c;
  c.mutable_optimizer()->set_freeze_variance_after(100);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.mutable_optimizer()->set_kind(OptimizerConfig::MOMENTUM);
  absl::Status s = ValidateConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr("optimizer.freeze_variance_after"));
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadConfigFile("/nonexistent/cluster.pbtxt").status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, CheckpointsAreRefusedWhereTheServersDoNotHoldTheWholeState) {
  ClusterConfig config;
  config.mutable_checkpoint()->set_dir("/ckpt");
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("checkpoint.every_rounds"));
  config.mutable_checkpoint()->set_every_rounds(10);
  EXPECT_TRUE(ValidateConfig(config).ok());
  ClusterConfig async = config;
  async.set_consistency(ASYNC);
  EXPECT_THAT(ValidateConfig(async).message(), HasSubstr("in async is written on request only"));
  EXPECT_TRUE(ValidateCheckpointConfig(async, /*on_request=*/true).ok());
  async.mutable_checkpoint()->clear_dir();
  async.mutable_checkpoint()->clear_every_rounds();
  async.mutable_checkpoint()->set_restore_dir("/ckpt");
  async.mutable_checkpoint()->set_restore_round(10);
  EXPECT_TRUE(ValidateConfig(async).ok()) << "an async checkpoint is restored like any";
  ClusterConfig ssp = config;
  ssp.set_consistency(SSP);
  ssp.set_staleness(2);
  EXPECT_THAT(ValidateConfig(ssp).message(), HasSubstr("in ssp (applied on arrival) is written on request only"));
  EXPECT_TRUE(ValidateCheckpointConfig(ssp, /*on_request=*/true).ok()) << "written as in async";
  ssp.set_ssp_in_rounds(true);
  EXPECT_THAT(ValidateCheckpointConfig(ssp, /*on_request=*/true).message(), HasSubstr("ssp_in_rounds holds pushes"));
  ssp.set_staleness(0);
  EXPECT_TRUE(ValidateConfig(ssp).ok()) << "ssp with staleness 0 is sync";
  ClusterConfig sum_only = config;
  sum_only.set_update_mode(SUM_ONLY);
  EXPECT_THAT(ValidateConfig(sum_only).message(), HasSubstr("update_mode: sum_only"));
  ClusterConfig compressed = config;
  compressed.mutable_compression()->set_codec("2bit");
  EXPECT_THAT(ValidateConfig(compressed).message(), HasSubstr("compression"));
  ClusterConfig restore;
  restore.mutable_checkpoint()->set_restore_round(10);
  EXPECT_THAT(ValidateConfig(restore).message(), HasSubstr("checkpoint.restore_dir"));
}


}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST(ConfigTest, SspTakesAStalenessBoundAndDeterministicModeInRounds) {
  ClusterConfig config;
  ASSERT_TRUE(SetConfigField(&config, "consistency=ssp").ok());
  ASSERT_TRUE(SetConfigField(&config, "staleness=2").ok());
  EXPECT_TRUE(ValidateConfig(config).ok());
  EXPECT_EQ(StalenessBound(config), 2u);
  EXPECT_FALSE(RoundBased(config)) << "ssp applies pushes as they arrive by default";
  config.set_deterministic(true);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("ssp in rounds"));
  ASSERT_TRUE(SetConfigField(&config, "ssp_in_rounds=true").ok());
  EXPECT_TRUE(ValidateConfig(config).ok());
  EXPECT_TRUE(RoundBased(config));
  config.set_ssp_in_rounds(false);
  config.set_staleness(0);  // behaves as sync
  EXPECT_TRUE(ValidateConfig(config).ok());
  EXPECT_TRUE(RoundBased(config));
  config.set_consistency(ASYNC);
  config.set_deterministic(false);
  config.set_ssp_in_rounds(true);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("ssp_in_rounds"));
}

TEST(ConfigTest, StalenessOutsideSspOrAboveTheLimitIsRefusedNamingTheField) {
  ClusterConfig config;
  config.set_staleness(2);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("staleness"));
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("only to consistency: ssp"));
  config.set_consistency(SSP);
  config.set_staleness(kMaxStaleness + 1);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("at most 256"));
  config.set_staleness(2);
  config.set_update_mode(SUM_ONLY);
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("sum_only applies only to consistency: sync"));
}

TEST(ConfigTest, AsyncAdamAtEightWorkersDropsMomentumUnlessTheUserSetIt) {
  auto config = ParseConfigText("consistency: ASYNC num_workers: 8", "test");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(ApplyAsyncMomentumDefault(&*config), HasSubstr("optimizer.beta1=0"));
  EXPECT_EQ(config->optimizer().beta1(), 0.0f);
  EXPECT_EQ(ApplyAsyncMomentumDefault(&*config), "") << "applied once; the value is now the user's";

  auto mine = ParseConfigText("consistency: ASYNC num_workers: 8", "test");
  ASSERT_TRUE(SetConfigField(&*mine, "optimizer.beta1=0.9").ok());
  EXPECT_EQ(ApplyAsyncMomentumDefault(&*mine), "");
  EXPECT_EQ(mine->optimizer().beta1(), 0.9f);

  for (const char* text : {"consistency: ASYNC num_workers: 4", "consistency: SYNC num_workers: 8",
                           "consistency: SSP staleness: 2 num_workers: 8",
                           "consistency: ASYNC num_workers: 8 optimizer { kind: MOMENTUM }"}) {
    auto other = ParseConfigText(text, "test");
    ASSERT_TRUE(other.ok()) << text;
    EXPECT_EQ(ApplyAsyncMomentumDefault(&*other), "") << text;
    EXPECT_FALSE(other->optimizer().has_beta1()) << text;
    EXPECT_EQ(other->has_optimizer(), absl::StrContains(text, "optimizer")) << text;
  }
}

}  // namespace
}  // namespace shardps
