#include "tools/local_cluster.h"

#include <gtest/gtest.h>

namespace shardps {
namespace {

// `shardps local` and `launch` put every process on 127.0.0.1, and a
// server's data port keeps limits.max_connections_per_address (64) open from
// one address: a job of more than 32 processes had its later connections
// closed as they came.
TEST(LoadLocalConfigTest, APerAddressLimitTooSmallForEveryProcessOnOneHostIsRaised) {
  auto small = LoadLocalConfig("", 2, 4);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->limits().max_connections_per_address(), 64u);
  EXPECT_FALSE(small->limits().has_max_connections_per_address());
  auto large = LoadLocalConfig("", 4, 60);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->limits().max_connections_per_address(), 2u * 64 + 8);
}

}  // namespace
}  // namespace shardps
