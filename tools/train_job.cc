#include "tools/train_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include <openssl/evp.h>
#include "common/config.h"
#include "common/tensor_spec.h"
#include "common/status_macros.h"
#include "scheduler/shard_assignment.h"
#include "common/optimizer.h"
#include "tools/train/fashion_mnist.h"
#include "tools/step_pipeline.h"
#include "tools/train/mlp.h"
#include "worker/local_tier/device.h"
#include "worker/local_tier/device_group.h"

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

// Runs `call`, adding the time it took to `wait_seconds` (TrainResult).
absl::Status TimeBlocked(double& wait_seconds, absl::FunctionRef<absl::Status()> call) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = call();
  wait_seconds += Seconds(start);
  return s;
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
    specs.push_back(Float32Tensor(t.name, std::vector<int64_t>(t.dims.begin(), t.dims.end())));
  }
  return specs;
}

// Declares the model's tensors, lets rank 0 set the initial weights and waits
// for every worker.
absl::Status JoinJob(Worker& worker, Mlp& model, const TrainOptions& o) {
  SHARDPS_RETURN_IF_ERROR(worker.DefineTensors(Specs(model)));
  // Whether the job passed the "init" barrier decides, not the join round:
  // once it passed the weights are set, and nobody enters it again; before,
  // every rank enters it, a rejoined one too. Where every worker left before
  // round 0 completed, one rank rejoins at round 0 and the next at round 1,
  // and each waited for the other (at the barrier, and for round 0).
  if (worker.rejoin().passed_barriers.contains("init")) return absl::OkStatus();
  if (worker.rank() == 0) {
    model.InitParams(o.seed);
    for (size_t t = 0; t < model.params().size(); ++t) {
      absl::Status s = worker.InitTensor(model.tensors()[t].name, model.params()[t], o.step_timeout);
      // A restored cluster holds its weights already: keep them.
      if (absl::IsAlreadyExists(s) && worker.config().checkpoint().restore_round() > 0) continue;
      SHARDPS_RETURN_IF_ERROR(s);
    }
  }
  return worker.Barrier("init");
}

// Trains one batch: images (batch_size x kImagePixels) and labels in, the
// batch's mean loss out.
using BatchStep = absl::FunctionRef<absl::StatusOr<float>(const float* images, const uint8_t* labels)>;

// The step counter another process watches: a fixed-width line rewritten in
// place (one small pwrite per step).
class ProgressFile {
 public:
  explicit ProgressFile(const std::string& path)
      : fd_(path.empty() ? -1 : open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {}
  ~ProgressFile() {
    if (fd_ >= 0) close(fd_);
  }
  void Set(int64_t step) {
    if (fd_ < 0) return;
    char line[24];
    const int n = snprintf(line, sizeof(line), "%020lld\n", static_cast<long long>(step));
    (void)!pwrite(fd_, line, n, 0);
  }

 private:
  const int fd_;
};

// Test accuracy during training (TrainOptions::eval_every), on rank 0: the
// weights this worker holds after a step, complete once its push-pulls in
// flight (`pipeline`, null: none) are answered, and the job's final weights.
// The time spent evaluating is kept out of AccuracyPoint::seconds, so that
// the probe does not count against the job it measures (in sync the other
// workers wait for it, in async they do not).
class AccuracyProbe {
 public:
  AccuracyProbe(Mlp& model, const Dataset& test, StepPipeline* pipeline, int every, std::ostream& log)
      : model_(model), test_(test), pipeline_(pipeline), every_(every), log_(log),
        start_(std::chrono::steady_clock::now()) {}

  // After this worker's step `steps`, the job `epochs` into training.
  absl::Status AfterStep(int64_t steps, double epochs, TrainResult& result) {
    if (steps % every_ != 0) return absl::OkStatus();
    if (pipeline_ != nullptr) SHARDPS_RETURN_IF_ERROR(pipeline_->AwaitAll());
    Evaluate({.step = steps, .epochs = epochs}, result);
    return absl::OkStatus();
  }
  // The model holds the job's final weights: their point, marked final.
  // Returns its accuracy.
  double Final(int64_t steps, double epochs, TrainResult& result) {
    return Evaluate({.step = steps, .epochs = epochs, .final = true}, result);
  }

