#include "tools/train/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/train/fashion_mnist.h"

namespace shardps::train {
namespace {

using ::testing::ElementsAre;
using Tensors = std::vector<std::vector<float>>;

// Deterministic test inputs: values in [0, 1) with about a quarter exact
// zeros, like pixels and ReLU outputs.
std::vector<float> TestInputs(size_t n, uint32_t seed) {
  std::vector<float> x(n);
  uint32_t s = seed;
  for (float& v : x) {
    s = s * 1664525u + 1013904223u;
    v = (s >> 30) == 0 ? 0.0f : static_cast<float>(s >> 8) / 16777216.0f;
  }
  return x;
}

std::vector<uint8_t> TestLabels(int n, int classes) {
  std::vector<uint8_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>((i * 7 + 3) % classes);
  return labels;
}

Mlp MakeMlp(std::vector<int> layers, int threads = 1, uint64_t seed = 1) {
  absl::StatusOr<Mlp> mlp = Mlp::Create(std::move(layers), threads);
  EXPECT_TRUE(mlp.ok()) << mlp.status();
  mlp->InitParams(seed);
  return *std::move(mlp);
}

bool BitwiseEqual(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].size() != b[t].size() ||
        std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

TEST(MlpTest, CreateRejectsBadShapes) {
  EXPECT_EQ(Mlp::Create({784}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({784, 0, 10}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({784, 10}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MlpTest, TensorsAreNamedAndOrderedLikePyTorch) {
  absl::StatusOr<Mlp> mlp = Mlp::Create();
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const std::vector<TensorShape>& t = mlp->tensors();
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].name, "fc1.weight");
  EXPECT_THAT(t[0].dims, ElementsAre(256, 784));
  EXPECT_EQ(t[0].numel, 256u * 784u);
  EXPECT_EQ(t[1].name, "fc1.bias");
  EXPECT_THAT(t[1].dims, ElementsAre(256));
  EXPECT_EQ(t[4].name, "fc3.weight");
  EXPECT_THAT(t[4].dims, ElementsAre(10, 128));
  EXPECT_EQ(t[5].name, "fc3.bias");
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(mlp->params()[i].size(), t[i].numel);
}

TEST(MlpTest, InitParamsIsSeededHeUniformWithZeroBiases) {
  Mlp a = MakeMlp({784, 256, 10}, 1, 5);
  Mlp b = MakeMlp({784, 256, 10}, 1, 5);
  Mlp c = MakeMlp({784, 256, 10}, 1, 6);
  EXPECT_TRUE(BitwiseEqual(a.params(), b.params()));
  EXPECT_FALSE(BitwiseEqual(a.params(), c.params()));
  const float bound = std::sqrt(6.0f / 784.0f);
  float max_abs = 0.0f;
  for (float w : a.params()[0]) max_abs = std::max(max_abs, std::fabs(w));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.99f * bound);
  EXPECT_THAT(a.params()[1], ::testing::Each(0.0f));
}

TEST(MlpTest, GradientMatchesFiniteDifferences) {
  constexpr int kBatch = 4;
  Mlp mlp = MakeMlp({6, 7, 5, 3}, 1, 3);
  for (std::vector<float>& bias : mlp.params()) {  // Non-zero biases get checked too.
    for (size_t i = 0; i < bias.size() && bias.size() < 10; ++i) bias[i] = 0.05f * (i % 3);
  }
  const std::vector<float> x = TestInputs(kBatch * 6, 11);
  const std::vector<uint8_t> labels = TestLabels(kBatch, 3);
  Tensors grads;
  Tensors scratch;
  mlp.ForwardBackward(x.data(), labels.data(), kBatch, &grads);
  constexpr float kEps = 1e-3f;
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < grads[t].size(); ++i) {
      float& p = mlp.params()[t][i];
      const float saved = p;
      p = saved + kEps;
      const float plus = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &scratch);
      p = saved - kEps;
      const float minus = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &scratch);
      p = saved;
      const float numeric = (plus - minus) / (2 * kEps);
      EXPECT_NEAR(grads[t][i], numeric, 5e-4f + 1e-2f * std::fabs(numeric))
          << mlp.tensors()[t].name << "[" << i << "]";
    }
  }
}

TEST(MlpTest, SgdStepsReduceLossOnRealImages) {
  if (!std::filesystem::exists(kFashionMnistDir)) GTEST_SKIP() << kFashionMnistDir << " absent";
  absl::StatusOr<Dataset> data = LoadFashionMnist(kFashionMnistDir, Split::kTrain, 512);
  ASSERT_TRUE(data.ok()) << data.status();
  Mlp mlp = MakeMlp(Mlp::DefaultLayers(), 1, 1);
  double loss_before = 0.0;
  const double accuracy_before = mlp.Evaluate(*data, &loss_before);
  constexpr int kBatch = 64;
  constexpr float kLearningRate = 0.05f;
  Tensors grads;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (size_t begin = 0; begin < data->size(); begin += kBatch) {
      mlp.ForwardBackward(data->image(begin), data->labels.data() + begin, kBatch, &grads);
      for (size_t t = 0; t < grads.size(); ++t) {
        for (size_t i = 0; i < grads[t].size(); ++i) {
          mlp.params()[t][i] -= kLearningRate * grads[t][i];
        }
      }
    }
  }
  double loss_after = 0.0;
  const double accuracy_after = mlp.Evaluate(*data, &loss_after);
  EXPECT_LT(loss_after, 0.6 * loss_before);
  EXPECT_GT(accuracy_after, accuracy_before + 0.3);
}

