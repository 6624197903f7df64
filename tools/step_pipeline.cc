#include "tools/step_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardps {

StepPipeline::StepPipeline(Worker& worker, std::vector<std::string> names, std::vector<std::vector<float>>& params,
                           absl::Duration timeout)
    : worker_(worker), names_(std::move(names)), params_(params), timeout_(timeout), in_flight_(names_.size()) {
  CHECK_EQ(names_.size(), params_.size());
}

StepPipeline::~StepPipeline() {
  // The answers write into borrowed buffers: none may be left in flight.
  if (absl::Status s = AwaitAll(); !s.ok()) LOG(WARNING) << "step pipeline: " << s;
}

absl::Status StepPipeline::Push(size_t t, absl::Span<const float> gradient) {
  CHECK_LT(t, names_.size());
  if (in_flight_[t].has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("push of '", names_[t], "' while its previous push-pull is still in flight"));
  }
  const absl::Time deadline = absl::Now() + timeout_;
  absl::StatusOr<Worker::Handle> h = worker_.PushPull(names_[t], gradient, absl::MakeSpan(params_[t]));
  if (!h.ok()) return h.status();
  in_flight_[t] = Round{*h, deadline};
  return absl::OkStatus();
}

absl::Status StepPipeline::Await(size_t t) {
  CHECK_LT(t, names_.size());
  if (!in_flight_[t].has_value()) return absl::OkStatus();
  const Round round = *in_flight_[t];
  in_flight_[t].reset();  // Wait releases the handle whatever it returns
  return worker_.Wait(round.handle, std::max(round.deadline - absl::Now(), absl::ZeroDuration()));
}

absl::Status StepPipeline::AwaitAll() {
  absl::Status first;
  for (size_t t = 0; t < in_flight_.size(); ++t) {
    absl::Status s = Await(t);
    if (first.ok()) first = s;
  }
  return first;
}

size_t StepPipeline::in_flight() const {
  return static_cast<size_t>(std::count_if(in_flight_.begin(), in_flight_.end(),
                                           [](const std::optional<Round>& r) { return r.has_value(); }));
}

}  // namespace shardps
