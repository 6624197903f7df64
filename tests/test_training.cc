#include "tests/test_training.h"

#include <filesystem>
#include <sstream>
#include <thread>

#include "worker/worker.h"

namespace shardps {

bool HaveDataset() { return std::filesystem::exists(TrainOptions().data_dir + "/train-images-idx3-ubyte.gz"); }

ClusterConfig TrainingConfig(Consistency consistency, int servers, int workers) {
  ClusterConfig c;
  c.set_consistency(consistency);
  c.set_num_servers(servers);
  c.set_num_workers(workers);
  c.set_partition_bytes(64 * 1024);
  return c;
}

TrainOptions QuietRun(int epochs, size_t train_limit, size_t test_limit) {
  TrainOptions o;
  o.epochs = epochs;
  o.train_limit = train_limit;
  o.test_limit = test_limit;
  o.log_every = 0;
  return o;
}

std::vector<absl::StatusOr<TrainResult>> TrainOnNewCluster(const ClusterConfig& config, int workers,
                                                           const TrainOptions& o) {
  auto cluster = TestCluster::Start(config);
  if (!cluster.ok()) return std::vector<absl::StatusOr<TrainResult>>(workers, cluster.status());
  return TrainOnCluster(**cluster, workers, o);
}

std::vector<absl::StatusOr<TrainResult>> TrainOnCluster(TestCluster& cluster, int workers, const TrainOptions& o,
                                                        std::vector<std::string>* logs) {
  std::vector<absl::StatusOr<TrainResult>> results(workers, absl::UnknownError("not run"));
  if (logs != nullptr) logs->assign(workers, "");
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
      if (logs != nullptr) (*logs)[r] = log.str();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace shardps
