// CpuDevice: a Device whose buffers are 64-byte aligned host memory. Used on
// machines without a GPU and in tests; each CPU device has its own thread.
//
// Ownership: see Device. Thread safety: see Device.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_CPU_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_CPU_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/local_tier/device.h"

namespace shardps {

class CpuDevice : public Device {
 public:
  // Creates CPU device number `index`.
  static std::unique_ptr<CpuDevice> Create(int index);

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t num_floats) override;

 private:
  explicit CpuDevice(int index);
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_CPU_H_
