// LocalThreadPool: a fixed set of threads that, together with the calling
// thread, runs the tasks of one ParallelFor at a time. Used by the CPU local
// reducer to sum chunks on all cores.
//
// Ownership: owns its helper threads; the destructor joins them.
// Thread safety: ParallelFor may be called from any thread; concurrent calls
// run one after another.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_THREAD_POOL_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace shardps {

class LocalThreadPool {
 public:
  // `num_threads` >= 1 counts the calling thread: num_threads - 1 helpers.
  explicit LocalThreadPool(int num_threads);
  ~LocalThreadPool();
  LocalThreadPool(const LocalThreadPool&) = delete;
  LocalThreadPool& operator=(const LocalThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs task(i) once for each i in [0, num_tasks), spread over the threads;
  // returns when all have finished. Tasks must not call ParallelFor.
  void ParallelFor(size_t num_tasks, absl::FunctionRef<void(size_t)> task);

 private:
  struct Job {
    absl::FunctionRef<void(size_t)> task;
    size_t num_tasks;
    std::atomic<size_t> next{0};
  };

  static void RunTasks(Job& job);
  void HelperLoop();

  absl::Mutex call_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // One ParallelFor at a time.
  absl::Mutex mu_;
  absl::CondVar new_job_;  // Signalled when generation_ advances or stopping_.
  Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_helpers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_THREAD_POOL_H_
