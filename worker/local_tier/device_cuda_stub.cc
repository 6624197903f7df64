// Stand-in for device_cuda.cu in builds without CUDA.
#include "absl/strings/str_cat.h"
#include "worker/local_tier/device_cuda.h"

namespace shardps {

bool CudaBuilt() { return false; }

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, int /*index*/) {
  return absl::FailedPreconditionError(
      absl::StrCat("cuda:", ordinal, " requested but this build has no CUDA support"));
}

absl::StatusOr<double> CudaPinnedToHostSeconds(int ordinal, size_t /*bytes*/, int /*iters*/) {
  return absl::FailedPreconditionError(
      absl::StrCat("pinned copy from cuda:", ordinal, " requested but this build has no CUDA support"));
}

}  // namespace shardps
