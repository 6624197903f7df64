#include "tools/train/mlp.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "tools/train/dense_ops.h"

namespace shardps::train {
namespace {

constexpr int kMaxWidth = 1 << 16;
constexpr int kEvalBatch = 256;

// splitmix64 (Steele, Lea, Flood 2014): a tiny PRNG fully defined by its
// integer arithmetic, so parameter values are the same on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1): the top 24 bits, exactly representable as a float.
  float NextUnit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t state_;
};

}  // namespace

absl::StatusOr<Mlp> Mlp::Create(std::vector<int> layers, int num_threads) {
  if (layers.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("an MLP needs at least 2 layer widths, got ", layers.size()));
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l] < 1 || layers[l] > kMaxWidth) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " has width ", layers[l], ", expected [1, ", kMaxWidth, "]"));
    }
  }
  if (num_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_threads must be >= 1, got ", num_threads));
  }
  return Mlp(std::move(layers), num_threads);
}

Mlp::Mlp(std::vector<int> layers, int num_threads)
    : layers_(std::move(layers)), num_threads_(num_threads) {
  for (int l = 0; l < num_layers(); ++l) {
    const int in = layers_[l];
    const int out = layers_[l + 1];
    const std::string prefix = absl::StrCat("fc", l + 1);
    tensors_.push_back({prefix + ".weight", {out, in}, static_cast<size_t>(out) * in});
    tensors_.push_back({prefix + ".bias", {out}, static_cast<size_t>(out)});
    wt_.emplace_back(static_cast<size_t>(out) * in);
  }
  for (const TensorShape& t : tensors_) params_.emplace_back(t.numel, 0.0f);
  acts_.resize(num_layers());
}

void Mlp::InitParams(uint64_t seed) {
  SplitMix64 rng(seed);
  for (int l = 0; l < num_layers(); ++l) {
    const float bound = static_cast<float>(std::sqrt(6.0 / layers_[l]));
    for (float& w : params_[2 * l]) w = (2.0f * rng.NextUnit() - 1.0f) * bound;
    std::fill(params_[2 * l + 1].begin(), params_[2 * l + 1].end(), 0.0f);
  }
}

template <typename Fn>
void Mlp::ParallelRows(int rows, Fn fn) const {
  const int threads = std::min(num_threads_, rows);
  if (threads <= 1) {
    fn(0, rows);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) {
    workers.emplace_back(fn, rows * t / threads, rows * (t + 1) / threads);
  }
  fn(0, rows / threads);
  for (std::thread& w : workers) w.join();
}

absl::Status Mlp::Forward(const float* images, int batch, const StepHooks* hooks) {
  const float* x = images;
  for (int l = 0; l < num_layers(); ++l) {
    if (hooks != nullptr) {
      const size_t w = 2 * static_cast<size_t>(l);
      for (size_t t : {w, w + 1}) {
        if (absl::Status s = hooks->await(t); !s.ok()) return s;
      }
    }
    const int in = layers_[l];
    const int out = layers_[l + 1];
    const bool relu = l + 1 < num_layers();
    TransposeWeights(params_[2 * l].data(), out, in, wt_[l].data());
    acts_[l].resize(static_cast<size_t>(batch) * out);
    float* y = acts_[l].data();
    const float* wt = wt_[l].data();
    const float* bias = params_[2 * l + 1].data();
    ParallelRows(batch, [=](int r0, int r1) { AffineRows(x, wt, bias, in, out, relu, r0, r1, y); });
    x = y;
  }
  return absl::OkStatus();
}

double Mlp::SoftmaxCrossEntropy(const uint8_t* labels, int batch, float scale,
                                float* dlogits) const {
  const int classes = layers_.back();
  double total = 0.0;
  for (int r = 0; r < batch; ++r) {
    CHECK_LT(labels[r], classes) << "label of sample " << r << " is not a class id";
    const float* z = acts_.back().data() + static_cast<size_t>(r) * classes;
    const float max = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - max);
    const float log_sum = std::log(sum);
    total += static_cast<double>(max + log_sum - z[labels[r]]);
    if (dlogits == nullptr) continue;
    float* d = dlogits + static_cast<size_t>(r) * classes;
    for (int j = 0; j < classes; ++j) {
      const float p = std::exp(z[j] - max) / sum;
      d[j] = (p - (j == labels[r] ? 1.0f : 0.0f)) * scale;
    }
  }
  return total;
}

