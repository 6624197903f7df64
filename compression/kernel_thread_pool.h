// KernelThreadPool: a small fixed pool that runs the CPU codec kernels over
// chunks of large inputs. Internal to compression/.
//
// ParallelFor runs one job at a time; a caller that finds the pool busy (or
// calls from inside a job) runs its job inline, so concurrent codec calls never
// block on each other and never deadlock. Thread-safe. The default pool lives
// for the whole process; other pools join their threads on destruction.
#ifndef SHARDPS_COMPRESSION_KERNEL_THREAD_POOL_H_
#define SHARDPS_COMPRESSION_KERNEL_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace shardps::compression {

class KernelThreadPool {
 public:
  // Pool with hardware_concurrency() - 1 workers (the caller is the last one).
  static KernelThreadPool& Default();

  explicit KernelThreadPool(int num_workers);
  ~KernelThreadPool();
  KernelThreadPool(const KernelThreadPool&) = delete;
  KernelThreadPool& operator=(const KernelThreadPool&) = delete;

  // Most threads a job can use, caller included.
  int max_parallelism() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) once for each i in [0, num_tasks) on up to `parallelism`
  // threads (caller included; <= 0 means all) and returns when all are done.
  void ParallelFor(size_t num_tasks, int parallelism, absl::FunctionRef<void(size_t)> fn);

 private:
  struct Job {
    const absl::FunctionRef<void(size_t)>* fn = nullptr;
    size_t num_tasks = 0;
  };
  void WorkerLoop(int id);
  void RunTasks(const Job& job);

  absl::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // Held by the caller whose job is running.
  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int participants_ ABSL_GUARDED_BY(mu_) = 0;  // Workers with id < this join.
  int active_ ABSL_GUARDED_BY(mu_) = 0;        // Joined workers still running.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Job job_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> next_task_{0};
  std::vector<std::thread> workers_;
};

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_KERNEL_THREAD_POOL_H_