 private:
  double Evaluate(AccuracyPoint point, TrainResult& result) {
    const auto begin = std::chrono::steady_clock::now();
    point.test_accuracy = model_.Evaluate(test_);
    eval_seconds_ += Seconds(begin);
    point.eval_seconds = eval_seconds_;
    point.seconds = Seconds(start_) - eval_seconds_;
    log_ << AccuracyPointJson(point) << "\n" << std::flush;
    result.accuracy_points.push_back(point);
    return point.test_accuracy;
  }

  Mlp& model_;
  const Dataset& test_;
  StepPipeline* const pipeline_;
  const int every_;
  std::ostream& log_;
  const std::chrono::steady_clock::time_point start_;
  double eval_seconds_ = 0;
};

// One training step after another: gathers batch `s` of an epoch's order,
// runs it, counts it and reports progress.
class StepLoop {
 public:
  // `probe` (null: none) is called after every step.
  StepLoop(const Data& data, const TrainOptions& o, AccuracyProbe* probe, std::ostream& log)
      : data_(data), o_(o), probe_(probe), log_(log), progress_(o.progress_file),
        start_(std::chrono::steady_clock::now()) {}

  // `job_epochs`: the job's progress in epochs once this step is done.
  absl::Status Step(const std::vector<uint32_t>& order, int s, int epoch, double job_epochs, BatchStep step,
                    TrainResult& result) {
    if (o_.stop_requested && o_.stop_requested()) {
      return absl::CancelledError(absl::StrCat("stopped by a signal after ", result.steps, " steps"));
    }
    train::GatherBatch(data_.train, absl::MakeConstSpan(order).subspan(s * o_.batch_size, o_.batch_size), &images_,
                       &labels_);
    SHARDPS_ASSIGN_OR_RETURN(result.final_loss, step(images_.data(), labels_.data()));
    ++result.steps;
    progress_.Set(result.steps);
    result.samples += o_.batch_size;
    Progress(log_, o_, epoch, result.steps, result.final_loss, result.samples, seconds());
    return probe_ != nullptr ? probe_->AfterStep(result.steps, job_epochs, result) : absl::OkStatus();
  }
  double seconds() const { return Seconds(start_); }
  // The last step's push-pulls still in flight (`pipeline`, null: none) are
  // part of its time.
  absl::Status Finish(StepPipeline* pipeline, TrainResult& result) const {
    if (pipeline != nullptr) {
      SHARDPS_RETURN_IF_ERROR(TimeBlocked(result.wait_seconds, [&] { return pipeline->AwaitAll(); }));
    }
    result.wall_seconds = seconds();
    return absl::OkStatus();
  }

 private:
  const Data& data_;
  const TrainOptions& o_;
  AccuracyProbe* const probe_;
  std::ostream& log_;
  ProgressFile progress_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<float> images_;
  std::vector<uint8_t> labels_;
};

// Compute time stretched by the straggler switch (TrainOptions::slow_factor).
void SlowDown(const TrainOptions& o, std::chrono::steady_clock::time_point compute_start) {
  if (o.slow_factor <= 1.0) return;
  const auto took = std::chrono::steady_clock::now() - compute_start;
  std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(took * (o.slow_factor - 1.0)));
}

// SlowDown for a step whose compute is interleaved with waits: the compute
// between Resume() and Pause() is stretched by the slow factor, the waits are
// not.
class ComputeStretch {
 public:
  explicit ComputeStretch(const TrainOptions& o) : o_(o), since_(std::chrono::steady_clock::now()) {}
  void Pause() const { SlowDown(o_, since_); }
  void Resume() { since_ = std::chrono::steady_clock::now(); }

 private:
  const TrainOptions& o_;
  std::chrono::steady_clock::time_point since_;
};

