// CUDA implementation of cuda_transfer.h.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "worker/cuda_transfer.h"

namespace shardps {
namespace {

absl::Status Copy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, from, bytes, kind, s));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

}  // namespace

bool CudaTransfersBuilt() { return true; }

bool CudaTransferDevicePresent() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();  // Leave no error behind for the next launch check.
  return present;
}

absl::Status CheckDeviceMemory(const void* ptr, const char* what) {
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err != cudaErrorInvalidValue) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": no usable CUDA device (", cudaGetErrorName(err), ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, " is not CUDA memory"));
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not CUDA device memory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> PinnedHostBuffer::Create(size_t bytes) {
  void* data = nullptr;
  const cudaError_t err = cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    const std::string why = absl::StrCat("cudaHostAlloc of ", bytes, " bytes failed: ", cudaGetErrorName(err));
    if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(why);
    return absl::FailedPreconditionError(why);
  }
  return std::unique_ptr<PinnedHostBuffer>(new PinnedHostBuffer(data, bytes));
}

PinnedHostBuffer::~PinnedHostBuffer() { cudaFreeHost(data_); }

absl::Status CopyFromDevice(void* host, const void* device, size_t bytes, void* stream,
                            const char* what) {
  absl::Status valid = CheckDeviceMemory(device, what);
  if (!valid.ok()) return valid;
  return Copy(host, device, bytes, cudaMemcpyDeviceToHost, stream);
}

absl::Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream,
                          const char* what) {
  absl::Status valid = CheckDeviceMemory(device, what);
  if (!valid.ok()) return valid;
  return Copy(device, host, bytes, cudaMemcpyHostToDevice, stream);
}

}  // namespace shardps
