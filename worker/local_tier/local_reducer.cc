#include "worker/local_tier/local_reducer.h"

#include "absl/strings/str_cat.h"
#include "worker/local_tier/local_cpu_reducer.h"
#include "worker/local_tier/local_cuda_reducer.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<LocalReducer>> LocalReducer::Create(std::vector<Device*> devices,
                                                                   LocalReducerOptions options) {
  if (devices.empty()) return absl::InvalidArgumentError("LocalReducer needs at least one device");
  for (Device* device : devices) {
    if (device == nullptr || device->kind() != devices[0]->kind()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LocalReducer devices must all be ", DeviceKindName(devices[0]->kind()), " devices"));
    }
  }
  if (devices[0]->kind() == DeviceKind::kCpu) {
    return CpuLocalReducer::Create(std::move(devices), options);
  }
  return CreateCudaLocalReducer(std::move(devices), options);
}

template <typename Buffer>
absl::Status LocalReducer::CheckBuffers(absl::Span<Buffer* const> buffers, size_t offset,
                                        size_t len) const {
  if (buffers.size() != devices_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", buffers.size(), " buffers for ", devices_.size(), " devices"));
  }
  for (size_t d = 0; d < buffers.size(); ++d) {
    if (buffers[d] == nullptr || &buffers[d]->device() != devices_[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer ", d, " does not live on ", devices_[d]->name()));
    }
    if (offset > buffers[d]->size() || len > buffers[d]->size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", offset + len,
                                                     ") exceeds buffer ", d, " of ",
                                                     buffers[d]->size(), " floats"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalReducer::Merge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                                 absl::Span<float> out, MergeOp op) {
  absl::Status valid = CheckBuffers(inputs, offset, out.size());
  if (!valid.ok() || out.empty()) return valid;
  absl::MutexLock lock(&call_mu_);
  return DoMerge(inputs, offset, out, op);
}

absl::Status LocalReducer::Broadcast(absl::Span<const float> in,
                                     absl::Span<DeviceBuffer* const> outputs, size_t offset) {
  absl::Status valid = CheckBuffers(outputs, offset, in.size());
  if (!valid.ok() || in.empty()) return valid;
  absl::MutexLock lock(&call_mu_);
  return DoBroadcast(in, outputs, offset);
}

}  // namespace shardps
