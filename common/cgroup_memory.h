// The memory a cgroup leaves a process: containers (Kubernetes limits),
// systemd units (MemoryMax) and Slurm jobs (--mem) bound a process's memory
// by its cgroup, which neither the machine's physical memory nor RLIMIT_AS
// tells.
#ifndef SHARDPS_COMMON_CGROUP_MEMORY_H_
#define SHARDPS_COMMON_CGROUP_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace shardps {

// Bytes the memory cgroup of this process leaves above what it uses now:
// the least, over the cgroup and each ancestor with a limit, of the limit
// less the usage (cgroup v2: memory.max and memory.current; v1:
// memory.limit_in_bytes and memory.usage_in_bytes), the usage without the
// inactive page cache the kernel would reclaim (memory.stat's
// inactive_file; v1 total_inactive_file). nullopt when no limit
// is set or none can be read. `proc_cgroup` (what /proc/self/cgroup holds)
// and `root` (where the hierarchies are mounted) are parameters for tests.
std::optional<uint64_t> CgroupMemoryLeft(const std::string& proc_cgroup = "/proc/self/cgroup",
                                         const std::string& root = "/sys/fs/cgroup");

}  // namespace shardps

#endif  // SHARDPS_COMMON_CGROUP_MEMORY_H_