absl::Status Mlp::Backward(const float* images, int batch, std::vector<std::vector<float>>* grads,
                           const StepHooks* hooks) {
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int in = layers_[l];
    const int out = layers_[l + 1];
    const float* x = l == 0 ? images : acts_[l - 1].data();
    const float* dy = delta_.data();
    float* dw = (*grads)[2 * l].data();
    float* db = (*grads)[2 * l + 1].data();
    ParallelRows(out,
                 [=](int o0, int o1) { WeightGradRows(dy, x, batch, out, in, o0, o1, dw, db); });
    if (l > 0) {
      delta_next_.resize(static_cast<size_t>(batch) * in);
      const float* w = params_[2 * l].data();
      float* dx = delta_next_.data();
      ParallelRows(batch, [=](int r0, int r1) { BackpropInputRows(dy, w, x, out, in, r0, r1, dx); });
      std::swap(delta_, delta_next_);
    }
    // Layer l's weights were read for the last time just above.
    if (hooks != nullptr) {
      const size_t w = 2 * static_cast<size_t>(l);
      for (size_t t : {w, w + 1}) {
        if (absl::Status s = hooks->computed(t); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

float Mlp::ForwardBackward(const float* images, const uint8_t* labels, int batch,
                           std::vector<std::vector<float>>* grads) {
  return *Step(images, labels, batch, grads, nullptr);  // no hooks: nothing can fail
}

absl::StatusOr<float> Mlp::ForwardBackward(const float* images, const uint8_t* labels, int batch,
                                           std::vector<std::vector<float>>* grads, const StepHooks& hooks) {
  return Step(images, labels, batch, grads, &hooks);
}

absl::StatusOr<float> Mlp::Step(const float* images, const uint8_t* labels, int batch,
                                std::vector<std::vector<float>>* grads, const StepHooks* hooks) {
  CHECK_GE(batch, 1);
  grads->resize(params_.size());
  for (size_t t = 0; t < params_.size(); ++t) (*grads)[t].resize(params_[t].size());
  if (absl::Status s = Forward(images, batch, hooks); !s.ok()) return s;
  delta_.resize(static_cast<size_t>(batch) * layers_.back());
  const float scale = 1.0f / static_cast<float>(batch);
  const double total = SoftmaxCrossEntropy(labels, batch, scale, delta_.data());
  if (absl::Status s = Backward(images, batch, grads, hooks); !s.ok()) return s;
  return static_cast<float>(total / batch);
}

double Mlp::Evaluate(const Dataset& data, double* mean_loss) {
  CHECK_EQ(layers_.front(), kImagePixels);
  CHECK_GE(layers_.back(), kNumClasses);
  const int classes = layers_.back();
  size_t correct = 0;
  double total_loss = 0.0;
  for (size_t begin = 0; begin < data.size(); begin += kEvalBatch) {
    const int batch = static_cast<int>(std::min<size_t>(kEvalBatch, data.size() - begin));
    Forward(data.image(begin), batch).IgnoreError();  // no hooks: cannot fail
    total_loss += SoftmaxCrossEntropy(data.labels.data() + begin, batch, 0.0f, nullptr);
    for (int r = 0; r < batch; ++r) {
      const float* z = acts_.back().data() + static_cast<size_t>(r) * classes;
      correct += (std::max_element(z, z + classes) - z) == data.labels[begin + r];
    }
  }
  const double n = static_cast<double>(data.size());
  if (mean_loss != nullptr) *mean_loss = data.size() == 0 ? 0.0 : total_loss / n;
  return data.size() == 0 ? 0.0 : static_cast<double>(correct) / n;
}

}  // namespace shardps::train
