// How many file descriptors this process may still open, checked before the
// calls that cannot fail cleanly without them: libzmq asserts (an abort,
// "Too many open files (src/epoll.cpp:65)") when a context's first socket
// starts its threads and their epoll and mailbox descriptors cannot be made,
// and a server short of descriptors takes no connection while its peers
// wait for it. Thread-safe; other threads opening descriptors meanwhile can
// still take what a check found free (the check is a probe, not a reservation).
#ifndef SHARDPS_COMMON_FILE_DESCRIPTORS_H_
#define SHARDPS_COMMON_FILE_DESCRIPTORS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardps {

// OK when `needed` more descriptors can be opened now. Below that, and the
// soft RLIMIT_NOFILE is under the hard one, the soft limit is raised (to the
// hard one at most) first. Otherwise RESOURCE_EXHAUSTED: "`who`: too few file
// descriptors ...", with how many are free, the limits and how to raise them.
absl::Status EnsureFreeDescriptors(int needed, absl::string_view who);

}  // namespace shardps

#endif  // SHARDPS_COMMON_FILE_DESCRIPTORS_H_
