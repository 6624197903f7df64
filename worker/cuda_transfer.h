// Host staging for tensors that live in CUDA device memory, for the C ABI's
// shardps_push_pull_cuda: page-locked host buffers and copies ordered on the
// caller's CUDA stream. Declared without CUDA headers; cuda_transfer.cu
// implements it in CUDA builds, cuda_transfer_stub.cc (every call
// Unimplemented) otherwise.
//
// Thread safety: functions are thread-safe; a PinnedHostBuffer is not.
#ifndef SHARDPS_WORKER_CUDA_TRANSFER_H_
#define SHARDPS_WORKER_CUDA_TRANSFER_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardps {

// True when this library was built with CUDA.
bool CudaTransfersBuilt();
// True when CUDA is built and the runtime sees at least one GPU.
bool CudaTransferDevicePresent();

// Page-locked host memory (cudaHostAlloc), freed on destruction.
class PinnedHostBuffer {
 public:
  // ResourceExhausted/Internal naming the size when CUDA cannot allocate it;
  // Unimplemented without CUDA.
  static absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> Create(size_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  PinnedHostBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

// OK when `ptr` is CUDA device (or managed) memory; InvalidArgument naming
// `what` otherwise, FailedPrecondition when no GPU can be used, Unimplemented
// without CUDA.
absl::Status CheckDeviceMemory(const void* ptr, const char* what);

// Copies `bytes` from CUDA device memory to host memory (or back) after the
// work already queued on `stream` (a cudaStream_t; nullptr = the legacy
// default stream) and returns once the copy is complete. InvalidArgument
// naming `what` when `device` is not device (or managed) memory,
// FailedPrecondition when no GPU can be used.
absl::Status CopyFromDevice(void* host, const void* device, size_t bytes, void* stream,
                            const char* what);
absl::Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream,
                          const char* what);

}  // namespace shardps

#endif  // SHARDPS_WORKER_CUDA_TRANSFER_H_
