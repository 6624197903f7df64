// Training through the cluster: the bitwise sync oracle and async accuracy.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <tuple>

#include "tests/test_cluster.h"
#include "tests/test_training.h"
#include "tools/train_job.h"
#include "worker/worker.h"

namespace shardps {
namespace {

ClusterConfig Config(Consistency consistency, int servers, int workers) {
  return TrainingConfig(consistency, servers, workers);
}

// Update mode, and whether the workers overlap communication with compute
// (TrainOptions::overlap): only timing may differ between the two.
class OracleTest : public ::testing::TestWithParam<std::tuple<UpdateMode, bool>> {
 protected:
  UpdateMode mode() const { return std::get<0>(GetParam()); }
  bool overlap() const { return std::get<1>(GetParam()); }
};

// Trains `config` (sync, deterministic, 3 workers) on 20 steps and compares
// every worker's final weights with the single-process reference.
void ExpectMatchesReferenceBitwise(const ClusterConfig& config, bool overlap = true) {
  TrainOptions o = QuietRun(1, 1920, 500);
  o.batch_size = 32;
  o.overlap = overlap;
  auto results = TrainOnNewCluster(config, 3, o);
  std::ostringstream log;
  auto reference = RunReference(config, o, log);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->steps, 20);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    ASSERT_EQ(results[r]->params.size(), reference->params.size());
    for (size_t t = 0; t < reference->params.size(); ++t) {
      const auto& got = results[r]->params[t];
      const auto& want = reference->params[t];
      ASSERT_EQ(got.size(), want.size());
      size_t differing = 0;
      double max_diff = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++differing;
        max_diff = std::max(max_diff, std::abs(double(got[i]) - double(want[i])));
      }
      EXPECT_EQ(differing, 0u) << "rank " << r << " tensor " << t << ": " << differing << " of " << got.size()
                               << " weights differ from the reference (max difference " << max_diff << ")";
    }
  }
}

// Update on server and sum only (optimizer on the workers) run the same float
// operations, so both must equal the reference bit for bit.
TEST_P(OracleTest, DeterministicSyncMatchesSingleProcessReferenceBitwise) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SYNC, 2, 3);
  config.set_deterministic(true);
  config.set_update_mode(mode());
  ExpectMatchesReferenceBitwise(config, overlap());
}

// With a codec configured, rounds kept uncompressed travel as exact floats
// (both ways in sum-only mode), and Adam's variance freeze is the same rule
// on servers, on sum-only workers and in the reference.
TEST_P(OracleTest, UncompressedRoundsAndFrozenVarianceMatchTheReferenceBitwise) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SYNC, 2, 3);
  config.set_deterministic(true);
  config.set_update_mode(mode());
  config.mutable_compression()->set_codec("2bit:threshold=0.001");
  if (mode() == SUM_ONLY) config.mutable_compression()->set_pull_codec("onebit");
  config.mutable_compression()->set_uncompressed_rounds(20);
  config.mutable_optimizer()->set_freeze_variance_after(10);
  ExpectMatchesReferenceBitwise(config, overlap());
}

INSTANTIATE_TEST_SUITE_P(UpdateModes, OracleTest,
                         ::testing::Combine(::testing::Values(UPDATE_ON_SERVER, SUM_ONLY), ::testing::Bool()),
                         [](const auto& info) {
                           return UpdateMode_Name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_Overlapped" : "_Sequential");
                         });

// SSP with staleness 0 answers a push-pull only once its round is complete:
// exactly sync, bit for bit.
TEST(TrainingTest, SspWithStalenessZeroMatchesTheReferenceBitwise) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SSP, 2, 3);
  config.set_staleness(0);
  config.set_deterministic(true);
  ExpectMatchesReferenceBitwise(config);
}

// Trains `config` with `workers` workers, 2 epochs of 6000 images, and
// expects every worker above `floor` and within `band` of the sync reference.
// Async and ssp order varies run to run; the bands are wide enough for that
// and still far from an optimizer that diverges or stops (0.1). Lost and
// doubled pushes are counted, not inferred from accuracy, by the failure tests.
void ExpectReferenceBand(const ClusterConfig& config, int workers, double floor, double band) {
  const TrainOptions o = QuietRun(2, 6000, 2000);
  auto results = TrainOnNewCluster(config, workers, o);
  std::ostringstream log;
  auto reference = RunReference(Config(SYNC, 2, workers), o, log);
  ASSERT_TRUE(reference.ok());
  for (int r = 0; r < workers; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    // Every run's figures in the log, so a margin can be read off past runs.
    std::cerr << "rank " << r << ": test accuracy " << results[r]->test_accuracy << " (sync reference "
              << reference->test_accuracy << ", band " << band << ", floor " << floor << ")\n";
    EXPECT_GT(results[r]->test_accuracy, floor);
    EXPECT_NEAR(results[r]->test_accuracy, reference->test_accuracy, band);
  }
}

