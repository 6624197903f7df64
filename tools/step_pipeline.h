// StepPipeline: a training step's push-pulls, one per parameter tensor, kept
// in flight across the step boundary. A tensor's gradient goes out as soon as
// backward has produced it (Push) and its new weights are waited for only
// when the next forward pass is about to read them (Await), so the network
// carries the last layers' rounds while the first layers are still computed,
// and the next step computes its first layer while the last layers' weights
// are still on the way.
//
// Owns nothing but the handles: `params` (where the answers land) and every
// gradient passed to Push are borrowed and must stay valid and unmodified
// until that tensor's Await returns (the destructor awaits whatever is still
// in flight, so they must outlive the StepPipeline). At most one push-pull
// per tensor is in flight: Push of a tensor still in flight fails.
// Not thread-safe: one training thread drives it.
#ifndef SHARDPS_TOOLS_STEP_PIPELINE_H_
#define SHARDPS_TOOLS_STEP_PIPELINE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/worker.h"

namespace shardps {

class StepPipeline {
 public:
  // `names[t]` is the tensor whose weights are `params[t]`. Each push-pull
  // may take `timeout` from when it was pushed.
  StepPipeline(Worker& worker, std::vector<std::string> names, std::vector<std::vector<float>>& params,
               absl::Duration timeout);
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // Sends `gradient` as this worker's next round of tensor t; the answer
  // (weights with this round, as Worker::PushPull) lands in params[t].
  // REQUIRES: t < number of tensors.
  absl::Status Push(size_t t, absl::Span<const float> gradient);
  // Returns once tensor t's push-pull (if any is in flight) is answered: its
  // weights are then in params[t]. Fails with the Worker's error (naming the
  // tensor and the servers still owing an answer) past the push's deadline.
  absl::Status Await(size_t t);
  // Await for every tensor, first to last; returns the first error.
  absl::Status AwaitAll();
  // Tensors pushed and not yet awaited.
  size_t in_flight() const;

 private:
  struct Round {
    Worker::Handle handle;
    absl::Time deadline;
  };

  Worker& worker_;
  const std::vector<std::string> names_;
  std::vector<std::vector<float>>& params_;
  const absl::Duration timeout_;
  std::vector<std::optional<Round>> in_flight_;  // per tensor
};

}  // namespace shardps

#endif  // SHARDPS_TOOLS_STEP_PIPELINE_H_