TEST(MlpTest, ForwardBackwardIsBitwiseRepeatable) {
  constexpr int kBatch = 33;
  Mlp mlp = MakeMlp(Mlp::DefaultLayers());
  const std::vector<float> x = TestInputs(kBatch * 784, 5);
  const std::vector<uint8_t> labels = TestLabels(kBatch, 10);
  Tensors first, second;
  const float loss1 = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &first);
  const float loss2 = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &second);
  EXPECT_EQ(std::memcmp(&loss1, &loss2, sizeof(float)), 0);
  EXPECT_TRUE(BitwiseEqual(first, second));
}

TEST(MlpTest, ForwardBackwardIsBitwiseIdenticalForAnyThreadCount) {
  constexpr int kBatch = 37;  // Splits unevenly among threads.
  const std::vector<float> x = TestInputs(kBatch * 784, 9);
  const std::vector<uint8_t> labels = TestLabels(kBatch, 10);
  Mlp reference = MakeMlp(Mlp::DefaultLayers(), 1);
  Tensors expected;
  const float expected_loss = reference.ForwardBackward(x.data(), labels.data(), kBatch, &expected);
  for (int threads : {2, 3, 4}) {
    Mlp mlp = MakeMlp(Mlp::DefaultLayers(), threads);
    Tensors grads;
    const float loss = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &grads);
    EXPECT_EQ(std::memcmp(&loss, &expected_loss, sizeof(float)), 0) << threads << " threads";
    EXPECT_TRUE(BitwiseEqual(grads, expected)) << threads << " threads";
  }
}

// A pipelined step: each tensor's weights may arrive only at its await hook
// and be overwritten (the next round's answer) from its computed hook on,
// and the step still computes exactly the plain step's loss and gradients.
TEST(MlpTest, HookedStepReadsEachTensorOnlyBetweenItsAwaitAndComputedHooks) {
  constexpr int kBatch = 19;
  const std::vector<float> x = TestInputs(kBatch * 784, 13);
  const std::vector<uint8_t> labels = TestLabels(kBatch, 10);
  Mlp plain = MakeMlp(Mlp::DefaultLayers());
  Tensors expected;
  const float expected_loss = plain.ForwardBackward(x.data(), labels.data(), kBatch, &expected);

  Mlp hooked = MakeMlp(Mlp::DefaultLayers(), 1, /*seed=*/99);  // other weights until they "arrive"
  std::vector<size_t> awaited, computed;
  auto await = [&](size_t t) {
    awaited.push_back(t);
    hooked.params()[t] = plain.params()[t];
    return absl::OkStatus();
  };
  auto done = [&](size_t t) {
    computed.push_back(t);
    std::fill(hooked.params()[t].begin(), hooked.params()[t].end(), std::nanf(""));
    return absl::OkStatus();
  };
  Tensors grads;
  absl::StatusOr<float> loss = hooked.ForwardBackward(x.data(), labels.data(), kBatch, &grads, {await, done});
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(std::memcmp(&*loss, &expected_loss, sizeof(float)), 0);
  EXPECT_TRUE(BitwiseEqual(grads, expected));
  EXPECT_THAT(awaited, ElementsAre(0, 1, 2, 3, 4, 5));   // first layer first
  EXPECT_THAT(computed, ElementsAre(4, 5, 2, 3, 0, 1));  // last layer first
}

TEST(MlpTest, HookErrorStopsTheStepAndIsReturned) {
  constexpr int kBatch = 4;
  const std::vector<float> x = TestInputs(kBatch * 784, 3);
  const std::vector<uint8_t> labels = TestLabels(kBatch, 10);
  Mlp mlp = MakeMlp(Mlp::DefaultLayers());
  int computed = 0;
  auto await = [](size_t t) {
    return t == 2 ? absl::DeadlineExceededError("fc2.weight did not arrive") : absl::OkStatus();
  };
  auto done = [&](size_t) {
    ++computed;
    return absl::OkStatus();
  };
  Tensors grads;
  absl::StatusOr<float> loss = mlp.ForwardBackward(x.data(), labels.data(), kBatch, &grads, {await, done});
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(computed, 0);
}

TEST(MlpTest, EvaluateLossMatchesForwardBackwardLoss) {
  constexpr int kBatch = 50;
  Dataset data;
  data.images = TestInputs(kBatch * kImagePixels, 3);
  data.labels = TestLabels(kBatch, kNumClasses);
  Mlp mlp = MakeMlp(Mlp::DefaultLayers());
  Tensors grads;
  const float loss = mlp.ForwardBackward(data.image(0), data.labels.data(), kBatch, &grads);
  double eval_loss = 0.0;
  const double accuracy = mlp.Evaluate(data, &eval_loss);
  EXPECT_EQ(static_cast<float>(eval_loss), loss);
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
}

}  // namespace
}  // namespace shardps::train
