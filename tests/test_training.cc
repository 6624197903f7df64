#include "tests/test_training.h"

#include <filesystem>
#include <sstream>
#include <thread>

#include "worker/worker.h"

namespace shardps {

bool HaveDataset() { return std::filesystem::exists(TrainOptions().data_dir + "/train-images-idx3-ubyte.gz"); }

std::vector<absl::StatusOr<TrainResult>> TrainOnCluster(TestCluster& cluster, int workers, const TrainOptions& o) {
  std::vector<absl::StatusOr<TrainResult>> results(workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      auto w = Worker::Create({.scheduler_address = cluster.scheduler_address(), .rank = static_cast<uint32_t>(r)});
      if (!w.ok()) {
        results[r] = w.status();
        return;
      }
      std::ostringstream log;
      results[r] = RunTrainingWorker(**w, o, log);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace shardps