// One step with its communication overlapped (TrainOptions::overlap): the
// forward pass awaits each tensor's weights from the previous step's
// push-pull as it reaches them, and backward pushes each gradient as soon as
// it is final. Returns with this step's push-pulls in flight; adds the time
// it was blocked on the data plane to `wait_seconds`.
absl::StatusOr<float> PipelinedStep(Mlp& model, StepPipeline& pipeline, std::vector<std::vector<float>>& grads,
                                    const TrainOptions& o, const float* images, const uint8_t* labels,
                                    double& wait_seconds) {
  ComputeStretch compute(o);
  auto blocked = [&](absl::FunctionRef<absl::Status()> call) {
    compute.Pause();
    absl::Status s = TimeBlocked(wait_seconds, call);
    compute.Resume();
    return s;
  };
  auto await = [&](size_t t) { return blocked([&] { return pipeline.Await(t); }); };
  auto computed = [&](size_t t) { return blocked([&] { return pipeline.Push(t, grads[t]); }); };
  absl::StatusOr<float> loss = model.ForwardBackward(images, labels, o.batch_size, &grads, {await, computed});
  compute.Pause();
  return loss;
}

// Async: no barrier between epochs; this worker's shard again and again until
// the cluster has applied the job's budget of pushes (RunTrainingWorker).
// `tensor` is one the model pushes every step: its weights' version counts
// the pushes applied. With a `pipeline` (null: none), tensor 0 is `tensor`
// and its push-pull in flight is awaited before its version is read.
absl::Status TrainAsync(const Data& data, const TrainOptions& o, Worker& worker, const std::string& tensor,
                        StepPipeline* pipeline, AccuracyProbe* probe, BatchStep step, std::ostream& log,
                        TrainResult& result) {
  const uint32_t rank = worker.rank();
  const int world = static_cast<int>(worker.config().num_workers());
  const int steps_per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size);
  if (steps_per_epoch == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
  const uint64_t budget = static_cast<uint64_t>(o.epochs) * steps_per_epoch * world;
  StepLoop loop(data, o, probe, log);
  // At most every epoch of every worker's share (this worker alone).
  for (int epoch = 0; epoch < o.epochs * world; ++epoch) {
    std::vector<uint32_t> order = train::ShardIndices(data.train.size(), rank, world, o.seed, epoch);
    for (int s = 0; s < steps_per_epoch; ++s) {
      if (pipeline != nullptr) {
        SHARDPS_RETURN_IF_ERROR(TimeBlocked(result.wait_seconds, [&] { return pipeline->Await(0); }));
      }
      SHARDPS_ASSIGN_OR_RETURN(uint64_t applied, worker.WeightsVersion(tensor));
      if (applied >= budget || (o.max_steps > 0 && result.steps >= o.max_steps)) return loop.Finish(pipeline, result);
      const double job_epochs = static_cast<double>(applied) / (static_cast<double>(budget) / o.epochs);
      SHARDPS_RETURN_IF_ERROR(loop.Step(order, s, epoch, job_epochs, step, result));
    }
  }
  return loop.Finish(pipeline, result);
}

