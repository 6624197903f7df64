// The C ABI's queries and per-partition calls against a real cluster (the
// basic step is ClusterTest.CApiTrainsAStep).
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/c_api_test_cluster.h"
#include "worker/c_api.h"
#include "worker/cuda_transfer.h"

#if SHARDPS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CApiClusterTest, ReportsTheJobTheSchedulerHandedOut) {
  uint32_t rank = 9, size = 0, servers = 0;
  int consistency = 0, update_mode = -1;
  uint64_t rejoin_round = 9;
  ASSERT_EQ(shardps_rank(w_, &rank, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_world_size(w_, &size, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_num_servers(w_, &servers, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_consistency(w_, &consistency, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_update_mode(w_, &update_mode, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_rejoin_round(w_, &rejoin_round, err_, sizeof(err_)), SHARDPS_OK);
  int passed_before_rejoin = 9;
  ASSERT_EQ(shardps_rejoin_passed_barrier(w_, "init", &passed_before_rejoin, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(rank, 0u);
  EXPECT_EQ(size, 1u);
  EXPECT_EQ(servers, 2u);
  EXPECT_EQ(consistency, SHARDPS_CONSISTENCY_ASYNC);
  EXPECT_EQ(update_mode, SHARDPS_UPDATE_ON_SERVER);
  EXPECT_EQ(rejoin_round, 0u);  // joined at the start
  EXPECT_EQ(passed_before_rejoin, 0);
}

// The live servers of the shard map the worker follows, up to `timeout`
// for it to become `expected` (maps reach the worker through its watch).
uint32_t NumServersOnceItIs(shardps_worker* w, uint32_t expected, absl::Duration timeout) {
  uint32_t servers = 0;
  char err[256] = "";
  for (const absl::Time deadline = absl::Now() + timeout;; absl::SleepFor(absl::Milliseconds(50))) {
    EXPECT_EQ(shardps_num_servers(w, &servers, err, sizeof(err)), SHARDPS_OK) << err;
    if (servers == expected || absl::Now() >= deadline) return servers;
  }
}

TEST_F(CApiClusterTest, NumServersCountsTheLiveServersOfTheShardMapAsTheClusterGrowsAndShrinks) {
  int64_t n = 1024;
  ASSERT_EQ(shardps_declare_tensor(w_, "w", &n, 1, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(NumServersOnceItIs(w_, 2, absl::ZeroDuration()), 2u);
  // A third server joins the running job as one more: the config still says 2.
  ASSERT_TRUE(cluster_->AddServer().ok());
  EXPECT_EQ(NumServersOnceItIs(w_, 3, absl::Seconds(30)), 3u) << "the server that joined is not counted";
  // One that stops leaves the job: the map lists it dead, and it no longer counts.
  EXPECT_EQ(cluster_->StopServer(0), 0);
  EXPECT_EQ(NumServersOnceItIs(w_, 2, absl::Seconds(30)), 2u) << "a server that left is still counted";
}

TEST_F(CApiClusterTest, AFailedDefinitionIsResetAndDeclaredAgain) {
  const int64_t bad[] = {0}, good[] = {8};
  ASSERT_EQ(shardps_declare_tensor(w_, "w", bad, 1, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("dimension 0"));
  ASSERT_EQ(shardps_reset_declared(w_, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor(w_, "w", good, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << "defining again changes nothing";
  const float init[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(shardps_init_tensor(w_, "w", init, 8, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  const float other[8] = {};
  EXPECT_EQ(shardps_init_tensor(w_, "w", other, 8, 10.0, err_, sizeof(err_)), SHARDPS_ALREADY_EXISTS);
}

TEST(CApiTimeoutTest, ABarrierWithADeadlineSaysWhoIsMissing) {
  TwoWorkers job{ClusterConfig()};
  ASSERT_TRUE(job.ok());
  shardps_worker* const* w = job.w;
  char why[256] = "";
  EXPECT_EQ(shardps_barrier_timeout(w[0], "b", 0.5, why, sizeof(why)), SHARDPS_DEADLINE_EXCEEDED);
  EXPECT_THAT(std::string(why), HasSubstr("missing worker ranks: 1"));
  EXPECT_THAT(std::string(why), Not(HasSubstr("barrier 'b': barrier 'b'"))) << "said once";
  EXPECT_EQ(shardps_barrier_timeout(w[0], "b", 0, why, sizeof(why)), SHARDPS_INVALID_ARGUMENT);
}

TEST_F(CApiClusterTest, SixteenBitBuffersAreConvertedAndMismatchesRefused) {
  const int64_t shape[] = {4};
  ASSERT_EQ(shardps_declare_tensor_dtype(w_, "h", shape, 1, SHARDPS_FLOAT16, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_dtype(w_, "b", shape, 1, SHARDPS_BFLOAT16, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  const float init[4] = {1, 2, 3, 4};
  ASSERT_EQ(shardps_init_tensor(w_, "h", init, 4, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_init_tensor(w_, "b", init, 4, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  // 1.0 in float16 is 0x3c00, in bfloat16 0x3f80; lr 0.5 moves each weight by -0.5.
  const uint16_t half_one[4] = {0x3c00, 0x3c00, 0x3c00, 0x3c00}, bf_one[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  uint16_t half_w[4] = {0x3c00, 0x4000, 0x4200, 0x4400}, bf_w[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
  uint64_t h = 0;
  ASSERT_EQ(shardps_push_pull_typed(w_, "h", half_one, half_w, sizeof(half_w), SHARDPS_FLOAT16, &h, err_, sizeof(err_)),
            SHARDPS_OK)
      << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(half_w[0], 0x3800);  // 0.5
  EXPECT_EQ(half_w[3], 0x4300);  // 3.5
  ASSERT_EQ(shardps_push_pull_typed(w_, "b", bf_one, bf_w, sizeof(bf_w), SHARDPS_BFLOAT16, &h, err_, sizeof(err_)),
            SHARDPS_OK)
      << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(bf_w[0], 0x3f00);  // 0.5
  EXPECT_EQ(bf_w[3], 0x4060);  // 3.5
  EXPECT_EQ(shardps_push_pull_typed(w_, "h", bf_one, bf_w, sizeof(bf_w), SHARDPS_BFLOAT16, &h, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("declared float16; the buffers are bfloat16"));
  EXPECT_EQ(shardps_push_pull_typed(w_, "h", half_one, half_w, 6, SHARDPS_FLOAT16, &h, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("the buffers hold 6 bytes"));
}

TEST_F(CApiClusterTest, WaitAnyCompletesEveryHandleOnceInOneThread) {
  const int64_t shape[] = {600}, half_shape[] = {4};
  ASSERT_EQ(shardps_declare_tensor(w_, "a", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor(w_, "b", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_dtype(w_, "h", half_shape, 1, SHARDPS_FLOAT16, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  std::vector<float> grad(600, 1.0f), a(600), b(600);
  const uint16_t half_one[4] = {0x3c00, 0x3c00, 0x3c00, 0x3c00};
  uint16_t half_w[4] = {};
  uint64_t handles[3];
  ASSERT_EQ(shardps_push_pull(w_, "a", grad.data(), a.data(), 600, &handles[0], err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_push_pull(w_, "b", grad.data(), b.data(), 600, &handles[1], err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_push_pull_typed(w_, "h", half_one, half_w, sizeof(half_w), SHARDPS_FLOAT16, &handles[2], err_,
                                    sizeof(err_)),
            SHARDPS_OK);
  // Complete them in whatever order they finish, dropping each from the set.
  std::vector<uint64_t> outstanding(handles, handles + 3), completed;
  while (!outstanding.empty()) {
    size_t done = 99;
    ASSERT_EQ(shardps_wait_any(w_, outstanding.data(), outstanding.size(), 10.0, &done, err_, sizeof(err_)),
              SHARDPS_OK)
        << err_;
    ASSERT_LT(done, outstanding.size());
    completed.push_back(outstanding[done]);
    outstanding.erase(outstanding.begin() + done);
  }
  EXPECT_THAT(completed, ::testing::UnorderedElementsAre(handles[0], handles[1], handles[2]));
  EXPECT_EQ(a[599], -0.5f);  // lr 0.5 * gradient 1
  EXPECT_EQ(b[0], -0.5f);
  EXPECT_EQ(half_w[3], 0xb800);  // -0.5 in float16: the staged weights were written back
  size_t done = 99;
  EXPECT_EQ(shardps_wait_any(w_, handles, 3, 1.0, &done, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("already waited on"));
  EXPECT_EQ(done, 3u);
  EXPECT_EQ(shardps_wait(w_, handles[1], 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait_any(w_, handles, 0, 1.0, &done, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait_any(w_, handles, 1, 1.0, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
}

TEST(CApiWaitAnyTest, NothingDoneInTimeLeavesEveryHandleOutstanding) {
  TwoWorkers job(SyncSgd(0.5f));
  ASSERT_TRUE(job.ok());
  job.Define("w", 4);
  shardps_worker* const* w = job.w;
  char err[256] = "";
  float grad[4] = {1, 1, 1, 1}, out0[4] = {}, out1[4] = {};
  uint64_t h0 = 0, h1 = 0;
  // Sync: rank 0's round cannot complete before rank 1 pushes.
  ASSERT_EQ(shardps_push_pull(w[0], "w", grad, out0, 4, &h0, err, sizeof(err)), SHARDPS_OK) << err;
  size_t done = 7;
  char why[256] = "";
  EXPECT_EQ(shardps_wait_any(w[0], &h0, 1, 0.0, &done, why, sizeof(why)), SHARDPS_DEADLINE_EXCEEDED);
  EXPECT_EQ(done, 1u);
  EXPECT_EQ(shardps_wait_any(w[0], &h0, 1, 0.3, &done, why, sizeof(why)), SHARDPS_DEADLINE_EXCEEDED);
  EXPECT_THAT(std::string(why), HasSubstr("none of 1 requests answered"));
  ASSERT_EQ(shardps_push_pull(w[1], "w", grad, out1, 4, &h1, err, sizeof(err)), SHARDPS_OK) << err;
  ASSERT_EQ(shardps_wait(w[1], h1, 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  EXPECT_EQ(shardps_wait_any(w[0], &h0, 1, 10.0, &done, why, sizeof(why)), SHARDPS_OK) << why;
  EXPECT_EQ(done, 0u);
  EXPECT_EQ(out0[0], -0.5f);  // lr 0.5 * mean gradient 1
}

TEST(CApiSumOnlyTest, MeanGradientIsTheWorkersAverageAndTouchesNoWeights) {
  ClusterConfig config = SyncSgd(0.5f);
  config.set_update_mode(SUM_ONLY);
  TwoWorkers job(config);
  ASSERT_TRUE(job.ok());
  job.Define("w", 4);
  char err[256] = "";
  const float grad0[4] = {1, 2, 3, 4}, grad1[4] = {3, 2, 1, 0};
  float mean0[4] = {}, mean1[4] = {};
  uint64_t h0 = 0, h1 = 0;
  ASSERT_EQ(shardps_push_pull_mean_gradient(job.w[0], "w", grad0, mean0, 4, &h0, err, sizeof(err)), SHARDPS_OK)
      << err;
  ASSERT_EQ(shardps_push_pull_mean_gradient(job.w[1], "w", grad1, mean1, 4, &h1, err, sizeof(err)), SHARDPS_OK)
      << err;
  ASSERT_EQ(shardps_wait(job.w[0], h0, 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  ASSERT_EQ(shardps_wait(job.w[1], h1, 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(mean0[i], 2.0f) << i;
    EXPECT_EQ(mean1[i], 2.0f) << i;
  }
}

TEST(CApiSumOnlyTest, ARoundNoWorkerPushedAGradientToStepsNoWeightsAndAdamCountsOnlyTheRoundsThatDid) {
  // Adam on the workers (sum-only): a frozen parameter's round moves no
  // weight, and its next step is Adam's second, as in one torch process.
  ClusterConfig config = SyncSgd(0.5f);
  config.set_update_mode(SUM_ONLY);
  config.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  config.mutable_optimizer()->set_learning_rate(0.1f);
  TwoWorkers job(config);
  ASSERT_TRUE(job.ok());
  job.Define("w", 4);
  char err[256] = "";
  const float grad0[4] = {1, 2, 3, 4}, grad1[4] = {3, 2, 1, 0};
  float weights[2][4] = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  auto round = [&](bool frozen) {
    uint64_t h[2] = {};
    for (int r = 0; r < 2; ++r) {
      const float* g = r == 0 ? grad0 : grad1;
      ASSERT_EQ(frozen ? shardps_skip_round(job.w[r], "w", &h[r], err, sizeof(err))
                       : shardps_push_pull(job.w[r], "w", g, weights[r], 4, &h[r], err, sizeof(err)),
                SHARDPS_OK)
          << err;
    }
    for (int r = 0; r < 2; ++r) ASSERT_EQ(shardps_wait(job.w[r], h[r], 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  };
  round(false);
  float after_first[4];
  std::memcpy(after_first, weights[0], sizeof(after_first));
  round(true);
  EXPECT_EQ(std::memcmp(weights[0], after_first, sizeof(after_first)), 0);
  round(false);
  auto optimizer = Optimizer::Create(config.optimizer());
  ASSERT_TRUE(optimizer.ok());
  float expected[4] = {1, 1, 1, 1}, state[8] = {};
  const float sum[4] = {4, 4, 4, 4};
  for (uint64_t step = 0; step < 2; ++step) (*optimizer)->Apply(step, 0.5f, sum, expected, state, 4);
  EXPECT_EQ(std::memcmp(weights[0], expected, sizeof(expected)), 0) << weights[0][0] << " vs " << expected[0];
  EXPECT_EQ(std::memcmp(weights[1], expected, sizeof(expected)), 0);
}

TEST(CApiWeightDeltaTest, AWorkerThatSkippedARoundStillHoldsTheServersWeights) {
  // Weight-delta pulls (bf16): a round both workers skipped is acknowledged
  // with no weights, so it must send no delta either; what bf16 dropped from
  // the round before goes out with the next round that steps.
  ClusterConfig config = SyncSgd(0.5f);
  config.mutable_compression()->set_pull_codec("bf16");
  TwoWorkers job(config);
  ASSERT_TRUE(job.ok());
  constexpr int n = 256;  // the 16-bit codecs' minimum partition
  job.Define("w", n);
  char err[256] = "";
  std::vector<float> grad(n), weights[2] = {std::vector<float>(n), std::vector<float>(n)};
  auto round = [&](bool frozen) {
    uint64_t h[2] = {};
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(frozen ? shardps_skip_round(job.w[r], "w", &h[r], err, sizeof(err))
                       : shardps_push_pull(job.w[r], "w", grad.data(), weights[r].data(), n, &h[r], err, sizeof(err)),
                SHARDPS_OK)
          << err;
    }
    for (int r = 0; r < 2; ++r) ASSERT_EQ(shardps_wait(job.w[r], h[r], 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  };
  for (int i = 0; i < n; ++i) grad[i] = 0.1234567f * static_cast<float>(i + 1);
  round(false);
  round(true);
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (int k = 0; k < 3; ++k) round(false);
  std::vector<float> servers(n);  // a plain PULL returns the whole weights, raw
  uint64_t h = 0;
  ASSERT_EQ(shardps_pull(job.w[0], "w", servers.data(), n, &h, err, sizeof(err)), SHARDPS_OK) << err;
  ASSERT_EQ(shardps_wait(job.w[0], h, 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  for (int i = 0; i < n; ++i) {
    ASSERT_NEAR(weights[0][i], servers[i], 1e-6f) << i;
    ASSERT_EQ(weights[1][i], weights[0][i]) << i;
  }
}

TEST_F(CApiClusterTest, MeanGradientNeedsSumOnlyMode) {
  const int64_t shape[] = {4};
  ASSERT_EQ(shardps_declare_tensor(w_, "w", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  float grad[4] = {}, mean[4] = {};
  uint64_t h = 0;
  EXPECT_EQ(shardps_push_pull_mean_gradient(w_, "w", grad, mean, 4, &h, err_, sizeof(err_)),
            SHARDPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(err_), HasSubstr("not sum_only"));
}

TEST_F(CApiClusterTest, DeclaredCodecsCompressTheirTensorOnlyAndUnknownOnesAreRefused) {
  const int64_t shape[] = {256};  // one partition, the 16-bit codecs' minimum size
  ASSERT_EQ(shardps_declare_tensor_codec(w_, "a", shape, 1, SHARDPS_FLOAT32, "fp16", err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_codec(w_, "b", shape, 1, SHARDPS_FLOAT32, nullptr, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_codec(w_, "c", shape, 1, SHARDPS_FLOAT32, "zip", err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("tensor 'c' declares codec 'zip'"));
  ASSERT_EQ(shardps_reset_declared(w_, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_codec(w_, "a", shape, 1, SHARDPS_FLOAT32, "fp16", err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_codec(w_, "b", shape, 1, SHARDPS_FLOAT32, "", err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  std::vector<float> grad(256, 1.0f), a(256), b(256);
  shardps_worker_stats before{}, after_a{}, after_b{};
  ASSERT_EQ(shardps_stats(w_, &before, err_, sizeof(err_)), SHARDPS_OK);
  uint64_t h = 0;
  ASSERT_EQ(shardps_push_pull(w_, "a", grad.data(), a.data(), 256, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_stats(w_, &after_a, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_push_pull(w_, "b", grad.data(), b.data(), 256, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_stats(w_, &after_b, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(after_a.bytes_pushed - before.bytes_pushed, 256u * 2) << "fp16 on the wire";
  EXPECT_EQ(after_b.bytes_pushed - after_a.bytes_pushed, 256u * 4) << "raw float32";
  EXPECT_EQ(a[0], -0.5f);  // the server decoded fp16 and applied lr 0.5 * 1
  EXPECT_EQ(b[255], -0.5f);
}

TEST_F(CApiClusterTest, CudaPushPullSaysWhyItCannotTakeTheseBuffers) {
  const int64_t shape[] = {4};
  ASSERT_EQ(shardps_declare_tensor(w_, "g", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  float grad[4] = {}, weights[4] = {};
  uint64_t h = 0;
  const int rc = shardps_push_pull_cuda(w_, "g", grad, weights, sizeof(grad), SHARDPS_FLOAT32, nullptr, &h, err_,
                                        sizeof(err_));
  if (!CudaTransfersBuilt()) {
    EXPECT_EQ(rc, SHARDPS_UNIMPLEMENTED);
    EXPECT_THAT(std::string(err_), HasSubstr("built without CUDA"));
  } else if (!CudaTransferDevicePresent()) {
    EXPECT_EQ(rc, SHARDPS_FAILED_PRECONDITION);
    EXPECT_THAT(std::string(err_), HasSubstr("gradient: no usable CUDA device"));
  } else {
    EXPECT_EQ(rc, SHARDPS_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(err_), HasSubstr("gradient is not CUDA memory"));
  }
  EXPECT_EQ(shardps_push_pull_cuda(w_, "g", nullptr, weights, sizeof(grad), SHARDPS_FLOAT32, nullptr, &h, err_,
                                   sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
}

TEST_F(CApiClusterTest, CudaPushPullMovesDeviceTensorsOnTheStream) {
  if (!CudaTransferDevicePresent()) GTEST_SKIP() << "no CUDA device (built with CUDA: " << CudaTransfersBuilt() << ")";
#if SHARDPS_WITH_CUDA
  const int64_t shape[] = {600}, half_shape[] = {4};
  ASSERT_EQ(shardps_declare_tensor(w_, "w", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor_dtype(w_, "h", half_shape, 1, SHARDPS_FLOAT16, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  std::vector<float> init(600), grad(600, 2.0f);
  for (int i = 0; i < 600; ++i) init[i] = static_cast<float>(i);
  const float half_init[4] = {1, 2, 3, 4};
  ASSERT_EQ(shardps_init_tensor(w_, "w", init.data(), 600, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_init_tensor(w_, "h", half_init, 4, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float *d_grad = nullptr, *d_w = nullptr;
  uint16_t* d_half = nullptr;  // gradient (4), then weights (4)
  ASSERT_EQ(cudaMalloc(&d_grad, 600 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_w, 600 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_half, 8 * 2), cudaSuccess);
  const uint16_t half_host[8] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x4000, 0x4200, 0x4400};
  ASSERT_EQ(cudaMemcpyAsync(d_grad, grad.data(), 600 * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_w, init.data(), 600 * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_half, half_host, sizeof(half_host), cudaMemcpyHostToDevice, stream), cudaSuccess);
  uint64_t h = 0, hh = 0;
  ASSERT_EQ(shardps_push_pull_cuda(w_, "w", d_grad, d_w, 600 * 4, SHARDPS_FLOAT32, stream, &h, err_, sizeof(err_)),
            SHARDPS_OK)
      << err_;
  ASSERT_EQ(shardps_push_pull_cuda(w_, "h", d_half, d_half + 4, 8, SHARDPS_FLOAT16, stream, &hh, err_, sizeof(err_)),
            SHARDPS_OK)
      << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_wait(w_, hh, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  std::vector<float> got(600);
  uint16_t half_got[4] = {};
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d_w, 600 * 4, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(half_got, d_half + 4, 8, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < 600; ++i) ASSERT_EQ(got[i], init[i] - 1.0f) << i;  // lr 0.5 * gradient 2
  EXPECT_EQ(half_got[0], 0x3800);  // 1 - 0.5
  EXPECT_EQ(half_got[3], 0x4300);  // 4 - 0.5
  cudaFree(d_grad);
  cudaFree(d_w);
  cudaFree(d_half);
  cudaStreamDestroy(stream);
#endif
}

TEST_F(CApiClusterTest, ConfigTextAsksForABufferLargeEnough) {
  size_t needed = 0;
  ASSERT_EQ(shardps_config_text(w_, nullptr, 0, &needed, err_, sizeof(err_)), SHARDPS_OUT_OF_RANGE);
  EXPECT_THAT(std::string(err_), HasSubstr("needs"));
  std::vector<char> text(needed);
  ASSERT_EQ(shardps_config_text(w_, text.data(), text.size(), &needed, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(std::string(text.data()).size() + 1, needed);
  EXPECT_THAT(std::string(text.data()), HasSubstr("partition_bytes: 1024"));
}

TEST_F(CApiClusterTest, ConfigFieldReadsOneValueByItsPath) {
  size_t needed = 0;
  char out[256];
  ASSERT_EQ(shardps_config_field(w_, "partition_bytes", out, sizeof(out), &needed, err_, sizeof(err_)), SHARDPS_OK)
      << err_;
  EXPECT_STREQ(out, "1024");
  EXPECT_EQ(needed, 5u);
  ASSERT_EQ(shardps_config_field(w_, "consistency", out, sizeof(out), &needed, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_STREQ(out, "ASYNC");
  EXPECT_EQ(shardps_config_field(w_, "partition_bytes", out, 2, &needed, err_, sizeof(err_)), SHARDPS_OUT_OF_RANGE);
  EXPECT_EQ(needed, 5u);
  EXPECT_EQ(shardps_config_field(w_, "optimizer.lr", out, sizeof(out), &needed, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err_), HasSubstr("learning_rate"));  // names the fields that exist
}

TEST_F(CApiClusterTest, PushPullsEachPartitionAndCountsIt) {
  const int64_t shape[] = {600};
  ASSERT_EQ(shardps_declare_tensor(w_, "w", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  size_t count = 0;
  ASSERT_EQ(shardps_partitions(w_, "w", nullptr, 0, &count, err_, sizeof(err_)), SHARDPS_OUT_OF_RANGE);
  ASSERT_EQ(count, 3u);
  std::vector<shardps_partition> parts(count);
  ASSERT_EQ(shardps_partitions(w_, "w", parts.data(), parts.size(), &count, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_partitions(w_, "nope", parts.data(), parts.size(), &count, err_, sizeof(err_)),
            SHARDPS_NOT_FOUND);

  std::vector<float> grad(600, 1.0f), weights(600, 0.0f);
  uint64_t expected_offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_EQ(parts[i].offset, expected_offset);
    expected_offset += parts[i].num_elements;
    uint64_t h = 0;
    ASSERT_EQ(shardps_push_pull_partition(w_, "w", i, grad.data() + parts[i].offset,
                                          weights.data() + parts[i].offset, parts[i].num_elements, &h, err_,
                                          sizeof(err_)),
              SHARDPS_OK)
        << err_;
    ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  }
  EXPECT_EQ(expected_offset, 600u);
  EXPECT_EQ(weights[0], -0.5f);
  EXPECT_EQ(weights[599], -0.5f);
  shardps_worker_stats stats{};
  ASSERT_EQ(shardps_stats(w_, &stats, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(stats.requests, 3u);
  EXPECT_EQ(stats.bytes_pushed, 600u * sizeof(float));
  EXPECT_EQ(stats.bytes_pulled, 600u * sizeof(float));
}

}  // namespace
}  // namespace shardps
