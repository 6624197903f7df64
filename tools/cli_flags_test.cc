#include "tools/cli_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CliFlagsTest, ParsesSpaceAndEqualsFormsAndBareBooleans) {
  int64_t servers = 1;
  std::string consistency = "sync";
  bool json = false;
  std::vector<std::string> sets;
  CliFlags flags("local");
  flags.Int("servers", &servers, "");
  flags.String("consistency", &consistency, "");
  flags.Bool("json", &json, "");
  flags.Repeated("set", &sets, "");
  ASSERT_TRUE(flags.Parse({"--servers", "3", "--consistency=async", "--json", "--set", "a=1", "--set=b=2"}).ok());
  EXPECT_EQ(servers, 3);
  EXPECT_EQ(consistency, "async");
  EXPECT_TRUE(json);
  EXPECT_EQ(sets, (std::vector<std::string>{"a=1", "b=2"}));
}

TEST(CliFlagsTest, ErrorsNameTheFlag) {
  int64_t servers = 1;
  CliFlags flags("local");
  flags.Int("servers", &servers, "");
  EXPECT_THAT(flags.Parse({"--servers", "two"}).message(), HasSubstr("--servers: 'two' is not an integer"));
  // The caller prefixes "shardps local: "; the message does not repeat the command.
  EXPECT_THAT(std::string(flags.Parse({"--srevers", "2"}).message()), StartsWith("unknown flag --srevers"));
  EXPECT_THAT(flags.Parse({"--servers"}).message(), HasSubstr("needs a value"));
  EXPECT_THAT(flags.Parse({"stray"}).message(), HasSubstr("unexpected argument 'stray'"));
}

TEST(CliFlagsTest, ACountIsAnIntegerOfZeroOrMore) {
  int64_t limit = 7;
  CliFlags flags("local");
  flags.Count("train-limit", &limit, "");
  EXPECT_TRUE(flags.Parse({"--train-limit", "0"}).ok());
  EXPECT_EQ(limit, 0);
  EXPECT_THAT(flags.Parse({"--train-limit", "-5"}).message(), HasSubstr("--train-limit: -5 is below 0"));
  EXPECT_THAT(flags.Parse({"--train-limit", "x"}).message(), HasSubstr("--train-limit: 'x' is not an integer"));
}

}  // namespace
}  // namespace shardps