// Runs every epoch of this worker's shard through `step`. Each epoch after
// the first starts with a barrier that says which ranks are still in the job:
// once a worker was removed, the survivors split the whole training set
// among themselves (in rank order), so no data is dropped for the rest of
// the job. Until then the shards are exactly those of RunReference.
// A job restored at round R and a worker that rejoined at round J start at
// that round: the restored job's epochs all have the first epoch's steps; a
// rejoined worker walks the epochs the job passed before it came back with
// the live ranks their barriers recorded (Worker::rejoin), so it finds the
// same epoch and step as the others. In an epoch whose barrier passed
// without it, its batches come from its own rank's shard of the split
// among all num_workers ranks (samples the others also see that epoch);
// from the next barrier on it is among the live ranks and the split is
// exact again.
// A `pipeline` (null: none) has nothing in flight when a barrier is entered.
absl::Status TrainEpochs(const Data& data, const TrainOptions& o, Worker& worker, StepPipeline* pipeline,
                         AccuracyProbe* probe, BatchStep step, std::ostream& log, TrainResult& result) {
  const int all = static_cast<int>(worker.config().num_workers());
  uint32_t rank = worker.rank();
  int world = all;
  StepLoop loop(data, o, probe, log);
  const int initial_steps = StepsPerEpoch(data.train.size(), world, o.batch_size);
  if (initial_steps == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
  const Worker::Rejoin& rejoin = worker.rejoin();
  const int64_t first_round = std::max<int64_t>(o.start_step, static_cast<int64_t>(rejoin.round));
  // A restored job skips the steps its checkpoint holds, epochs and data order as before.
  const int first_epoch = rejoin.round > 0 ? 0 : static_cast<int>(o.start_step / initial_steps);
  int64_t epoch_start = static_cast<int64_t>(first_epoch) * initial_steps;  // the epoch's first round
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    bool outside_split = false;  // an epoch whose barrier passed before this worker rejoined
    if (epoch > 0) {
      if (pipeline != nullptr) {
        SHARDPS_RETURN_IF_ERROR(TimeBlocked(result.wait_seconds, [&] { return pipeline->AwaitAll(); }));
      }
      const std::string name = absl::StrCat("epoch ", epoch);
      std::vector<uint32_t> live;
      if (auto passed = rejoin.passed_barriers.find(name); passed != rejoin.passed_barriers.end()) {
        live = passed->second;
      } else {
        SHARDPS_RETURN_IF_ERROR(worker.Barrier(name, &live));
      }
      auto me = std::find(live.begin(), live.end(), worker.rank());
      outside_split = me == live.end();
      if (!outside_split && static_cast<int>(live.size()) != world) {
        log << "worker " << worker.rank() << ": " << live.size() << " workers in the job; epoch " << epoch + 1
            << " splits the training set among them\n";
      }
      if (!outside_split) rank = static_cast<uint32_t>(me - live.begin());
      if (!live.empty()) world = static_cast<int>(live.size());
    }
    const int steps_per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size);
    if (steps_per_epoch == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
    const std::vector<uint32_t> order = outside_split
                                            ? train::ShardIndices(data.train.size(), worker.rank(), all, o.seed, epoch)
                                            : train::ShardIndices(data.train.size(), rank, world, o.seed, epoch);
    const int order_steps = static_cast<int>(order.size()) / o.batch_size;
    const int64_t first_step = std::max<int64_t>(0, first_round - epoch_start);
    if (first_step < steps_per_epoch && rejoin.round > 0 && result.steps == 0) {
      log << "worker " << worker.rank() << ": rejoined at round " << rejoin.round << ": epoch " << epoch + 1
          << ", step " << first_step << " of " << steps_per_epoch << "\n";
    }
    for (int64_t s = first_step; s < steps_per_epoch; ++s) {
      if (o.max_steps > 0 && epoch_start + s >= o.max_steps) break;
      const double job_epochs = epoch + static_cast<double>(s + 1) / steps_per_epoch;
      SHARDPS_RETURN_IF_ERROR(loop.Step(order, static_cast<int>(s % order_steps), epoch, job_epochs, step, result));
    }
    epoch_start += steps_per_epoch;
  }
  return loop.Finish(pipeline, result);
}

// The job's progress in epochs by the weights of `tensor` this worker last
// received: completed rounds (async: pushes applied) over those of an epoch.
absl::StatusOr<double> EpochsApplied(const Worker& worker, const Data& data, const TrainOptions& o,
                                     const std::string& tensor) {
  SHARDPS_ASSIGN_OR_RETURN(uint64_t version, worker.WeightsVersion(tensor));
  const int world = static_cast<int>(worker.config().num_workers());
  const int per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size) *
                        (RoundBased(worker.config()) ? 1 : world);
  return per_epoch > 0 ? static_cast<double>(version) / per_epoch : 0.0;
}

