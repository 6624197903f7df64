// CUDA error handling shared by every .cu file: one macro turns a CUDA error
// into an absl::Status naming the call and where it was made.
// Include only from .cu files or files compiled with CUDA headers available.
#ifndef SHARDPS_COMMON_CUDA_STATUS_H_
#define SHARDPS_COMMON_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardps {

inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace shardps

// Evaluates a CUDA runtime call; on error returns the status from the enclosing function.
#define SHARDPS_CUDA_RETURN_IF_ERROR(call)                                         \
  do {                                                                             \
    absl::Status _st = ::shardps::CudaStatus((call), #call, __FILE__, __LINE__);   \
    if (!_st.ok()) return _st;                                                     \
  } while (0)

// Checks a kernel launch. cudaGetLastError also returns (and clears) an error
// left by an earlier call that nobody checked, which would then be blamed on
// this launch: clear it first with SHARDPS_CUDA_CLEAR_STALE_ERROR() right
// before the <<<...>>>, then check with SHARDPS_CUDA_RETURN_IF_LAUNCH_FAILED().
// (Sticky errors, such as a lost device, survive the clearing and are
// reported.)
#define SHARDPS_CUDA_CLEAR_STALE_ERROR() (void)cudaGetLastError()
#define SHARDPS_CUDA_RETURN_IF_LAUNCH_FAILED() SHARDPS_CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // SHARDPS_COMMON_CUDA_STATUS_H_
