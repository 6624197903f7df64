#include "common/logging.h"

#include <glog/logging.h>

namespace shardps {

void InitLogging(const char* argv0, bool verbose) {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = verbose ? google::GLOG_INFO : google::GLOG_WARNING;
  static bool initialized = false;
  if (!initialized) {
    google::InitGoogleLogging(argv0);
    initialized = true;
  }
}

}  // namespace shardps
