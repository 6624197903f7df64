// The lossy codecs' accuracy recipe and the combinations refused as known to
// diverge.
#include "compression/codec_policy.h"

#include "absl/strings/match.h"
#include "common/config.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

ClusterConfig WithCodec(const std::string& codec) {
  ClusterConfig c;
  c.set_num_servers(2);
  c.set_num_workers(2);
  c.mutable_compression()->set_codec(codec);
  return c;
}

TEST(CompressionRecipeTest, BareTwoBitWithAdamGetsTheMeasuredRecipe) {
  ClusterConfig c = WithCodec("2bit");
  std::string line = ApplyCompressionRecipe(&c);
  EXPECT_TRUE(absl::StrContains(line, "measured accuracy recipe")) << line;
  EXPECT_EQ(c.update_mode(), SUM_ONLY);
  EXPECT_EQ(c.compression().uncompressed_rounds(), 150u);
  EXPECT_EQ(c.compression().warmup_codec(), "fp16");
  EXPECT_EQ(c.optimizer().freeze_variance_after(), 150u);
  EXPECT_FLOAT_EQ(c.optimizer().epsilon(), 1e-4f);
  EXPECT_EQ(c.compression().codec(), "2bit:scale=1");
  EXPECT_EQ(c.compression().pull_codec(), "onebit");
  EXPECT_TRUE(ValidateConfig(c).ok());
  EXPECT_TRUE(ValidateCompressionConfig(c).ok());
  // A second application (the scheduler after `shardps local`) sets nothing.
  ClusterConfig again = c;
  EXPECT_EQ(ApplyCompressionRecipe(&again), "");
  EXPECT_EQ(again.SerializeAsString(), c.SerializeAsString());
}

TEST(CompressionRecipeTest, FieldsSetByTheUserWin) {
  ClusterConfig c = WithCodec("onebit");
  ASSERT_TRUE(SetConfigField(&c, "optimizer.epsilon=1e-3").ok());
  ASSERT_TRUE(SetConfigField(&c, "compression.warmup_codec=none").ok());
  std::string line = ApplyCompressionRecipe(&c);
  EXPECT_FALSE(absl::StrContains(line, "epsilon")) << line;
  EXPECT_FALSE(absl::StrContains(line, "warmup_codec")) << line;
  EXPECT_FLOAT_EQ(c.optimizer().epsilon(), 1e-3f);
  EXPECT_EQ(c.compression().warmup_codec(), "none");
  EXPECT_EQ(c.update_mode(), SUM_ONLY);
  EXPECT_EQ(c.compression().codec(), "onebit");
  EXPECT_EQ(c.compression().pull_codec(), "none");
  EXPECT_TRUE(ValidateCompressionConfig(c).ok());
}

TEST(CompressionRecipeTest, AConfigTunedByHandIsLeftAsWritten) {
  for (const char* field : {"update_mode=SUM_ONLY", "compression.uncompressed_rounds=300",
                            "optimizer.freeze_variance_after=0"}) {
    ClusterConfig c = WithCodec("2bit");
    ASSERT_TRUE(SetConfigField(&c, field).ok());
    const std::string before = c.SerializeAsString();
    EXPECT_EQ(ApplyCompressionRecipe(&c), "") << field;
    EXPECT_EQ(c.SerializeAsString(), before) << field;
  }
}

TEST(CompressionRecipeTest, TwoBitWithAUserPullCodecUsesTheRawPullScale) {
  ClusterConfig c = WithCodec("2bit");
  c.mutable_compression()->set_pull_codec("none");
  ApplyCompressionRecipe(&c);
  EXPECT_EQ(c.compression().codec(), "2bit:scale=0.25");
  EXPECT_EQ(c.compression().pull_codec(), "none");
  ClusterConfig explicit_params = WithCodec("2bit:threshold=0.1");
  ApplyCompressionRecipe(&explicit_params);
  EXPECT_EQ(explicit_params.compression().codec(), "2bit:threshold=0.1");
}

TEST(CompressionRecipeTest, NothingForLosslessCodecsOrLinearOptimizers) {
  for (const char* codec : {"none", "fp16", "bf16"}) {
    ClusterConfig c = WithCodec(codec);
    const std::string before = c.SerializeAsString();
    EXPECT_EQ(ApplyCompressionRecipe(&c), "") << codec;
    EXPECT_EQ(c.SerializeAsString(), before) << codec;
  }
  ClusterConfig momentum = WithCodec("topk");
  momentum.mutable_optimizer()->set_kind(OptimizerConfig::MOMENTUM);
  const std::string before = momentum.SerializeAsString();
  EXPECT_EQ(ApplyCompressionRecipe(&momentum), "");
  EXPECT_EQ(momentum.SerializeAsString(), before);
}

TEST(CompressionRecipeTest, SaysWhyWhenTheRecipeCannotApply) {
  ClusterConfig async = WithCodec("topk");
  async.set_consistency(ASYNC);
  EXPECT_TRUE(absl::StrContains(ApplyCompressionRecipe(&async), "async")) << ApplyCompressionRecipe(&async);
  EXPECT_FALSE(async.has_update_mode());
  ClusterConfig ssp = WithCodec("2bit");
  ssp.set_consistency(SSP);
  EXPECT_TRUE(absl::StrContains(ApplyCompressionRecipe(&ssp), "under ssp consistency")) << ApplyCompressionRecipe(&ssp);

  ClusterConfig decay = WithCodec("onebit");
  decay.mutable_optimizer()->set_weight_decay(1e-4f);
  EXPECT_TRUE(absl::StrContains(ApplyCompressionRecipe(&decay), "weight_decay"));
  EXPECT_FALSE(decay.has_update_mode());
}

