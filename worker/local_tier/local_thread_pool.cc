#include "worker/local_tier/local_thread_pool.h"

namespace shardps {

LocalThreadPool::LocalThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

LocalThreadPool::~LocalThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  new_job_.SignalAll();
  for (std::thread& helper : helpers_) helper.join();
}

void LocalThreadPool::RunTasks(Job& job) {
  for (size_t i = job.next.fetch_add(1); i < job.num_tasks; i = job.next.fetch_add(1)) {
    job.task(i);
  }
}

void LocalThreadPool::ParallelFor(size_t num_tasks, absl::FunctionRef<void(size_t)> task) {
  Job job{task, num_tasks};
  if (helpers_.empty() || num_tasks <= 1) {
    RunTasks(job);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    job_ = &job;
    busy_helpers_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  new_job_.SignalAll();
  RunTasks(job);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* busy) { return *busy == 0; }, &busy_helpers_));
  job_ = nullptr;
}

void LocalThreadPool::HelperLoop() {
  uint64_t seen = 0;
  while (true) {
    Job* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && generation_ == seen) new_job_.Wait(&mu_);
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    RunTasks(*job);
    absl::MutexLock lock(&mu_);
    --busy_helpers_;
  }
}

}  // namespace shardps
