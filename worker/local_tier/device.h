// Device: one compute device of a worker, either a CPU device (host buffers)
// or a CUDA device (device buffers, one stream, pinned host staging), so the
// local first tier runs and is tested on machines without a GPU.
//
// Every device owns one thread (DeviceThread) on which per-device work such as
// forward/backward runs; for CUDA devices that thread is bound to the GPU
// (cudaSetDevice) before any task runs.
//
// Ownership: CreateDevices returns the devices owned by the caller. Buffers
// borrow their device: destroy every buffer before its device.
// Thread safety: Allocate and Submit may be called from any thread.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_H_

#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/local_tier/device_buffer.h"
#include "worker/local_tier/device_thread.h"

namespace shardps {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda".
const char* DeviceKindName(DeviceKind kind);

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceKind kind() const { return kind_; }
  // Position of this device in the list CreateDevices returned (0..D-1).
  int index() const { return index_; }
  // CUDA ordinal for CUDA devices; equal to index() for CPU devices.
  int ordinal() const { return ordinal_; }
  // E.g. "cpu:2" or "cuda:1".
  std::string name() const;

  // Allocates a zero-initialised buffer of `num_floats` floats in this
  // device's memory. ResourceExhausted when the memory is not available.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t num_floats) = 0;

  // Runs `work` on this device's thread, after all earlier submitted work.
  // The future yields the status `work` returned.
  std::future<absl::Status> Submit(std::function<absl::Status()> work) {
    return thread_->Submit(std::move(work));
  }

 protected:
  Device(DeviceKind kind, int index, int ordinal, std::unique_ptr<DeviceThread> thread)
      : kind_(kind), index_(index), ordinal_(ordinal), thread_(std::move(thread)) {}

 private:
  const DeviceKind kind_;
  const int index_;
  const int ordinal_;
  std::unique_ptr<DeviceThread> thread_;
};

// Creates the devices named by `spec`:
//   "cpu"                 one CPU device
//   "cpu:N"               N CPU devices (1 <= N <= 1024)
//   "cuda"                every visible GPU
//   "cuda:I[,cuda:J...]"  the listed GPU ordinals, in that order, no repeats
// Returns InvalidArgument for a malformed spec (naming it), FailedPrecondition
// when a GPU is named but this build has no CUDA or the GPU is not present
// (naming how many were found).
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(std::string_view spec);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_H_
