#include "compression/codec_params.h"

#include "compression/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

using ::testing::HasSubstr;

TEST(CodecParamsTest, ParsesEveryCodecWithDefaults) {
  for (const std::string& name : CodecNames()) {
    auto params = ParseCodecSpec(name);
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_EQ(params->name, name);
    EXPECT_TRUE(CreateCodec(*params).ok());
  }
}

TEST(CodecParamsTest, ParsesParameters) {
  auto p = ParseCodecSpec("randomk:ratio=0.25,unbiased=0,threads=3");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->ratio, 0.25f);
  EXPECT_FALSE(p->unbiased);
  EXPECT_EQ(p->num_threads, 3);
  auto t = ParseCodecSpec("2bit:threshold=0.125");
  ASSERT_TRUE(t.ok());
  EXPECT_FLOAT_EQ(t->threshold, 0.125f);
}

TEST(CodecParamsTest, ToStringRoundTrips) {
  for (const char* spec : {"none", "2bit:threshold=0.25", "topk:ratio=0.001,threads=2",
                           "randomk:ratio=0.5,unbiased=0"}) {
    auto p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok()) << spec;
    auto again = ParseCodecSpec(p->ToString());
    ASSERT_TRUE(again.ok()) << p->ToString();
    EXPECT_EQ(again->ToString(), p->ToString());
  }
}

TEST(CodecParamsTest, UnknownCodecListsKnownOnes) {
  auto p = ParseCodecSpec("3bit:threshold=1");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("\"3bit\""));
  EXPECT_THAT(p.status().message(), HasSubstr("none, fp16, bf16, 2bit, onebit, topk, randomk"));
}

TEST(CodecParamsTest, UnknownKeyNamesPartAndAllowedKeys) {
  auto p = ParseCodecSpec("topk:ratio=0.1,thresh=2");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("\"thresh=2\""));
  EXPECT_THAT(p.status().message(), HasSubstr("ratio, threads"));
}

TEST(CodecParamsTest, RejectsBadValues) {
  for (const char* spec : {"2bit:threshold=abc", "2bit:threshold=-1", "2bit:threshold=nan",
                           "2bit:threshold=inf", "topk:ratio=0", "topk:ratio=1.5",
                           "randomk:unbiased=2", "fp16:threads=-1", "topk:ratio", "onebit:"}) {
    auto p = ParseCodecSpec(spec);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(p.status().message(), HasSubstr(spec)) << p.status();
  }
}

}  // namespace
}  // namespace shardps::compression