// After the "done" barrier: a sync worker that rejoined after the job's
// last round has no weights to pull (its first round never comes). Async
// pulls answer the latest weights.
absl::Status CheckRejoinedInTime(const Worker& worker, const TrainResult& result) {
  const bool async = !RoundBased(worker.config());  // ssp too, applied on arrival
  if (worker.rejoin().round == 0 || result.steps > 0 || async) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("worker ", worker.rank(), " rejoined at round ",
                                                    worker.rejoin().round,
                                                    ", after the job's last round: it had nothing to train"));
}

absl::Status SyncAll(Worker& worker, const Mlp& model, std::vector<std::vector<float>>& params,
                     const std::vector<std::vector<float>>* grads, absl::Duration timeout) {
  std::vector<Worker::Handle> handles;
  absl::Status first;
  // One deadline for the whole step: a failed server costs one timeout, not
  // one per tensor.
  const absl::Time deadline = absl::Now() + timeout;
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
    absl::Status s = worker.Wait(h, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (first.ok()) first = s;
  }
  return first;
}

// The local tier's merge, written out: for every element, in float,
// acc = g_0 + g_1 + ... + g_{D-1} (device order), then acc * (1.0f / D).
// See worker/local_tier/local_reducer.h; the reference must not share its code.
void AverageInDeviceOrder(const std::vector<std::vector<std::vector<float>>>& slice_grads,
                          std::vector<std::vector<float>>* out) {
  const size_t devices = slice_grads.size();
  const float scale = 1.0f / static_cast<float>(devices);
  out->resize(slice_grads[0].size());
  for (size_t t = 0; t < out->size(); ++t) {
    std::vector<float>& avg = (*out)[t];
    avg.resize(slice_grads[0][t].size());
    for (size_t i = 0; i < avg.size(); ++i) {
      float acc = slice_grads[0][t][i];
      for (size_t d = 1; d < devices; ++d) acc = acc + slice_grads[d][t][i];
      avg[i] = acc * scale;
    }
  }
}

// One model replica per device of a DeviceGroup worker.
struct Replica {
  Mlp model;
  std::vector<std::vector<float>> grads;
  float loss = 0;
};

// Copies device d's weights (left there by the last Round/Pull) into `model`.
absl::Status LoadWeights(const DeviceGroup& group, int d, Mlp& model) {
  for (size_t t = 0; t < group.num_tensors(); ++t) {
    SHARDPS_RETURN_IF_ERROR(group.weights(d, t).CopyToHost(0, absl::MakeSpan(model.params()[t])));
  }
  return absl::OkStatus();
}

// Each replica, on its device's thread: load the latest weights, forward and
// backward on its slice of the batch, store the gradient in the device's
// buffers. Returns the batch's mean loss (slice losses averaged in device
// order). The replicas compute on the CPU whatever the device kind: only the
// merge and broadcast use the device; a GPU forward/backward is not built.
absl::StatusOr<float> RunReplicas(DeviceGroup& group, std::vector<Replica>& replicas, const float* images,
                                  const uint8_t* labels, int slice) {
  std::vector<std::future<absl::Status>> done;
  for (int d = 0; d < group.num_devices(); ++d) {
    done.push_back(group.device(d).Submit([&, d]() -> absl::Status {
      Replica& replica = replicas[d];
      SHARDPS_RETURN_IF_ERROR(LoadWeights(group, d, replica.model));
      replica.loss = replica.model.ForwardBackward(images + size_t{1} * d * slice * train::kImagePixels,
                                                   labels + d * slice, slice, &replica.grads);
      for (size_t t = 0; t < replica.grads.size(); ++t) {
        SHARDPS_RETURN_IF_ERROR(group.gradient(d, t).CopyFromHost(replica.grads[t]));
      }
      return absl::OkStatus();
    }));
  }
  absl::Status first;
  for (auto& f : done) {
    absl::Status s = f.get();
    if (first.ok()) first = s;
  }
  if (!first.ok()) return first;
  float loss = 0;
  for (const Replica& replica : replicas) loss += replica.loss;
  return loss / static_cast<float>(replicas.size());
}

