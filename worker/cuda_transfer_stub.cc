// Stand-in for cuda_transfer.cu in builds without CUDA.
#include "worker/cuda_transfer.h"

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

absl::Status NoCuda(const char* what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": this ShardPS library was built without CUDA; pass host buffers instead"));
}

}  // namespace

bool CudaTransfersBuilt() { return false; }

bool CudaTransferDevicePresent() { return false; }

absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> PinnedHostBuffer::Create(size_t /*bytes*/) {
  return NoCuda("pinned host buffer");
}

PinnedHostBuffer::~PinnedHostBuffer() = default;

absl::Status CheckDeviceMemory(const void*, const char* what) { return NoCuda(what); }

absl::Status CopyFromDevice(void*, const void*, size_t, void*, const char* what) { return NoCuda(what); }

absl::Status CopyToDevice(void*, const void*, size_t, void*, const char* what) { return NoCuda(what); }

}  // namespace shardps
