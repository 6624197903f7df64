#include "worker/local_tier/device_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

// Keeps the first error.
void Update(absl::Status& status, absl::Status next) {
  if (status.ok()) status = std::move(next);
}

absl::Status CheckPermutation(const std::vector<size_t>& order, size_t n) {
  std::vector<bool> seen(n, false);
  if (order.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceGroup: priority lists ", order.size(), " tensors, expected all ", n));
  }
  for (size_t t : order) {
    if (t >= n || seen[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceGroup: priority entry ", t, " is out of range or repeated (", n, " tensors)"));
    }
    seen[t] = true;
  }
  return absl::OkStatus();
}

}  // namespace

DeviceGroup::DeviceGroup(Worker& worker, std::vector<std::unique_ptr<Device>> devices,
                         std::vector<GroupTensor> tensors)
    : worker_(worker), devices_(std::move(devices)), tensors_(std::move(tensors)) {}

DeviceGroup::~DeviceGroup() = default;

absl::StatusOr<std::unique_ptr<DeviceGroup>> DeviceGroup::Create(Worker& worker,
                                                                 std::vector<std::unique_ptr<Device>> devices,
                                                                 std::vector<GroupTensor> tensors,
                                                                 DeviceGroupOptions options) {
  if (devices.empty()) return absl::InvalidArgumentError("DeviceGroup: no devices");
  if (tensors.empty()) return absl::InvalidArgumentError("DeviceGroup: no tensors");
  std::vector<size_t> order = std::move(options.priority);
  if (order.empty()) {
    for (size_t t = 0; t < tensors.size(); ++t) order.push_back(t);
  }
  if (absl::Status s = CheckPermutation(order, tensors.size()); !s.ok()) return s;
  if (options.reducer.push_codec.has_value()) {
    return absl::InvalidArgumentError("DeviceGroup: the reducer must push fp32 (the Worker encodes)");
  }
  std::vector<Device*> raw;
  for (const auto& device : devices) raw.push_back(device.get());
  auto reducer = LocalReducer::Create(std::move(raw), options.reducer);
  if (!reducer.ok()) return reducer.status();

  std::unique_ptr<DeviceGroup> group(new DeviceGroup(worker, std::move(devices), std::move(tensors)));
  group->reducer_ = std::move(*reducer);
  if (absl::Status s = group->PlanSteps(order); !s.ok()) return s;
  if (absl::Status s = group->Allocate(); !s.ok()) return s;
  return group;
}

absl::Status DeviceGroup::PlanSteps(const std::vector<size_t>& order) {
  for (size_t t : order) {
    const GroupTensor& tensor = tensors_[t];
    auto partitions = worker_.Partitions(tensor.name);
    if (!partitions.ok()) return partitions.status();
    size_t covered = 0;
    for (size_t p = 0; p < partitions->size(); ++p) {
      const Worker::PartitionExtent& extent = (*partitions)[p];
      if (extent.offset != covered) break;
      covered += extent.num_elements;
      steps_.push_back({t, p, extent.offset, extent.num_elements});
    }
    if (covered != tensor.num_elements) {
      return absl::InvalidArgumentError(absl::StrCat("DeviceGroup: tensor '", tensor.name, "' has ",
                                                     tensor.num_elements, " elements but its partitions cover ",
                                                     covered, " contiguously"));
    }
  }
  handles_.reserve(std::max(steps_.size(), tensors_.size()));
  return absl::OkStatus();
}

absl::Status DeviceGroup::Allocate() {
  const size_t num_tensors = tensors_.size();
  slots_.resize(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (const GroupTensor& tensor : tensors_) {
      auto gradient = devices_[d]->Allocate(tensor.num_elements);
      if (!gradient.ok()) return gradient.status();
      auto weights = devices_[d]->Allocate(tensor.num_elements);
      if (!weights.ok()) return weights.status();
      slots_[d].gradients.push_back(std::move(*gradient));
      slots_[d].weights.push_back(std::move(*weights));
    }
  }
  host_.resize(num_tensors);
  gradient_lists_.resize(num_tensors);
  weight_lists_.resize(num_tensors);
  for (size_t t = 0; t < num_tensors; ++t) {
    host_[t].weights.assign(tensors_[t].num_elements, 0.0f);
    for (const DeviceSlot& slot : slots_) {
      gradient_lists_[t].push_back(slot.gradients[t].get());
      weight_lists_[t].push_back(slot.weights[t].get());
    }
  }
  for (const Step& step : steps_) {
    ranges_.push_back({gradient_lists_[step.tensor], step.offset, step.length, 0, 0});
  }
  return absl::OkStatus();
}

absl::Status DeviceGroup::Round(absl::Duration timeout) {
  handles_.clear();
  // The payloads stay in the reducer's staging until the next MergeEncode,
  // i.e. past every Wait below: the Worker may borrow them.
  absl::Status status = reducer_->MergeEncode(
      ranges_, MergeOp::kAverage, [&](size_t i, absl::Span<const uint8_t> payload) -> absl::Status {
        const Step& step = steps_[i];
        absl::Span<const float> gradient(reinterpret_cast<const float*>(payload.data()), step.length);
        auto handle = worker_.PushPullPartition(
            tensors_[step.tensor].name, step.partition, gradient,
            absl::MakeSpan(host_[step.tensor].weights).subspan(step.offset, step.length));
        if (!handle.ok()) return handle.status();
        handles_.push_back(*handle);
        return absl::OkStatus();
      });
  return WaitAndBroadcast(handles_.size(), timeout, std::move(status));
}

absl::Status DeviceGroup::WaitAndBroadcast(size_t issued, absl::Duration timeout, absl::Status status) {
  for (size_t i = 0; i < issued; ++i) {
    const Step& step = steps_[i];
    absl::Status waited = worker_.Wait(handles_[i], timeout);
    Update(status, std::move(waited));
    if (!status.ok()) continue;  // Still wait for the rest: the Worker borrows our buffers.
    absl::Span<const float> weights = absl::MakeConstSpan(host_[step.tensor].weights).subspan(step.offset, step.length);
    Update(status, reducer_->Broadcast(weights, absl::MakeSpan(weight_lists_[step.tensor]), step.offset));
  }
  return status;
}

absl::Status DeviceGroup::Pull(absl::Duration timeout) {
  handles_.clear();
  absl::Status status;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    auto handle = worker_.Pull(tensors_[t].name, absl::MakeSpan(host_[t].weights));
    if (!handle.ok()) {
      status = handle.status();
      break;
    }
    handles_.push_back(*handle);
  }
  for (size_t t = 0; t < handles_.size(); ++t) {
    Update(status, worker_.Wait(handles_[t], timeout));
    if (status.ok()) Update(status, reducer_->Broadcast(host_[t].weights, absl::MakeSpan(weight_lists_[t]), 0));
  }
  return status;
}

}  // namespace shardps