// RunTrainingWorker through the local tier (UsesLocalTier): D devices, one
// replica each, merged and pushed once per partition by a DeviceGroup (in
// layer order: the tensors the next forward pass needs first).
absl::StatusOr<TrainResult> RunDeviceGroupWorker(Worker& worker, const TrainOptions& o, std::ostream& log) {
  const int num_devices = o.devices_per_worker;
  SHARDPS_ASSIGN_OR_RETURN(Data data, LoadData(o));
  SHARDPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(o.layers));
  SHARDPS_RETURN_IF_ERROR(JoinJob(worker, model, o));
  std::vector<GroupTensor> tensors;
  for (const auto& t : model.tensors()) tensors.push_back({t.name, t.numel});
  const std::string spec = o.devices.empty() ? absl::StrCat("cpu:", num_devices) : o.devices;
  SHARDPS_ASSIGN_OR_RETURN(auto devices, CreateDevices(spec));
  if (static_cast<int>(devices.size()) != num_devices) {
    return absl::InvalidArgumentError(absl::StrCat("device spec '", spec, "' names ", devices.size(),
                                                   " devices; devices per worker is ", num_devices));
  }
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceGroup> group,
                           DeviceGroup::Create(worker, std::move(devices), std::move(tensors)));
  // A rejoined worker pulls before its first step (see RunTrainingWorker).
  bool pulled = worker.rejoin().round == 0;
  if (pulled) SHARDPS_RETURN_IF_ERROR(group->Pull(o.step_timeout));
  std::vector<Replica> replicas(num_devices, Replica{model, {}, 0});

  TrainResult result;
  auto step = [&](const float* images, const uint8_t* labels) -> absl::StatusOr<float> {
    if (!pulled) SHARDPS_RETURN_IF_ERROR(group->Pull(o.step_timeout));
    pulled = true;
    const auto compute_start = std::chrono::steady_clock::now();
    SHARDPS_ASSIGN_OR_RETURN(float loss, RunReplicas(*group, replicas, images, labels, o.batch_size / num_devices));
    SlowDown(o, compute_start);
    SHARDPS_RETURN_IF_ERROR(group->Round(o.step_timeout));
    return loss;
  };
  if (worker.config().consistency() == ASYNC) {
    SHARDPS_RETURN_IF_ERROR(TrainAsync(data, o, worker, model.tensors()[0].name, nullptr, nullptr, step, log, result));
  } else {
    SHARDPS_RETURN_IF_ERROR(TrainEpochs(data, o, worker, nullptr, nullptr, step, log, result));
  }
  SHARDPS_RETURN_IF_ERROR(worker.Barrier("done"));
  SHARDPS_RETURN_IF_ERROR(CheckRejoinedInTime(worker, result));
  // Sum-only: the group's host weights are the job's weights (updated in
  // place by every round); the servers hold only the initial ones.
  if (worker.config().update_mode() != SUM_ONLY) SHARDPS_RETURN_IF_ERROR(group->Pull(o.step_timeout));
  for (size_t t = 0; t < group->num_tensors(); ++t) {
    absl::Span<const float> w = group->host_weights(t);
    result.params.emplace_back(w.begin(), w.end());
  }
  model.params() = result.params;
  result.test_accuracy = model.Evaluate(data.test);
  WorkerStats stats = worker.stats();
  result.bytes_pushed = stats.bytes_pushed;
  result.bytes_pulled = stats.bytes_pulled;
  result.acked_pushes = stats.acked_pushes;
  result.acked_push_digests = stats.acked_push_digests;
  result.rejoin_round = worker.rejoin().round;
  return result;
}

}  // namespace

std::string WeightsSha256(const std::vector<std::vector<float>>& params) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const auto& t : params) EVP_DigestUpdate(ctx, t.data(), t.size() * sizeof(float));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, digest, &n);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

