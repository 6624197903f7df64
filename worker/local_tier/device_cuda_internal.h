// CudaDevice: a Device on one GPU: buffers in device memory, one non-blocking
// stream on which all of the device's copies run, a thread bound to the GPU.
//
// Internal: includes CUDA headers, so only .cu files of the local tier include
// it. Everyone else uses device.h / device_cuda.h.
// Ownership: owns its stream (destroyed with the device). Buffers borrow it.
// Thread safety: Allocate may be called from any thread; work queued on
// stream() is ordered by the stream only.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_INTERNAL_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_INTERNAL_H_

#include <cuda_runtime.h>

#include <memory>

#include "absl/status/statusor.h"
#include "worker/local_tier/device.h"

namespace shardps {

// Makes `ordinal` the calling thread's current GPU for its lifetime, then
// restores the previous one.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int ordinal);
  ~ScopedCudaDevice();
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;
  // Status of the cudaSetDevice call made by the constructor.
  const absl::Status& status() const { return status_; }

 private:
  // Records the current GPU in *previous, then selects `ordinal`.
  static absl::Status Enter(int ordinal, int* previous);

  int previous_ = -1;
  absl::Status status_;
};

class CudaDevice : public Device {
 public:
  // REQUIRES: 0 <= ordinal < CudaDeviceCount().
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal, int index);
  ~CudaDevice() override;

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t num_floats) override;

  // The stream for this device's copies and kernels.
  cudaStream_t stream() const { return stream_; }

 private:
  CudaDevice(int ordinal, int index, cudaStream_t stream);

  cudaStream_t stream_;
};

// The CudaDevice behind `device`. REQUIRES: device.kind() == DeviceKind::kCuda.
CudaDevice& AsCudaDevice(Device& device);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_INTERNAL_H_
