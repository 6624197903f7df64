// Helpers for tests that train the example job on a TestCluster.
#ifndef SHARDPS_TESTS_TEST_TRAINING_H_
#define SHARDPS_TESTS_TEST_TRAINING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/test_cluster.h"
#include "tools/train_job.h"

namespace shardps {

// True when the Fashion-MNIST files are installed (tests skip otherwise).
bool HaveDataset();

// `servers` servers and `workers` workers in `consistency` mode, with 64 KiB
// partitions so that fc1.weight spans several partitions on every server.
ClusterConfig TrainingConfig(Consistency consistency, int servers, int workers);

// The example job on the first `train_limit` / `test_limit` images, without
// progress lines.
TrainOptions QuietRun(int epochs, size_t train_limit, size_t test_limit);

// Runs `workers` training workers (ranks 0..workers-1) as threads against
// `cluster`; one result per rank. With `logs`, each rank's log text lands in
// (*logs)[rank].
std::vector<absl::StatusOr<TrainResult>> TrainOnCluster(TestCluster& cluster, int workers, const TrainOptions& o,
                                                        std::vector<std::string>* logs = nullptr);

// Starts a TestCluster for `config` and trains on it; if it does not start,
// every rank's result is that error.
std::vector<absl::StatusOr<TrainResult>> TrainOnNewCluster(const ClusterConfig& config, int workers,
                                                           const TrainOptions& o);

}  // namespace shardps

#endif  // SHARDPS_TESTS_TEST_TRAINING_H_