TEST(CompressionRecipeTest, AdaptiveTwoBitOnTheAggregateIsRefused) {
  ClusterConfig c = WithCodec("onebit");
  c.set_update_mode(SUM_ONLY);
  c.mutable_compression()->set_pull_codec("2bit:scale=2");
  absl::Status s = ValidateCompressionConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "diverges")) << s;
  c.mutable_compression()->set_pull_codec("2bit:threshold=0.01");
  EXPECT_TRUE(ValidateCompressionConfig(c).ok());
}

TEST(CodecsForPartitionTest, ACodecDeclaredWithTheTensorOverridesTheConfigs) {
  ClusterConfig c = WithCodec("onebit");
  (*c.mutable_compression()->mutable_tensor_codecs())["t"] = "2bit:threshold=0.5";
  auto configured = CodecsForPartition(c, "t", 4096);
  auto declared = CodecsForPartition(c, "t", 4096, "fp16");
  auto declared_raw = CodecsForPartition(c, "u", 4096, "none");
  ASSERT_TRUE(configured.ok() && declared.ok() && declared_raw.ok());
  EXPECT_EQ(configured->push_spec, "2bit:threshold=0.5");
  EXPECT_EQ(declared->push_spec, "fp16");
  EXPECT_EQ(declared_raw->push, nullptr);
}

TEST(RoundCodecTest, WarmupRoundsTravelInTheWarmupCodecWhereTheLossyOneWouldApply) {
  ClusterConfig c = WithCodec("2bit:scale=1");
  c.set_update_mode(SUM_ONLY);
  c.mutable_compression()->set_pull_codec("onebit");
  c.mutable_compression()->set_uncompressed_rounds(3);
  c.mutable_compression()->set_warmup_codec("fp16");
  ASSERT_TRUE(ValidateCompressionConfig(c).ok());
  auto codecs = CodecsForPartition(c, "t", 4096);
  ASSERT_TRUE(codecs.ok()) << codecs.status();
  for (Direction d : {Direction::kPush, Direction::kAggregate}) {
    const std::string& lossy = d == Direction::kPush ? codecs->push_spec : codecs->pull_spec;
    for (uint64_t round : {0, 2}) {
      WireCodec w = RoundCodec(c, *codecs, d, round);
      EXPECT_EQ(w.spec, "fp16") << round;
      ASSERT_FALSE(w.raw());
      EXPECT_EQ(w.codec->name(), "fp16");
    }
    WireCodec after = RoundCodec(c, *codecs, d, 3);
    EXPECT_EQ(after.spec, lossy);
    EXPECT_EQ(after.codec, d == Direction::kPush ? codecs->push.get() : codecs->pull.get());
  }
}

TEST(RoundCodecTest, WithoutAWarmupCodecOrALossyCodecTheRoundIsRaw) {
  ClusterConfig c = WithCodec("onebit");
  c.mutable_compression()->set_uncompressed_rounds(3);
  auto codecs = CodecsForPartition(c, "t", 4096);
  ASSERT_TRUE(codecs.ok());
  EXPECT_TRUE(RoundCodec(c, *codecs, Direction::kPush, 0).raw());  // warmup_codec none
  EXPECT_EQ(RoundCodec(c, *codecs, Direction::kPush, 0).spec, "");
  c.mutable_compression()->set_warmup_codec("bf16");
  codecs = CodecsForPartition(c, "t", 4096);
  ASSERT_TRUE(codecs.ok());
  EXPECT_EQ(RoundCodec(c, *codecs, Direction::kPush, 0).spec, "bf16");
  EXPECT_TRUE(RoundCodec(c, *codecs, Direction::kAggregate, 0).raw());  // pull_codec none stays raw
  auto small = CodecsForPartition(c, "t", 64);  // below onebit's and bf16's minimum size
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(RoundCodec(c, *small, Direction::kPush, 0).raw());
}

TEST(RoundCodecTest, OnlyHalfPrecisionWarmupCodecsAreAccepted) {
  for (const char* ok : {"none", "fp16", "bf16"}) {
    ClusterConfig c = WithCodec("2bit");
    c.mutable_compression()->set_warmup_codec(ok);
    EXPECT_TRUE(ValidateCompressionConfig(c).ok()) << ok;
  }
  for (const char* bad : {"onebit", "2bit", "topk", "zip"}) {
    ClusterConfig c = WithCodec("2bit");
    c.mutable_compression()->set_warmup_codec(bad);
    absl::Status s = ValidateCompressionConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "compression.warmup_codec")) << s;
    if (std::string(bad) != "zip") {
      EXPECT_TRUE(absl::StrContains(s.message(), "allowed: none, fp16, bf16")) << s;
    }
  }
}

}  // namespace
}  // namespace shardps::compression
