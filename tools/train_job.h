// The example training job: an MLP on Fashion-MNIST, trained data-parallel
// through the worker library, or in one process as the reference.
#ifndef SHARDPS_TOOLS_TRAIN_JOB_H_
#define SHARDPS_TOOLS_TRAIN_JOB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "worker/worker.h"

namespace shardps {

struct TrainOptions {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  int batch_size = 32;       // per worker
  // Devices per worker, each with its own model replica training on
  // batch_size / devices_per_worker images of the worker's batch; their
  // gradients are averaged (DeviceGroup) before one push per partition.
  // Devices are CPU devices ("cpu:D") unless `devices` names them.
  // 1 = one model, no local tier (unless `devices` names one device).
  int devices_per_worker = 1;
  // Device spec of the local tier (worker/local_tier/device.h), e.g. "cuda:0,cuda:1";
  // must name devices_per_worker devices; given with 1, the local tier runs
  // on that device. Empty: "cpu:D" (D > 1). The model math runs
  // on the CPU either way; the devices hold the gradients and weights that
  // are merged and broadcast.
  std::string devices;
  uint64_t seed = 1;
  size_t train_limit = 0;    // first N training images only (0 = all 60k)
  size_t test_limit = 0;     // first N test images only (0 = all 10k)
  int max_steps = 0;         // stop after this many steps in total (0 = no limit)
  // Steps taken before this run: a cluster restored from a checkpoint of
  // round R starts at step R (its epoch and place in that epoch's order).
  // RunTrainingWorker sets it from the config's checkpoint.restore_round.
  int64_t start_step = 0;
  int log_every = 100;       // progress line every N steps (0 = none)
  std::vector<int> layers = {784, 256, 128, 10};
  // Deadline of one step's data requests; zero: the config's request_timeout_ms.
  absl::Duration step_timeout = absl::ZeroDuration();
  // When set, the number of steps taken is written here after every step
  // (`shardps local --kill ...@STEP` watches rank 0's).
  std::string progress_file;
  // Straggler switch for experiments: after each step's forward/backward,
  // sleep (slow_factor - 1) times the time it took, so this worker computes
  // slow_factor times slower on any machine. 1 = full speed.
  double slow_factor = 1.0;
  // Default on: each tensor's push-pull goes out as soon as backward has
  // computed its gradient (last layer first) and the next forward waits for
  // each tensor's weights only when it reaches that layer (first layer
  // first), so communication overlaps compute. Off: the whole backward, then
  // every tensor pushed and every answer awaited before the next step (the
  // order before pipelining; `shardps train/local --no-overlap`). The
  // arithmetic is the same either way: a deterministic sync job's weights
  // are bitwise equal. Applies to devices_per_worker = 1 (a DeviceGroup
  // pipelines per partition instead).
  bool overlap = true;
  // Test accuracy during training, for time-to-accuracy measurements
  // (tools/scalebench.sh --train). 0 (default): off. N > 0: rank 0 evaluates
  // on the test set the weights it holds after every N of its steps
  // (awaiting its push-pulls in flight first) and the job's final weights
  // (its test_accuracy), records each point in TrainResult::accuracy_points
  // and writes it to the log as one JSON line (AccuracyPointJson). Other
  // ranks do nothing. Needs devices_per_worker = 1.
  int eval_every = 0;
  // Asked before every step: true ends the run with Cancelled (`shardps
  // train` on SIGTERM or SIGINT, so that its worker leaves the job rather
  // than fall silent). Unset: never.
  std::function<bool()> stop_requested;
};

// One evaluation of TrainOptions::eval_every.
struct AccuracyPoint {
  int64_t step = 0;        // this worker's steps so far
  // The job's progress in epochs (async: pushes applied / pushes per epoch);
  // of the final point, by the final weights' version.
  double epochs = 0;
  double seconds = 0;      // since training started, less the time spent evaluating so far
  double eval_seconds = 0; // time spent evaluating so far, this point included
  double test_accuracy = 0;
  bool final = false;      // the job's final weights (after every worker finished)
};

// The log line of an AccuracyPoint: {"eval_step": ..., "epochs": ...,
// "seconds": ..., "eval_seconds": ..., "test_accuracy": ..., "final": ...}
// (no newline).
std::string AccuracyPointJson(const AccuracyPoint& point);

struct TrainResult {
  double test_accuracy = 0;
  double final_loss = 0;
  int64_t steps = 0;          // optimizer rounds this worker took part in
  int64_t samples = 0;        // training samples this worker processed
  double wall_seconds = 0;
  // Of wall_seconds, the time steps spent blocked on the data plane (sending
  // and awaiting answers; devices_per_worker = 1 only): what overlap hides.
  double wait_seconds = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
  std::map<uint64_t, uint64_t> acked_pushes;  // partition id -> pushes acknowledged
  std::map<uint64_t, uint64_t> acked_push_digests;  // partition id -> WorkerStats::acked_push_digests
  uint64_t rejoin_round = 0;  // Worker::rejoin().round: 0 for a process there from the start
  std::vector<AccuracyPoint> accuracy_points;  // TrainOptions::eval_every, in order
  std::vector<std::vector<float>> params;  // final weights
};

// SHA-256 of the weights, tensor after tensor as little-endian float32, in
// hex: equal digests mean bitwise-equal models.
std::string WeightsSha256(const std::vector<std::vector<float>>& params);

// MLP layer widths from "256,128" (hidden layers): {784, 256, 128, 10}.
absl::StatusOr<std::vector<int>> ParseLayers(const std::string& hidden);

// InvalidArgument unless batch_size >= 1, devices_per_worker in [1, 1024],
// batch_size divisible by devices_per_worker, slow_factor in [1, 1000] and
// eval_every >= 0, and 0 where UsesLocalTier. The message names the
// `shardps train` flag of the field (--batch-size, ...) and its value.
absl::Status ValidateTrainOptions(const TrainOptions& options);
// Whether training runs D devices through the local tier (RunDeviceGroupWorker):
// more than one device per worker, or devices named.
bool UsesLocalTier(const TrainOptions& options);

// Runs one worker of the job. Rank 0 initialises the weights. Sync and ssp
// workers each run `epochs` passes over their shard, meeting at a barrier
// between epochs. Async workers wait for no one: each runs through its shard
// again and again until the cluster has applied epochs x steps-per-epoch x W
// pushes (the samples a sync job trains on), so a slow worker takes fewer
// steps and the others more.
absl::StatusOr<TrainResult> RunTrainingWorker(Worker& worker, const TrainOptions& options, std::ostream& log);

// The same job in one process: each step averages the gradients of the
// `config.num_workers()` data shards in rank order and applies the configured
// optimizer, i.e. what a deterministic sync cluster computes. With
// devices_per_worker D > 1, a rank's gradient is first the average of its D
// slice gradients in device order, (g_0 + ... + g_{D-1}) * (1.0f / D), as the
// worker's DeviceGroup merges them.
absl::StatusOr<TrainResult> RunReference(const ClusterConfig& config, const TrainOptions& options,
                                         std::ostream& log);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_TRAIN_JOB_H_
