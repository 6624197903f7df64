// DeviceThread: the one thread that runs a Device's work items in FIFO order.
//
// Ownership: owns its std::thread; the destructor runs every queued item, then
// joins. Thread safety: Submit may be called from any thread.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_THREAD_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_THREAD_H_

#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace shardps {

class DeviceThread {
 public:
  // Starts the thread; `bind` (may be empty) runs on it before any work item,
  // e.g. to select the GPU.
  explicit DeviceThread(std::function<void()> bind);
  ~DeviceThread();
  DeviceThread(const DeviceThread&) = delete;
  DeviceThread& operator=(const DeviceThread&) = delete;

  // Queues `work`; the future yields its status once it has run.
  std::future<absl::Status> Submit(std::function<absl::Status()> work);

 private:
  void Loop(std::function<void()> bind);
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Mutex mu_;
  std::deque<std::packaged_task<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_THREAD_H_
