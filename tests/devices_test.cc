// Training with D devices per worker through a real cluster: the bitwise sync
// oracle with the local first tier, and one push per partition whatever D is.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "tests/test_cluster.h"
#include "tests/test_training.h"
#include "tools/train_job.h"
#include "worker/worker.h"

namespace shardps {
namespace {


ClusterConfig DeterministicSync(int servers, int workers) {
  ClusterConfig c = TrainingConfig(SYNC, servers, workers);
  c.set_deterministic(true);
  return c;
}

TrainOptions SmallJob(int batch_size, int devices_per_worker, size_t train_limit) {
  TrainOptions o = QuietRun(1, train_limit, 200);
  o.batch_size = batch_size;
  o.devices_per_worker = devices_per_worker;
  return o;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class DevicesOracleTest : public ::testing::TestWithParam<UpdateMode> {};

// Optimizer on the servers or (sum only) on the workers: both bitwise.
TEST_P(DevicesOracleTest, TwoWorkersTimesThreeDevicesMatchTheReferenceBitwise) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = DeterministicSync(2, 2);
  config.set_update_mode(GetParam());
  const TrainOptions o = SmallJob(/*batch_size=*/30, /*devices_per_worker=*/3, /*train_limit=*/1200);
  auto results = TrainOnNewCluster(config, 2, o);
  std::ostringstream log;
  auto reference = RunReference(config, o, log);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->steps, 20);
  TrainOptions one_device = o;
  one_device.devices_per_worker = 1;
  auto undivided = RunReference(config, one_device, log);
  ASSERT_TRUE(undivided.ok()) << undivided.status();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->steps, 20);
    if (r == 0) {
      EXPECT_EQ(results[r]->final_loss, reference->final_loss);  // the reference reports rank 0's loss
    }
    ASSERT_EQ(results[r]->params.size(), reference->params.size());
    for (size_t t = 0; t < reference->params.size(); ++t) {
      EXPECT_TRUE(BitwiseEqual(results[r]->params[t], reference->params[t]))
          << "rank " << r << " tensor " << t << " differs from the D=3 reference";
    }
  }
  // The oracle is not vacuous: splitting the batch over 3 devices changes the
  // float order, so the D=1 reference ends elsewhere (though close).
  EXPECT_FALSE(BitwiseEqual(undivided->params[0], reference->params[0]));
  EXPECT_NEAR(undivided->test_accuracy, reference->test_accuracy, 0.03);
}

INSTANTIATE_TEST_SUITE_P(UpdateModes, DevicesOracleTest, ::testing::Values(UPDATE_ON_SERVER, SUM_ONLY),
                         [](const auto& info) { return UpdateMode_Name(info.param); });

// Bytes a worker pushes in one job: one gradient per tensor per step (and,
// on rank 0, the initial weights once).
uint64_t PushedBytes(int devices_per_worker, int rank, int64_t* steps, uint64_t* model_bytes) {
  const ClusterConfig config = DeterministicSync(2, 2);
  const TrainOptions o = SmallJob(/*batch_size=*/32, devices_per_worker, /*train_limit=*/640);
  auto results = TrainOnNewCluster(config, 2, o);
  EXPECT_TRUE(results[rank].ok()) << results[rank].status();
  if (!results[rank].ok()) return 0;
  *steps = results[rank]->steps;
  *model_bytes = 0;
  for (const auto& p : results[rank]->params) *model_bytes += p.size() * sizeof(float);
  return results[rank]->bytes_pushed;
}

TEST(DevicesTest, OnePushPerPartitionPerRoundWhateverTheDeviceCount) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  int64_t steps1 = 0, steps4 = 0;
  uint64_t model1 = 0, model4 = 0;
  const uint64_t one_device = PushedBytes(1, /*rank=*/1, &steps1, &model1);
  const uint64_t four_devices = PushedBytes(4, /*rank=*/1, &steps4, &model4);
  ASSERT_EQ(steps1, 10);
  ASSERT_EQ(steps4, 10);
  EXPECT_EQ(four_devices, one_device);
  EXPECT_EQ(four_devices, 10 * model4);  // rank 1 sends no INIT
}

TEST(DevicesTest, BatchNotDivisibleByTheDevicesIsRejectedNamingBoth) {
  TrainOptions o;
  o.batch_size = 30;
  o.devices_per_worker = 4;
  absl::Status s = ValidateTrainOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--batch-size 30 is not divisible by --devices-per-worker 4"), std::string::npos) << s;
  o.devices_per_worker = 0;
  EXPECT_EQ(ValidateTrainOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.devices_per_worker = 3;
  EXPECT_TRUE(ValidateTrainOptions(o).ok());
}

}  // namespace
}  // namespace shardps
