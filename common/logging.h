// Process-wide logging set-up, called once from main().
#ifndef SHARDPS_COMMON_LOGGING_H_
#define SHARDPS_COMMON_LOGGING_H_

namespace shardps {

// glog to stderr (never to files in /tmp), INFO and above unless `verbose` is
// false, in which case WARNING and above.
void InitLogging(const char* argv0, bool verbose);

}  // namespace shardps

#endif  // SHARDPS_COMMON_LOGGING_H_