std::string AccuracyPointJson(const AccuracyPoint& p) {
  return absl::StrFormat(
      "{\"eval_step\": %d, \"epochs\": %.4f, \"seconds\": %.3f, \"eval_seconds\": %.3f, \"test_accuracy\": %.4f, "
      "\"final\": %s}",
      p.step, p.epochs, p.seconds, p.eval_seconds, p.test_accuracy, p.final ? "true" : "false");
}

absl::StatusOr<std::vector<int>> ParseLayers(const std::string& hidden) {
  // Empty: no hidden layer. Otherwise every entry is a width ("256,,128" is a typo, not two layers).
  if (hidden.empty()) return std::vector<int>{train::kImagePixels, train::kNumClasses};
  std::vector<int> layers = {train::kImagePixels};
  for (absl::string_view part : absl::StrSplit(hidden, ',')) {
    if (part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("hidden layer widths '", hidden, "' have an empty entry"));
    }
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

bool UsesLocalTier(const TrainOptions& o) { return o.devices_per_worker > 1 || !o.devices.empty(); }

absl::Status ValidateTrainOptions(const TrainOptions& o) {
  if (o.epochs < 1) return absl::InvalidArgumentError(absl::StrCat("--epochs ", o.epochs, " is below 1"));
  if (o.batch_size < 1) return absl::InvalidArgumentError(absl::StrCat("--batch-size ", o.batch_size, " is below 1"));
  if (o.devices_per_worker < 1 || o.devices_per_worker > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices-per-worker ", o.devices_per_worker, " is not in [1, 1024]"));
  }
  if (!(o.slow_factor >= 1.0 && o.slow_factor <= 1000.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--slow-factor ", o.slow_factor, " is not in [1, 1000]"));
  }
  if (o.eval_every < 0) return absl::InvalidArgumentError(absl::StrCat("--eval-every ", o.eval_every, " is below 0"));
  if (o.eval_every > 0 && o.devices_per_worker > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--eval-every ", o.eval_every,
                                                   " needs --devices-per-worker 1, not ", o.devices_per_worker));
  }
  if (o.eval_every > 0 && UsesLocalTier(o)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-every ", o.eval_every, " does not go with --devices (the local tier does not evaluate)"));
  }
  if (o.batch_size % o.devices_per_worker != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch-size ", o.batch_size, " is not divisible by --devices-per-worker ", o.devices_per_worker,
        ": each device trains on batch_size / devices_per_worker images of the worker's batch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> RunTrainingWorker(Worker& worker, const TrainOptions& options, std::ostream& log) {
  SHARDPS_RETURN_IF_ERROR(ValidateTrainOptions(options));
  TrainOptions o = options;
  if (o.step_timeout <= absl::ZeroDuration()) o.step_timeout = worker.request_timeout();
  o.start_step = static_cast<int64_t>(worker.config().checkpoint().restore_round());
  if (UsesLocalTier(o)) return RunDeviceGroupWorker(worker, o, log);
  SHARDPS_ASSIGN_OR_RETURN(Data data, LoadData(o));
  SHARDPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(o.layers));
  SHARDPS_RETURN_IF_ERROR(JoinJob(worker, model, o));
  auto& params = model.params();
  // A rejoined worker pulls before its first step: the pull waits for the
  // round before its join round, which may lie past barriers still ahead.
  bool pulled = worker.rejoin().round == 0;
  if (pulled) SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, nullptr, o.step_timeout));

  std::vector<std::vector<float>> grads;
  // Declared after the buffers its requests borrow, so it is destroyed (and
  // awaits whatever is in flight) before them.
  std::vector<std::string> names;
  for (const auto& t : model.tensors()) names.push_back(t.name);
  StepPipeline pipeline(worker, std::move(names), params, o.step_timeout);
  StepPipeline* const overlap = o.overlap ? &pipeline : nullptr;
  std::optional<AccuracyProbe> probe;
  if (o.eval_every > 0 && worker.rank() == 0) probe.emplace(model, data.test, overlap, o.eval_every, log);
  AccuracyProbe* const evaluate = probe ? &*probe : nullptr;
  TrainResult result;
  auto step = [&](const float* images, const uint8_t* labels) -> absl::StatusOr<float> {
    if (!pulled) SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, nullptr, o.step_timeout));
    pulled = true;
    if (overlap != nullptr) return PipelinedStep(model, pipeline, grads, o, images, labels, result.wait_seconds);
    const auto compute_start = std::chrono::steady_clock::now();
    const float loss = model.ForwardBackward(images, labels, o.batch_size, &grads);
    SlowDown(o, compute_start);
    SHARDPS_RETURN_IF_ERROR(TimeBlocked(result.wait_seconds,
                                        [&] { return SyncAll(worker, model, params, &grads, o.step_timeout); }));
    return loss;
  };
  if (worker.config().consistency() == ASYNC) {
    SHARDPS_RETURN_IF_ERROR(TrainAsync(data, o, worker, model.tensors()[0].name, overlap, evaluate, step, log, result));
  } else {
    SHARDPS_RETURN_IF_ERROR(TrainEpochs(data, o, worker, overlap, evaluate, step, log, result));
  }
  SHARDPS_RETURN_IF_ERROR(pipeline.AwaitAll());
  // Everyone finishes, then evaluates the same (latest) weights.
  SHARDPS_RETURN_IF_ERROR(worker.Barrier("done"));
  SHARDPS_RETURN_IF_ERROR(CheckRejoinedInTime(worker, result));
  // In sum-only mode the weights live on the workers (identical after every
  // sync round); the servers hold only the initial ones.
  if (worker.config().update_mode() != SUM_ONLY) {
    SHARDPS_RETURN_IF_ERROR(SyncAll(worker, model, params, nullptr, o.step_timeout));
  }
  if (probe) {
    SHARDPS_ASSIGN_OR_RETURN(double epochs, EpochsApplied(worker, data, o, model.tensors()[0].name));
    result.test_accuracy = probe->Final(result.steps, epochs, result);
  } else {
    result.test_accuracy = model.Evaluate(data.test);
  }
  WorkerStats stats = worker.stats();
  result.bytes_pushed = stats.bytes_pushed;
  result.bytes_pulled = stats.bytes_pulled;
  result.acked_pushes = stats.acked_pushes;
  result.acked_push_digests = stats.acked_push_digests;
  result.rejoin_round = worker.rejoin().round;
  result.params = params;
  return result;
}