// With a bound of 2 the job trains to sync's band: pushes applied as they
// arrive, as in async (the default).
TEST(TrainingTest, SspWithStalenessTwoTrainsToTheReferenceAccuracyBand) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SSP, 2, 3);
  config.set_staleness(2);
  ExpectReferenceBand(config, 3, 0.72, 0.08);
}

// In rounds (and the default 2 copies per partition, so pushes are forwarded
// to the backups before they are answered ahead of their round) it trains,
// if more slowly than sync on a job this short: every worker's gradients up
// to 2 rounds stale, stepped by lr / staleness (docs/performance.md).
TEST(TrainingTest, SspInRoundsWithStalenessTwoTrainsToAWiderBand) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SSP, 2, 3);
  config.set_staleness(2);
  config.set_ssp_in_rounds(true);
  ExpectReferenceBand(config, 3, 0.65, 0.15);
}

TEST(TrainingTest, AsyncTrainsToTheReferenceAccuracyBand) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  // Under load one worker can run far ahead (0.0605 below sync was seen with
  // other builds on both cores; 0.108 below, at 0.7255, in a full suite run
  // beside another build's soak, where quiet runs and runs beside three CPU
  // hogs gave 0.78-0.83). Still far above an optimizer that diverges or
  // stops (0.1); lost and doubled pushes are counted by the failure tests.
  ExpectReferenceBand(Config(ASYNC, 2, 2), 2, 0.68, 0.13);
}

// TrainOptions::eval_every: rank 0 reports the test accuracy of the weights
// it holds every N steps and of the final weights, in its result and as JSON
// lines in its log; the other ranks report nothing.
TEST(TrainingTest, RankZeroReportsTestAccuracyDuringTraining) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TrainOptions o = QuietRun(1, 1280, 500);  // 2 workers x 32 images: 20 steps
  o.eval_every = 8;
  auto cluster = TestCluster::Start(Config(SYNC, 1, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::string> logs;
  auto results = TrainOnCluster(**cluster, 2, o, &logs);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  const std::vector<AccuracyPoint>& points = results[0]->accuracy_points;
  ASSERT_EQ(points.size(), 3u);
  const int64_t steps[] = {8, 16, 20};
  const double epochs[] = {0.4, 0.8, 1.0};
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].step, steps[i]);
    EXPECT_DOUBLE_EQ(points[i].epochs, epochs[i]);
    EXPECT_EQ(points[i].final, i == 2) << "point " << i;
    EXPECT_GT(points[i].test_accuracy, 0.1) << "point " << i;
    EXPECT_LE(points[i].test_accuracy, 1.0) << "point " << i;
    EXPECT_GT(points[i].eval_seconds, 0) << "point " << i;
    if (i > 0) {
      EXPECT_GE(points[i].seconds, points[i - 1].seconds) << "point " << i;
    }
    EXPECT_NE(logs[0].find(AccuracyPointJson(points[i]) + "\n"), std::string::npos)
        << "rank 0's log lacks point " << i << ": " << logs[0];
  }
  EXPECT_EQ(points.back().test_accuracy, results[0]->test_accuracy);
  EXPECT_TRUE(results[1]->accuracy_points.empty());
  EXPECT_EQ(logs[1].find("eval_step"), std::string::npos) << logs[1];
}

