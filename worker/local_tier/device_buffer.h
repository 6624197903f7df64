// DeviceBuffer: a fixed-size array of floats living in one Device's memory
// (host memory for a CPU device, device memory for a CUDA device).
//
// Ownership: a buffer is created by Device::Allocate and owned by the caller
// through std::unique_ptr; destroying it frees the memory. A buffer borrows
// its Device, which must outlive it.
// Thread safety: concurrent reads are safe; writes (CopyFromHost, kernels that
// write data()) must not overlap other access to the same elements.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_BUFFER_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_BUFFER_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardps {

class Device;

class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Number of floats in the buffer.
  size_t size() const { return size_; }
  // The device whose memory holds the buffer.
  Device& device() const { return device_; }
  // Pointer in the owning device's address space: dereferenceable on the host
  // only for CPU devices. Never null for size() > 0.
  float* data() const { return data_; }

  // Copies src into elements [offset, offset + src.size()). Returns when the
  // data is in the buffer. InvalidArgument when the range exceeds size().
  virtual absl::Status CopyFromHost(absl::Span<const float> src, size_t offset = 0) = 0;
  // Copies elements [offset, offset + dst.size()) into dst. Returns when dst
  // holds the data. InvalidArgument when the range exceeds size().
  virtual absl::Status CopyToHost(size_t offset, absl::Span<float> dst) const = 0;
  // Copies all of `src` (a buffer of the same kind and size, possibly on
  // another device: a peer copy for CUDA) into this buffer. Returns when done.
  // InvalidArgument on a kind or size mismatch.
  virtual absl::Status CopyFrom(const DeviceBuffer& src) = 0;

 protected:
  DeviceBuffer(Device& device, float* data, size_t size)
      : device_(device), data_(data), size_(size) {}

  // Returns InvalidArgument unless [offset, offset + len) lies inside the buffer.
  absl::Status CheckRange(size_t offset, size_t len) const;
  // Returns InvalidArgument unless `src` has this buffer's size and device kind.
  absl::Status CheckSameShape(const DeviceBuffer& src) const;

 private:
  Device& device_;
  float* const data_;
  const size_t size_;
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_BUFFER_H_
