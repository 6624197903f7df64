// CUDA device factory, declared without CUDA headers so that callers build
// whether or not the CUDA target exists. Implemented by device_cuda.cu, or by
// device_cuda_stub.cc when the build has no CUDA.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/local_tier/device.h"

namespace shardps {

// True when this binary was built with the CUDA target.
bool CudaBuilt();

// Number of GPUs the CUDA runtime reports; 0 without CUDA, driver or GPU.
int CudaDeviceCount();

// Creates a Device for GPU `ordinal`, listed at position `index`. Several
// devices may share one ordinal (each gets its own stream and thread): tests
// and benchmarks use that to exercise D > 1 on a single GPU.
// FailedPrecondition when the build has no CUDA or the GPU is absent.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, int index);

// Median seconds of one cudaMemcpyAsync of `bytes` from GPU `ordinal` into
// pinned host memory (cudaHostAlloc) plus a stream synchronize, over `iters`
// runs after a warm-up: the limit the local tier's host copies are measured
// against. FailedPrecondition without CUDA; InvalidArgument for bytes == 0.
absl::StatusOr<double> CudaPinnedToHostSeconds(int ordinal, size_t bytes, int iters);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_CUDA_H_
