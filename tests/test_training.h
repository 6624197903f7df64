// Helpers for tests that train the example job on a TestCluster.
#ifndef SHARDPS_TESTS_TEST_TRAINING_H_
#define SHARDPS_TESTS_TEST_TRAINING_H_

#include <vector>

#include "absl/status/statusor.h"
#include "tests/test_cluster.h"
#include "tools/train_job.h"

namespace shardps {

// True when the Fashion-MNIST files are installed (tests skip otherwise).
bool HaveDataset();

// Runs `workers` training workers (ranks 0..workers-1) as threads against
// `cluster`; one result per rank.
std::vector<absl::StatusOr<TrainResult>> TrainOnCluster(TestCluster& cluster, int workers, const TrainOptions& o);

}  // namespace shardps

#endif  // SHARDPS_TESTS_TEST_TRAINING_H_
