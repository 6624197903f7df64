// Mlp: the example model ShardPS trains, a multi-layer perceptron with ReLU
// hidden layers and a softmax cross-entropy loss, computed on the CPU in fp32.
//
// Parameters are flat fp32 tensors in a fixed order, named as PyTorch would:
// "fc1.weight" (out x in, row-major), "fc1.bias", "fc2.weight", ... so a
// worker can push/pull them tensor by tensor. ForwardBackward returns the
// gradient of the batch-mean loss in the same order; no optimizer lives here.
//
// Determinism: every output element is summed in one fixed order whatever the
// thread count, and the project builds with -ffp-contract=off, so losses and
// gradients are bitwise identical across calls, thread counts and machines
// running the same binary. With num_threads > 1 each kernel splits its output
// rows among short-lived std::threads; the default (1) runs inline and, once
// warmed up, allocates nothing per call.
//
// Ownership: an Mlp owns its parameters and scratch buffers; copyable, movable.
// Thread safety: not thread-safe; ForwardBackward and Evaluate write scratch
// state, so use one Mlp per thread.
#ifndef SHARDPS_TOOLS_TRAIN_MLP_H_
#define SHARDPS_TOOLS_TRAIN_MLP_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "tools/train/fashion_mnist.h"
#include "tools/train/tensor_shape.h"

namespace shardps::train {

class Mlp {
 public:
  // Layer widths, input first: 784 pixels, two hidden layers, 10 classes.
  static std::vector<int> DefaultLayers() { return {784, 256, 128, 10}; }

  // Returns an Mlp with zeroed parameters (call InitParams), or
  // InvalidArgument unless there are >= 2 layers, each width in [1, 65536],
  // and num_threads >= 1.
  static absl::StatusOr<Mlp> Create(std::vector<int> layers = DefaultLayers(), int num_threads = 1);

  const std::vector<int>& layers() const { return layers_; }
  int num_threads() const { return num_threads_; }
  // Name, dims and element count of each parameter tensor, in params() order.
  const std::vector<TensorShape>& tensors() const { return tensors_; }
  // The parameters; callers may overwrite values but not resize tensors.
  std::vector<std::vector<float>>& params() { return params_; }
  const std::vector<std::vector<float>>& params() const { return params_; }

  // He/Kaiming-uniform weights, U(-sqrt(6/fan_in), sqrt(6/fan_in)), drawn from
  // a splitmix64 stream seeded with `seed` (same values on every platform);
  // zero biases.
  void InitParams(uint64_t seed);

  // Runs `batch` samples (images: batch x layers().front(), labels: batch
  // class ids) forward and backward. Returns the mean cross-entropy loss and
  // stores its gradient w.r.t. each parameter tensor in *grads (resized to
  // match params(); existing storage reused).
  // REQUIRES: batch >= 1, each label < layers().back().
  float ForwardBackward(const float* images, const uint8_t* labels, int batch,
                        std::vector<std::vector<float>>* grads);

  // Where a pipelined step meets the network (parameter tensor indices, as in
  // tensors()). `await(t)` runs before the forward pass first reads params()[t],
  // first layer first, and may block until those weights have arrived.
  // `computed(t)` runs once (*grads)[t] is final and the step will read
  // neither it nor params()[t] again, last layer first, before the layers
  // below are back-propagated: the caller may send the gradient and let the
  // answer overwrite params()[t]. A hook's error stops the step and is
  // returned. The arithmetic is that of the overload above, bit for bit.
  struct StepHooks {
    absl::FunctionRef<absl::Status(size_t tensor)> await;
    absl::FunctionRef<absl::Status(size_t tensor)> computed;
  };
  absl::StatusOr<float> ForwardBackward(const float* images, const uint8_t* labels, int batch,
                                        std::vector<std::vector<float>>* grads, const StepHooks& hooks);

  // Returns the accuracy on `data` (forward passes in batches), and the mean
  // loss in *mean_loss when non-null. An empty dataset gives 0 and loss 0.
  // REQUIRES: layers().front() == kImagePixels, layers().back() >= kNumClasses.
  double Evaluate(const Dataset& data, double* mean_loss = nullptr);

 private:
  Mlp(std::vector<int> layers, int num_threads);

  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }
  // Both ForwardBackward overloads; `hooks` may be null (then it cannot fail).
  absl::StatusOr<float> Step(const float* images, const uint8_t* labels, int batch,
                             std::vector<std::vector<float>>* grads, const StepHooks* hooks);
  // Fills acts_ with every layer's output for `batch` rows of `images`;
  // calls hooks->await (when non-null) before each layer reads its tensors.
  absl::Status Forward(const float* images, int batch, const StepHooks* hooks = nullptr);
  // Softmax cross-entropy of the logits in acts_.back(); returns the summed
  // (not mean) loss. If dlogits is non-null, writes d(sum loss)/d(logits) * scale.
  double SoftmaxCrossEntropy(const uint8_t* labels, int batch, float scale, float* dlogits) const;
  // Backpropagates dlogits_ through every layer into *grads; calls
  // hooks->computed (when non-null) as each layer's tensors are done.
  absl::Status Backward(const float* images, int batch, std::vector<std::vector<float>>* grads,
                        const StepHooks* hooks = nullptr);
  // Runs fn(begin, end) over [0, rows) split among num_threads_.
  template <typename Fn>
  void ParallelRows(int rows, Fn fn) const;

  std::vector<int> layers_;
  int num_threads_;
  std::vector<TensorShape> tensors_;
  std::vector<std::vector<float>> params_;
  // Scratch reused across calls: acts_[l] = output of layer l (batch x
  // layers_[l+1], after ReLU for hidden layers), wt_[l] = fc(l+1).weight
  // transposed, delta_/delta_next_ = loss gradient w.r.t. a layer's output.
  std::vector<std::vector<float>> acts_;
  std::vector<std::vector<float>> wt_;
  std::vector<float> delta_;
  std::vector<float> delta_next_;
};

}  // namespace shardps::train

#endif  // SHARDPS_TOOLS_TRAIN_MLP_H_
