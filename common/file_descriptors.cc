#include "common/file_descriptors.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

// How many of `needed` descriptors could be opened now (all closed again).
int FreeDescriptors(int needed) {
  std::vector<int> opened;
  opened.reserve(static_cast<size_t>(needed));
  while (static_cast<int>(opened.size()) < needed) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    opened.push_back(fd);
  }
  for (int fd : opened) close(fd);
  return static_cast<int>(opened.size());
}

std::string Limit(rlim_t v) { return v == RLIM_INFINITY ? "unlimited" : absl::StrCat(v); }

}  // namespace

absl::Status EnsureFreeDescriptors(int needed, absl::string_view who) {
  int free = FreeDescriptors(needed);
  if (free >= needed) return absl::OkStatus();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = std::min<rlim_t>(limit.rlim_max, limit.rlim_cur + static_cast<rlim_t>(needed - free) + 64);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
      free = FreeDescriptors(needed);
      if (free >= needed) return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(who, ": too few file descriptors: needs ", needed, " free, ", free,
                   " can be opened (RLIMIT_NOFILE soft ", Limit(limit.rlim_cur), ", hard ", Limit(limit.rlim_max),
                   "); raise the limit (ulimit -n, systemd LimitNOFILE=, a container's nofile ulimit)"));
}

}  // namespace shardps
