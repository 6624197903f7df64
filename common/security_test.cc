#include "common/security.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

// Files written by the test, removed when it ends.
class SecurityCredentialsTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string WriteTemp(const std::string& name, const std::string& content) {
    std::filesystem::create_directories(dir_);
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    return path;
  }
  const std::string dir_ = std::filesystem::temp_directory_path() / absl::StrCat("security-test-", getpid());
};

TEST_F(SecurityCredentialsTest, DisabledNeedsNothing) {
  auto creds = LoadSecurityCredentials(SecurityConfig(), /*for_scheduler=*/true);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_FALSE(creds->enabled);
}

TEST_F(SecurityCredentialsTest, ShortTokenIsRefused) {
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token("short");
  config.set_tls_ca_file(WriteTemp("ca", "x"));
  auto creds = LoadSecurityCredentials(config, false);
  ASSERT_FALSE(creds.ok());
  EXPECT_THAT(creds.status().message(), HasSubstr("at least 16"));
}

TEST_F(SecurityCredentialsTest, TokenFileLosesItsTrailingNewline) {
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token_file(WriteTemp("token", "0123456789abcdef0123\n"));
  config.set_tls_ca_file(WriteTemp("ca", "x"));
  auto creds = LoadSecurityCredentials(config, false);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_EQ(creds->token, "0123456789abcdef0123");
}

TEST_F(SecurityCredentialsTest, SchedulerWithoutCertificateNamesTheField) {
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token("0123456789abcdef0123");
  config.set_tls_ca_file(WriteTemp("ca", "x"));
  auto creds = LoadSecurityCredentials(config, /*for_scheduler=*/true);
  ASSERT_FALSE(creds.ok());
  EXPECT_THAT(creds.status().message(), HasSubstr("security.tls_cert_file is required"));
}

TEST_F(SecurityCredentialsTest, MissingFileIsNamed) {
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token("0123456789abcdef0123");
  config.set_tls_ca_file("/nonexistent/ca.pem");
  auto creds = LoadSecurityCredentials(config, false);
  ASSERT_FALSE(creds.ok());
  EXPECT_THAT(creds.status().message(), HasSubstr("security.tls_ca_file"));
  EXPECT_THAT(creds.status().message(), HasSubstr("/nonexistent/ca.pem"));
}

TEST_F(SecurityCredentialsTest, OnlyTheSchedulerReadsTheAcceptedTokens) {
  // One config file for every node, the scheduler's rotation files on the
  // scheduler's host alone.
  SecurityConfig config;
  config.set_enabled(true);
  config.set_token("0123456789abcdef0123");
  config.set_tls_ca_file(WriteTemp("ca", "x"));
  config.set_tls_cert_file(WriteTemp("cert", "x"));
  config.set_tls_key_file(WriteTemp("key", "x"));
  config.add_accepted_token_files(dir_ + "/token.next");
  auto node = LoadSecurityCredentials(config, /*for_scheduler=*/false);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->accepted_tokens.empty());
  auto scheduler = LoadSecurityCredentials(config, /*for_scheduler=*/true);
  ASSERT_FALSE(scheduler.ok());
  EXPECT_THAT(scheduler.status().message(), HasSubstr("token.next"));
  WriteTemp("token.next", "abcdef0123456789abcd\n");
  scheduler = LoadSecurityCredentials(config, /*for_scheduler=*/true);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  EXPECT_EQ(scheduler->accepted_tokens, std::vector<std::string>{"abcdef0123456789abcd"});
}

TEST(CurveKeysTest, ClientRefusesAMalformedServerKey) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  EXPECT_FALSE(MakeCurveClient(socket, "too-short").ok());
  auto keys = NewCurveKeyPair();
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(keys->public_key.size(), 40u);
  EXPECT_TRUE(MakeCurveClient(socket, keys->public_key).ok());
}

}  // namespace
}  // namespace shardps
