#include "worker/local_tier/device_buffer.h"

#include "absl/strings/str_cat.h"
#include "worker/local_tier/device.h"

namespace shardps {

absl::Status DeviceBuffer::CheckRange(size_t offset, size_t len) const {
  if (offset > size_ || len > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", offset + len,
                                                   ") exceeds buffer of ", size_, " floats"));
  }
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CheckSameShape(const DeviceBuffer& src) const {
  if (src.size() != size_ || src.device().kind() != device_.kind()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot copy ", src.size(), " floats on ",
                                                   src.device().name(), " into ", size_,
                                                   " floats on ", device_.name()));
  }
  return absl::OkStatus();
}

}  // namespace shardps
