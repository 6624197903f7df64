#include "compression/kernel_thread_pool.h"

#include <algorithm>

namespace shardps::compression {
namespace {
thread_local bool tls_inside_job = false;
}  // namespace

KernelThreadPool& KernelThreadPool::Default() {
  static KernelThreadPool* pool =
      new KernelThreadPool(std::max(1, static_cast<int>(std::thread::hardware_concurrency())) - 1);
  return *pool;
}

KernelThreadPool::KernelThreadPool(int num_workers) {
  for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

KernelThreadPool::~KernelThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

void KernelThreadPool::RunTasks(const Job& job) {
  tls_inside_job = true;
  for (size_t i; (i = next_task_.fetch_add(1, std::memory_order_relaxed)) < job.num_tasks;) {
    (*job.fn)(i);
  }
  tls_inside_job = false;
}

void KernelThreadPool::WorkerLoop(int id) {
  uint64_t seen = 0;
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      if (id >= participants_) continue;
      job = job_;
    }
    RunTasks(job);
    absl::MutexLock lock(&mu_);
    if (--active_ == 0) done_cv_.SignalAll();
  }
}

void KernelThreadPool::ParallelFor(size_t num_tasks, int parallelism,
                                   absl::FunctionRef<void(size_t)> fn) {
  if (parallelism <= 0) parallelism = max_parallelism();
  const int helpers = static_cast<int>(
      std::min<size_t>({static_cast<size_t>(parallelism) - 1, workers_.size(),
                        num_tasks > 0 ? num_tasks - 1 : 0}));
  if (helpers == 0 || tls_inside_job || !run_mu_.TryLock()) {
    for (size_t i = 0; i < num_tasks; ++i) fn(i);
    return;
  }
  const Job job{&fn, num_tasks};
  next_task_.store(0, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    job_ = job;
    participants_ = helpers;
    active_ = helpers;
    ++generation_;
    work_cv_.SignalAll();
  }
  RunTasks(job);
  {
    absl::MutexLock lock(&mu_);
    while (active_ > 0) done_cv_.Wait(&mu_);
  }
  run_mu_.Unlock();
}

}  // namespace shardps::compression
