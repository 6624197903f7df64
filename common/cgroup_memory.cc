#include "common/cgroup_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardps {
namespace {

// A v1 limit this large is "no limit" (the kernel's page-rounded LONG_MAX).
constexpr uint64_t kUnlimited = uint64_t{1} << 62;

// The number in file `path`; nullopt when it is missing, "max" or not a number.
std::optional<uint64_t> ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;  // "max"
  return value;
}

// The value of `key` in memory.stat file `path`; 0 when it is not there.
uint64_t StatBytes(const std::filesystem::path& path, const char* key) {
  std::ifstream in(path);
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return 0;
}

// The least `limit_file` less `usage_file` over `dir` and its ancestors up
// to `top` (included). The usage counts the page cache of the files the
// cgroup's processes read; its inactive part (`inactive_key` of memory.stat)
// the kernel reclaims before it kills anything, so it is not taken as used
// (as the kubelet's working set does).
std::optional<uint64_t> LeftFrom(std::filesystem::path dir, const std::filesystem::path& top,
                                 const char* limit_file, const char* usage_file, const char* inactive_key) {
  std::optional<uint64_t> left;
  for (;;) {
    if (std::optional<uint64_t> limit = ReadBytes(dir / limit_file); limit && *limit < kUnlimited) {
      const uint64_t usage = ReadBytes(dir / usage_file).value_or(0);
      const uint64_t used = usage - std::min(usage, StatBytes(dir / "memory.stat", inactive_key));
      const uint64_t here = *limit > used ? *limit - used : 0;
      left = left ? std::min(*left, here) : here;
    }
    if (dir == top || !dir.has_relative_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return left;
}

}  // namespace

std::optional<uint64_t> CgroupMemoryLeft(const std::string& proc_cgroup, const std::string& root) {
  std::ifstream in(proc_cgroup);
  std::string line;
  std::optional<uint64_t> left;
  auto tighter = [&left](std::optional<uint64_t> found) {
    if (found) left = left ? std::min(*left, *found) : *found;
  };
  while (std::getline(in, line)) {
    // "hierarchy-id:controllers:path"; the path has no ':' of its own to split.
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3 || parts[2].empty() || parts[2][0] != '/') continue;
    const std::string path(absl::StripPrefix(parts[2], "/"));
    std::filesystem::path top;
    const char *limit_file, *usage_file, *inactive_key;
    if (parts[0] == "0" && parts[1].empty()) {  // v2
      top = std::filesystem::path(root);
      if (std::filesystem::exists(top / "unified" / "cgroup.controllers") &&
          !std::filesystem::exists(top / "cgroup.controllers")) {
        top /= "unified";  // the v2 tree of a hybrid layout
      }
      limit_file = "memory.max";
      usage_file = "memory.current";
      inactive_key = "inactive_file";
    } else if (std::vector<std::string> controllers = absl::StrSplit(parts[1], ',');
               std::find(controllers.begin(), controllers.end(), "memory") != controllers.end()) {
      top = std::filesystem::path(root) / "memory";
      limit_file = "memory.limit_in_bytes";
      usage_file = "memory.usage_in_bytes";
      inactive_key = "total_inactive_file";  // with its descendants', as the usage
    } else {
      continue;
    }
    // In a container the path is the host's and the container's own cgroup
    // is mounted at the top: read the top then.
    std::filesystem::path dir = path.empty() ? top : top / path;
    if (!std::filesystem::exists(dir)) dir = top;
    tighter(LeftFrom(dir.lexically_normal(), top.lexically_normal(), limit_file, usage_file, inactive_key));
  }
  return left;
}

}  // namespace shardps
