#include "common/endpoint.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(EndpointTest, ParsesHostPortAndBracketedIpv6) {
  auto e = ParseHostPort("127.0.0.1:7000", "--listen");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 7000);
  auto v6 = ParseTcpEndpoint("tcp://[::1]:65535", "data address");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
}

TEST(EndpointTest, PortOutOfRangeIsAnErrorNamingTheFlag) {
  auto e = ParseHostPort("127.0.0.1:99999", "--listen", {.allow_port_zero = true, .allow_wildcard = true});
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("--listen"));
  EXPECT_THAT(e.status().message(), HasSubstr("99999"));
  for (const char* bad : {"host:", "host:-1", "host:+80", "host:80x", ":80", "host", "1:2:3:4", "a b:80"}) {
    EXPECT_FALSE(ParseHostPort(bad, "x").ok()) << bad;
  }
}

TEST(EndpointTest, AHostPortWithASchemeIsToldToDropIt) {
  for (const char* bad : {"tcp://127.0.0.1:7000", "http://127.0.0.1:7000"}) {
    auto e = ParseHostPort(bad, "scheduler address");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_THAT(e.status().message(), HasSubstr("no scheme: write 127.0.0.1:7000")) << e.status();
    EXPECT_THAT(e.status().message(), ::testing::Not(HasSubstr("IPv6"))) << e.status();
  }
}

TEST(EndpointTest, PortZeroAndWildcardOnlyWhereAllowed) {
  EXPECT_FALSE(ParseHostPort("127.0.0.1:0", "x").ok());
  EXPECT_TRUE(ParseHostPort("127.0.0.1:0", "x", {.allow_port_zero = true}).ok());
  EXPECT_FALSE(ParseTcpEndpoint("tcp://*:5000", "x").ok());
  EXPECT_TRUE(ParseTcpEndpoint("tcp://*:0", "x", {.allow_port_zero = true, .allow_wildcard = true}).ok());
  EXPECT_FALSE(ParseTcpEndpoint("not-an-endpoint", "x").ok());
  EXPECT_FALSE(ParseTcpEndpoint("ipc:///tmp/x", "x").ok());
}

TEST(EndpointTest, UnresolvableHostIsNamed) {
  EXPECT_TRUE(CheckResolvable("127.0.0.1", "x").ok());
  EXPECT_TRUE(CheckResolvable("localhost", "x").ok());
  absl::Status s = CheckResolvable("no-such-host.invalid", "data address");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no-such-host.invalid"));
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST(EndpointTest, ReachableOnlyWhereSomeoneListens) {
  // A port nobody listens on: refused at once.
  auto closed = ParseHostPort("127.0.0.1:1", "x");
  ASSERT_TRUE(closed.ok());
  absl::Status s = CheckReachable(*closed, absl::Seconds(1), "server data address");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr("127.0.0.1:1 is not reachable"));
}

// In a child: CheckReachable with no descriptor left; exits 0 when the
// error blames this process.
void CheckReachableWithNoDescriptorLeft() {
  const int next = dup(0);
  close(next);
  const rlimit none{static_cast<rlim_t>(next), static_cast<rlim_t>(next)};
  setrlimit(RLIMIT_NOFILE, &none);
  const Endpoint closed{"127.0.0.1", 1};
  absl::Status s = CheckReachable(closed, absl::Seconds(1), "server data address");
  fprintf(stderr, "%s\n", s.ToString().c_str());
  const bool here = absl::IsResourceExhausted(s) && absl::StrContains(s.message(), "no file descriptor left here");
  exit(here ? 0 : 1);
}

TEST(EndpointTest, AnAddressCheckedWithNoDescriptorLeftBlamesThisProcessNotTheAddress) {
  // The scheduler out of descriptors told a server "server data address ...
  // is not reachable: Too many open files ... does --advertise-host name this
  // host?", and the server gave up (chaos17).
  EXPECT_EXIT(CheckReachableWithNoDescriptorLeft(), ::testing::ExitedWithCode(0), "RESOURCE_EXHAUSTED");
}

}  // namespace
}  // namespace shardps
