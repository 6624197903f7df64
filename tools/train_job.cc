#include "tools/train_job.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "scheduler/shard_assignment.h"
#include "server/optimizer.h"
#include "tools/train/fashion_mnist.h"
#include "tools/train/mlp.h"

namespace shardps {
namespace {

using train::Dataset;
using train::Mlp;

struct Data {
  Dataset train, test;
};

absl::StatusOr<Data> LoadData(const TrainOptions& o) {
  Data d;
  SHARDPS_ASSIGN_OR_RETURN(d.train, train::LoadFashionMnist(o.data_dir, train::Split::kTrain, o.train_limit));
  SHARDPS_ASSIGN_OR_RETURN(d.test, train::LoadFashionMnist(o.data_dir, train::Split::kTest, o.test_limit));
  return d;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Steps per epoch: the same on every rank (the smallest shard decides).
int StepsPerEpoch(size_t n, int world, int batch) { return static_cast<int>((n / world) / batch); }

void Progress(std::ostream& log, const TrainOptions& o, int epoch, int64_t step, float loss, int64_t samples,
              double seconds) {
  if (o.log_every <= 0 || step % o.log_every != 0) return;
  log << absl::StrFormat("epoch %d step %d loss %.4f samples/s %.0f\n", epoch + 1, step, loss,
                         seconds > 0 ? samples / seconds : 0.0)
      << std::flush;
}

std::vector<TensorSpec> Specs(const Mlp& model) {
  std::vector<TensorSpec> specs;
  for (const auto& t : model.tensors()) {
    TensorSpec s;
    s.set_name(t.name);
    for (int d : t.dims) s.add_shape(d);
    s.set_dtype(FLOAT32);
    specs.push_back(std::move(s));
  }
  return specs;
}

absl::Status SyncAll(Worker& worker, const Mlp& model, std::vector<std::vector<float>>& params,
                     const std::vector<std::vector<float>>* grads, absl::Duration timeout) {
  std::vector<Worker::Handle> handles;
  absl::Status first;
  for (size_t t = 0; t < params.size(); ++t) {
    const std::string& name = model.tensors()[t].name;
    auto h = grads ? worker.PushPull(name, (*grads)[t], absl::MakeSpan(params[t]))
                   : worker.Pull(name, absl::MakeSpan(params[t]));
    if (!h.ok()) {
      first = h.status();
      break;
    }
    handles.push_back(*h);
  }
  for (Worker::Handle h : handles) {
    absl::Status s = worker.Wait(h, timeout);
    if (first.ok()) first = s;
  }
  return first;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseLayers(const std::string& hidden) {
  std::vector<int> layers = {train::kImagePixels};
  for (absl::string_view part : absl::StrSplit(hidden, ',', absl::SkipEmpty())) {
    int width;
    if (!absl::SimpleAtoi(part, &width) || width <= 0 || width > 65536) {
      return absl::InvalidArgumentError(absl::StrCat("hidden layer width '", std::string(part),
                                                     "' is not an integer in [1, 65536]"));
    }
    layers.push_back(width);
  }
  layers.push_back(train::kNumClasses);
  return layers;
}

absl::StatusOr<TrainResult> RunTrainingWorker(Worker& worker, const TrainOptions& o, std::ostream& log) {
  SHARDPS_ASSIGN_OR_RETURN(Data data, LoadData(o));
  SHARDPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(o.layers));
  SHARDPS_RETURN_IF_ERROR(worker.DefineTensors(Specs(model)));
  auto& params = model.params();
  if (worker.rank() == 0) {
    model.InitParams(o.seed);
    for (size_t t = 0; t < params.size(); ++t) {
      SHARDPS_RETURN_IF_ERROR(worker.InitTensor(model.tensors()[t].name, params[t], o.step_timeout));
    }
  }
  SHARDPS_RETURN_IF_ERROR(worker.Barrier("init"));
  SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, nullptr, o.step_timeout));

  const int world = static_cast<int>(worker.config().num_workers());
  const int steps_per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size);
  if (steps_per_epoch == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
  std::vector<std::vector<float>> grads;
  std::vector<float> images;
  std::vector<uint8_t> labels;
  TrainResult result;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    std::vector<uint32_t> order = train::ShardIndices(data.train.size(), worker.rank(), world, o.seed, epoch);
    for (int s = 0; s < steps_per_epoch; ++s) {
      if (o.max_steps > 0 && result.steps >= o.max_steps) break;
      train::GatherBatch(data.train, absl::MakeConstSpan(order).subspan(s * o.batch_size, o.batch_size), &images,
                         &labels);
      result.final_loss = model.ForwardBackward(images.data(), labels.data(), o.batch_size, &grads);
      SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, &grads, o.step_timeout));
      ++result.steps;
      result.samples += o.batch_size;
      Progress(log, o, epoch, result.steps, result.final_loss, result.samples, Seconds(start));
    }
  }
  result.wall_seconds = Seconds(start);
  // Everyone finishes, then evaluates the same (latest) weights.
  SHARDPS_RETURN_IF_ERROR(worker.Barrier("done"));
  SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, nullptr, o.step_timeout));
  result.test_accuracy = model.Evaluate(data.test);
  WorkerStats stats = worker.stats();
  result.bytes_pushed = stats.bytes_pushed;
  result.bytes_pulled = stats.bytes_pulled;
  result.params = params;
  return result;
}

absl::StatusOr<TrainResult> RunReference(const ClusterConfig& config, const TrainOptions& o, std::ostream& log) {
  SHARDPS_ASSIGN_OR_RETURN(Data data, LoadData(o));
  SHARDPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(o.layers));
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(config.optimizer()));
  model.InitParams(o.seed);
  auto& params = model.params();
  std::vector<std::vector<float>> state(params.size());
  for (size_t t = 0; t < params.size(); ++t) state[t].assign(optimizer->state_slots() * params[t].size(), 0.0f);

  const int world = static_cast<int>(config.num_workers());
  const int steps_per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size);
  if (steps_per_epoch == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
  std::vector<std::vector<std::vector<float>>> grads(world);
  std::vector<float> images, sum;
  std::vector<uint8_t> labels;
  TrainResult result;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    std::vector<std::vector<uint32_t>> orders(world);
    for (int r = 0; r < world; ++r) orders[r] = train::ShardIndices(data.train.size(), r, world, o.seed, epoch);
    for (int s = 0; s < steps_per_epoch; ++s) {
      if (o.max_steps > 0 && result.steps >= o.max_steps) break;
      for (int r = 0; r < world; ++r) {
        train::GatherBatch(data.train, absl::MakeConstSpan(orders[r]).subspan(s * o.batch_size, o.batch_size),
                           &images, &labels);
        float loss = model.ForwardBackward(images.data(), labels.data(), o.batch_size, &grads[r]);
        if (r == 0) result.final_loss = loss;
      }
      for (size_t t = 0; t < params.size(); ++t) {
        // The server's aggregation: g_0, then += g_1, ... in rank order, scaled by 1/W.
        sum = grads[0][t];
        for (int r = 1; r < world; ++r) AddInto(sum.data(), grads[r][t].data(), sum.size());
        optimizer->Apply(result.steps, 1.0f / static_cast<float>(world), sum.data(), params[t].data(),
                         state[t].data(), params[t].size());
      }
      ++result.steps;
      result.samples += static_cast<int64_t>(o.batch_size) * world;
      Progress(log, o, epoch, result.steps, result.final_loss, result.samples, Seconds(start));
    }
  }
  result.wall_seconds = Seconds(start);
  result.test_accuracy = model.Evaluate(data.test);
  result.params = params;
  return result;
}

}  // namespace shardps
