// Test helper: collects the WARNING lines this process logs (glog) while it
// lives, for tests that check what a component says.
#ifndef SHARDPS_COMMON_WARNING_LINES_TEST_UTIL_H_
#define SHARDPS_COMMON_WARNING_LINES_TEST_UTIL_H_

#include <glog/logging.h>

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace shardps {

class WarningLines : public google::LogSink {
 public:
  WarningLines() { google::AddLogSink(this); }
  ~WarningLines() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t length) override {
    if (severity != google::GLOG_WARNING) return;
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }
  std::string Joined() {
    absl::MutexLock lock(&mu_);
    return absl::StrJoin(lines_, "\n");
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardps

#endif  // SHARDPS_COMMON_WARNING_LINES_TEST_UTIL_H_
