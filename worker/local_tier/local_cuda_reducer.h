// Factory for the CUDA LocalReducer, declared without CUDA headers.
// Implemented by local_cuda_reducer.cu (peer copies into device 0 + an ordered
// sum kernel, or NCCL reduce/broadcast on request), or by
// local_cuda_reducer_stub.cc in builds without CUDA.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/local_tier/local_reducer.h"

namespace shardps {

// REQUIRES: devices non-empty, all DeviceKind::kCuda (LocalReducer::Create
// checks). FailedPrecondition without CUDA, or with use_nccl and no NCCL.
absl::StatusOr<std::unique_ptr<LocalReducer>> CreateCudaLocalReducer(
    std::vector<Device*> devices, const LocalReducerOptions& options);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_H_
