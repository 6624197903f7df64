#include "worker/local_tier/device_thread.h"

#include <utility>

namespace shardps {

DeviceThread::DeviceThread(std::function<void()> bind)
    : thread_([this, bind = std::move(bind)]() mutable { Loop(std::move(bind)); }) {}

DeviceThread::~DeviceThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::future<absl::Status> DeviceThread::Submit(std::function<absl::Status()> work) {
  std::packaged_task<absl::Status()> task(std::move(work));
  std::future<absl::Status> done = task.get_future();
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  return done;
}

void DeviceThread::Loop(std::function<void()> bind) {
  if (bind) bind();
  while (true) {
    std::packaged_task<absl::Status()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &DeviceThread::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping_ and drained.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace shardps
