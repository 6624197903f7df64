#include "worker/local_tier/device_cpu.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

constexpr size_t kAlignment = 64;

// Host buffer; frees its memory on destruction.
class CpuBuffer : public DeviceBuffer {
 public:
  CpuBuffer(Device& device, float* data, size_t size) : DeviceBuffer(device, data, size) {}
  ~CpuBuffer() override { std::free(data()); }

  absl::Status CopyFromHost(absl::Span<const float> src, size_t offset) override {
    absl::Status range = CheckRange(offset, src.size());
    if (!range.ok()) return range;
    if (!src.empty()) std::memcpy(data() + offset, src.data(), src.size() * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status CopyToHost(size_t offset, absl::Span<float> dst) const override {
    absl::Status range = CheckRange(offset, dst.size());
    if (!range.ok()) return range;
    if (!dst.empty()) std::memcpy(dst.data(), data() + offset, dst.size() * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status CopyFrom(const DeviceBuffer& src) override {
    absl::Status shape = CheckSameShape(src);
    if (!shape.ok()) return shape;
    if (size() > 0) std::memcpy(data(), src.data(), size() * sizeof(float));
    return absl::OkStatus();
  }
};

}  // namespace

CpuDevice::CpuDevice(int index)
    : Device(DeviceKind::kCpu, index, index, std::make_unique<DeviceThread>(nullptr)) {}

std::unique_ptr<CpuDevice> CpuDevice::Create(int index) {
  return std::unique_ptr<CpuDevice>(new CpuDevice(index));
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuDevice::Allocate(size_t num_floats) {
  // Round up so aligned_alloc's size is a multiple of the alignment; at least
  // one block so data() is never null.
  if (num_floats > (SIZE_MAX - kAlignment) / sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat(name(), ": ", num_floats, " floats"));
  }
  const size_t bytes = num_floats * sizeof(float);
  const size_t rounded = (bytes / kAlignment + 1) * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": cannot allocate ", bytes, " bytes"));
  }
  std::memset(data, 0, rounded);  // Zeroed, and pages touched before timing.
  return std::unique_ptr<DeviceBuffer>(new CpuBuffer(*this, static_cast<float*>(data), num_floats));
}

}  // namespace shardps
