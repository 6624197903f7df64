// StepPipeline against a real scheduler and server: each tensor's push-pull
// is awaited on its own, so a forward pass can use the first layer's weights
// while a later layer's round is still open.
#include "tools/step_pipeline.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/tensor_spec.h"
#include "tests/test_cluster.h"
#include "worker/worker.h"

namespace shardps {
namespace {

constexpr int kElements = 300;

ClusterConfig TwoWorkerSgd() {
  ClusterConfig c;
  c.set_num_servers(1);
  c.set_num_workers(2);
  c.set_consistency(SYNC);
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(0.5f);
  c.set_rendezvous_timeout_ms(20000);
  return c;
}

// Both workers of a started cluster, each having declared fc1 and fc2 (rank 0
// set them to 1.0).
std::vector<std::unique_ptr<Worker>> JoinTwoWorkers(const TestCluster& cluster) {
  std::vector<std::unique_ptr<Worker>> workers(2);
  auto join = [&](uint32_t rank) {
    auto w = Worker::Create({.scheduler_address = cluster.scheduler_address(), .rank = rank});
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return;
    EXPECT_TRUE((*w)->DefineTensors({Float32Tensor("fc1", kElements), Float32Tensor("fc2", kElements)}).ok());
    workers[rank] = *std::move(w);
  };
  std::thread other(join, 1);
  join(0);
  other.join();
  if (workers[0] == nullptr || workers[1] == nullptr) return {};
  const std::vector<float> ones(kElements, 1.0f);
  for (const char* name : {"fc1", "fc2"}) EXPECT_TRUE(workers[0]->InitTensor(name, ones, absl::Seconds(10)).ok());
  return workers;
}

void PushPullAndWait(Worker& worker, const std::string& name, const std::vector<float>& gradient) {
  std::vector<float> weights(gradient.size());
  auto h = worker.PushPull(name, gradient, absl::MakeSpan(weights));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(worker.Wait(*h, absl::Seconds(10)).ok());
}

// A sync cluster of one server and two workers; rank 0's weights of fc1 and
// fc2 land in params_ (zero until an answer arrives).
class StepPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = TestCluster::Start(TwoWorkerSgd());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    workers_ = JoinTwoWorkers(*cluster_);
    ASSERT_EQ(workers_.size(), 2u);
  }

  const std::vector<float> gradient_ = std::vector<float>(kElements, 1.0f);
  std::vector<std::vector<float>> params_ = std::vector<std::vector<float>>(2, std::vector<float>(kElements, 0.0f));
  std::unique_ptr<TestCluster> cluster_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(StepPipelineTest, FirstLayerArrivesWhileTheLastLayersSyncRoundIsStillOpen) {
  StepPipeline pipeline(*workers_[0], {"fc1", "fc2"}, params_, absl::Seconds(10));
  // Rank 0's backward order: fc2's gradient first, then fc1's.
  ASSERT_TRUE(pipeline.Push(1, gradient_).ok());
  ASSERT_TRUE(pipeline.Push(0, gradient_).ok());
  EXPECT_EQ(pipeline.Push(0, gradient_).code(), absl::StatusCode::kFailedPrecondition);
  // Rank 1 has pushed fc1 only: fc1's round is complete, fc2's is not.
  PushPullAndWait(*workers_[1], "fc1", gradient_);

  ASSERT_TRUE(pipeline.Await(0).ok());
  EXPECT_FLOAT_EQ(params_[0][0], 0.5f);  // 1 - 0.5 x mean(1, 1)
  EXPECT_FLOAT_EQ(params_[0][kElements - 1], 0.5f);
  EXPECT_EQ(pipeline.in_flight(), 1u);
  EXPECT_EQ(params_[1][0], 0.0f) << "fc2 arrived before its round was complete";

  PushPullAndWait(*workers_[1], "fc2", gradient_);
  ASSERT_TRUE(pipeline.Await(1).ok());
  EXPECT_FLOAT_EQ(params_[1][0], 0.5f);
  EXPECT_EQ(pipeline.in_flight(), 0u);
}

TEST_F(StepPipelineTest, AwaitPastTheDeadlineNamesTheTensor) {
  StepPipeline pipeline(*workers_[0], {"fc1", "fc2"}, params_, absl::Milliseconds(300));
  ASSERT_TRUE(pipeline.Push(1, gradient_).ok());
  // Rank 1 never pushes fc2: its sync round cannot complete.
  absl::Status s = pipeline.Await(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("fc2"), std::string::npos) << s;
  EXPECT_EQ(pipeline.in_flight(), 0u);
}

}  // namespace
}  // namespace shardps
