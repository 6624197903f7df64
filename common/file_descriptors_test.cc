#include "common/file_descriptors.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardps {
namespace {

// In a child: RLIMIT_NOFILE soft at the lowest free descriptor plus `soft_free`,
// hard plus `hard_free`; then EnsureFreeDescriptors(8, "node 1").
void CheckUnder(int soft_free, int hard_free) {
  const int next = dup(0);
  close(next);
  const rlimit limit{static_cast<rlim_t>(next + soft_free), static_cast<rlim_t>(next + hard_free)};
  setrlimit(RLIMIT_NOFILE, &limit);
  absl::Status s = EnsureFreeDescriptors(8, "node 1");
  fprintf(stderr, "%s\n", s.ToString().c_str());
  exit(s.ok() ? 0 : 1);
}

TEST(FileDescriptorsTest, TooFewFreeDescriptorsAreRefusedNamingTheNodeAndTheLimits) {
  EXPECT_EXIT(CheckUnder(3, 3), ::testing::ExitedWithCode(1),
              "RESOURCE_EXHAUSTED: node 1: too few file descriptors: needs 8 free, [0-9] can be opened "
              "\\(RLIMIT_NOFILE soft [0-9]+, hard [0-9]+\\)");
}

TEST(FileDescriptorsTest, ASoftLimitBelowTheHardOneIsRaisedInstead) {
  EXPECT_EXIT(CheckUnder(3, 100), ::testing::ExitedWithCode(0), "OK");
}

}  // namespace
}  // namespace shardps