absl::StatusOr<TrainResult> RunReference(const ClusterConfig& config, const TrainOptions& o, std::ostream& log) {
  SHARDPS_RETURN_IF_ERROR(ValidateTrainOptions(o));
  SHARDPS_ASSIGN_OR_RETURN(Data data, LoadData(o));
  SHARDPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(o.layers));
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(config.optimizer()));
  model.InitParams(o.seed);
  auto& params = model.params();
  std::vector<std::vector<float>> state(params.size());
  for (size_t t = 0; t < params.size(); ++t) state[t].assign(optimizer->state_slots() * params[t].size(), 0.0f);

  const int world = static_cast<int>(config.num_workers());
  const int devices = o.devices_per_worker;
  const int slice = o.batch_size / devices;
  const int steps_per_epoch = StepsPerEpoch(data.train.size(), world, o.batch_size);
  if (steps_per_epoch == 0) return absl::InvalidArgumentError("fewer training images per worker than one batch");
  std::vector<std::vector<std::vector<float>>> grads(world);
  std::vector<std::vector<std::vector<float>>> slice_grads(devices);  // [device][tensor]
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
        float loss;
        if (devices == 1) {
          loss = model.ForwardBackward(images.data(), labels.data(), o.batch_size, &grads[r]);
        } else {
          // What the worker's D replicas and its DeviceGroup compute.
          loss = 0;
          for (int d = 0; d < devices; ++d) {
            loss += model.ForwardBackward(images.data() + size_t{1} * d * slice * train::kImagePixels,
                                          labels.data() + d * slice, slice, &slice_grads[d]);
          }
          loss /= static_cast<float>(devices);
          AverageInDeviceOrder(slice_grads, &grads[r]);
        }
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
