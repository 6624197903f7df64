#include "common/cgroup_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace shardps {
namespace {

// A fake /proc/self/cgroup and cgroup mount under a temporary directory.
class CgroupMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("cgroup-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "root");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void ProcCgroup(const std::string& text) { Write("proc", text); }
  // Writes `value` to root/`file` (its directories made).
  void Set(const std::string& file, const std::string& value) {
    std::filesystem::create_directories((dir_ / "root" / file).parent_path());
    Write("root/" + file, value + "\n");
  }
  std::optional<uint64_t> Left() { return CgroupMemoryLeft((dir_ / "proc").string(), (dir_ / "root").string()); }

 private:
  void Write(const std::string& file, const std::string& text) { std::ofstream(dir_ / file) << text; }
  std::filesystem::path dir_;
};

TEST_F(CgroupMemoryTest, V2LimitLessUsageAndTheTightestAncestorBinds) {
  ProcCgroup("0::/system.slice/shardps-server@7001.service\n");
  Set("cgroup.controllers", "cpu memory");
  Set("system.slice/shardps-server@7001.service/memory.max", "4294967296");
  Set("system.slice/shardps-server@7001.service/memory.current", "294967296");
  EXPECT_EQ(Left(), 4000000000u);
  Set("system.slice/memory.max", "2000000000");
  Set("system.slice/memory.current", "1000000000");
  EXPECT_EQ(Left(), 1000000000u) << "the slice's limit binds";
}

TEST_F(CgroupMemoryTest, NoLimitIsNone) {
  ProcCgroup("0::/user.slice\n");
  Set("cgroup.controllers", "memory");
  Set("user.slice/memory.max", "max");
  Set("user.slice/memory.current", "123");
  EXPECT_EQ(Left(), std::nullopt);
  ProcCgroup("");
  EXPECT_EQ(Left(), std::nullopt);
}

TEST_F(CgroupMemoryTest, V1MemoryHierarchyOfAHybridLayout) {
  ProcCgroup("9:pids:/\n4:memory:/kubepods/pod1/abc\n0::/\n");
  Set("unified/cgroup.controllers", "");
  Set("memory/memory.limit_in_bytes", "9223372036854771712");  // the v1 root: no limit
  Set("memory/kubepods/pod1/abc/memory.limit_in_bytes", "1073741824");
  Set("memory/kubepods/pod1/abc/memory.usage_in_bytes", "73741824");
  EXPECT_EQ(Left(), 1000000000u);
}

TEST_F(CgroupMemoryTest, AContainerReadsItsOwnCgroupMountedAtTheTop) {
  // Without a cgroup namespace the path is the host's, absent in the
  // container's mount, whose top is the container's own cgroup.
  ProcCgroup("0::/kubepods.slice/pod2/cri-containerd-1.scope\n");
  Set("cgroup.controllers", "memory");
  Set("memory.max", "536870912");
  Set("memory.current", "36870912");
  EXPECT_EQ(Left(), 500000000u);
}

TEST_F(CgroupMemoryTest, InactivePageCacheTheKernelReclaimsCountsAsLeft) {
  // A Slurm job's or a pod's cgroup is charged for the files its processes
  // read (a data set staged next to the server): usage counts that cache,
  // which the kernel reclaims before it kills anything.
  ProcCgroup("0::/job\n");
  Set("cgroup.controllers", "memory");
  Set("job/memory.max", "1000");
  Set("job/memory.current", "900");
  Set("job/memory.stat", "anon 300\nfile 600\nactive_file 100\ninactive_file 500");
  EXPECT_EQ(Left(), 600u);
  ProcCgroup("4:memory:/job\n");
  Set("memory/job/memory.limit_in_bytes", "1000");
  Set("memory/job/memory.usage_in_bytes", "900");
  Set("memory/job/memory.stat", "cache 600\ninactive_file 500\ntotal_cache 600\ntotal_inactive_file 500");
  EXPECT_EQ(Left(), 600u) << "cgroup v1";
}

TEST_F(CgroupMemoryTest, UsageAboveTheLimitLeavesNothing) {
  ProcCgroup("0::/a\n");
  Set("cgroup.controllers", "memory");
  Set("a/memory.max", "100");
  Set("a/memory.current", "150");
  EXPECT_EQ(Left(), 0u);
}

}  // namespace
}  // namespace shardps