TEST(TrainingTest, EvalEveryBelowZeroOrWithSeveralDevicesIsRejected) {
  TrainOptions o;
  o.eval_every = -1;
  absl::Status s = ValidateTrainOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--eval-every -1 is below 0"), std::string::npos) << s;
  o.eval_every = 10;
  o.devices_per_worker = 2;
  s = ValidateTrainOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs --devices-per-worker 1, not 2"), std::string::npos) << s;
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

struct CodecCase {
  std::string name, push, pull;
  UpdateMode mode;
  double max_push_fraction;  // bytes pushed relative to raw fp32
};

void PrintTo(const CodecCase& c, std::ostream* os) { *os << c.name; }

class CompressedTrainingTest : public ::testing::TestWithParam<CodecCase> {};

// The demo job trains with each codec: accuracy far above chance, and the
// bytes on the wire shrink as the codec promises.
TEST_P(CompressedTrainingTest, TrainsAndShrinksTheWire) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const CodecCase& c = GetParam();
  ClusterConfig config = Config(SYNC, 2, 2);
  config.mutable_compression()->set_codec(c.push);
  config.mutable_compression()->set_pull_codec(c.pull);
  config.set_update_mode(c.mode);
  auto results = TrainOnNewCluster(config, 2, QuietRun(1, 3200, 1000));
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_GT(results[0]->test_accuracy, 0.55) << c.name;
  // 50 steps x 235k floats; INIT of rank 0 travels raw and is excluded.
  const double raw = 50.0 * 235146 * 4;
  EXPECT_LT(results[1]->bytes_pushed, c.max_push_fraction * raw) << c.name;
  EXPECT_GT(results[1]->bytes_pushed, 0.0);
  if (c.pull == "onebit") {
    // Round answers are onebit deltas; the first and last pulls travel raw.
    EXPECT_LT(results[1]->bytes_pulled, (2.0 + 50.0 / 25) * 235146 * 4) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, CompressedTrainingTest,
    ::testing::Values(CodecCase{"none", "none", "none", UPDATE_ON_SERVER, 1.01},
                      CodecCase{"fp16", "fp16", "fp16", UPDATE_ON_SERVER, 0.51},
                      CodecCase{"bf16", "bf16", "bf16", UPDATE_ON_SERVER, 0.51},
                      CodecCase{"twobit", "2bit:threshold=0.01", "none", UPDATE_ON_SERVER, 0.07},
                      CodecCase{"onebit", "onebit", "none", UPDATE_ON_SERVER, 0.04},
                      CodecCase{"topk", "topk:ratio=0.01", "none", UPDATE_ON_SERVER, 0.03},
                      CodecCase{"randomk", "randomk:ratio=0.1,unbiased=0", "none", UPDATE_ON_SERVER, 0.11},
                      CodecCase{"twobit_sum_only_fp16_pull", "2bit:threshold=0.01", "fp16", SUM_ONLY, 0.07},
                      CodecCase{"onebit_weight_delta_pull", "none", "onebit", UPDATE_ON_SERVER, 1.01}),
    [](const auto& info) { return info.param.name; });

// 1-bit Adam's recipe end to end: 10 raw rounds, then Adam's variance frozen
// and onebit both ways (workers' momenta up, their onebit sum down). It
// trains about as well as the same job uncompressed, on a fraction of the
// bytes.
TEST(TrainingTest, OneBitAdamRecipeTrainsLikeUncompressed) {
  if (!HaveDataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ClusterConfig config = Config(SYNC, 2, 2);
  config.set_update_mode(SUM_ONLY);
  config.mutable_optimizer()->set_epsilon(1e-4f);
  config.mutable_optimizer()->set_freeze_variance_after(10);
  const TrainOptions o = QuietRun(1, 3200, 1000);
  auto plain = TrainOnNewCluster(config, 2, o);
  config.mutable_compression()->set_codec("onebit");
  config.mutable_compression()->set_pull_codec("onebit");
  config.mutable_compression()->set_uncompressed_rounds(10);
  auto compressed = TrainOnNewCluster(config, 2, o);
  ASSERT_TRUE(plain[0].ok()) << plain[0].status();
  ASSERT_TRUE(plain[1].ok()) << plain[1].status();
  ASSERT_TRUE(compressed[0].ok()) << compressed[0].status();
  ASSERT_TRUE(compressed[1].ok()) << compressed[1].status();
  EXPECT_GT(compressed[0]->test_accuracy, plain[0]->test_accuracy - 0.05);
  // 50 rounds: 10 raw plus the first pull, against 50 raw uncompressed.
  const double model_bytes = 235146.0 * 4;
  EXPECT_LT(compressed[1]->bytes_pulled, 13 * model_bytes);
  EXPECT_GT(plain[1]->bytes_pulled, 50 * model_bytes);
}

}  // namespace
}  // namespace shardps
