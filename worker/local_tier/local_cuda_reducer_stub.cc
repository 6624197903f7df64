// Stand-in for local_cuda_reducer.cu in builds without CUDA.
#include "worker/local_tier/local_cuda_reducer.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<LocalReducer>> CreateCudaLocalReducer(
    std::vector<Device*> /*devices*/, const LocalReducerOptions& /*options*/) {
  return absl::FailedPreconditionError("CUDA LocalReducer requested but this build has no CUDA");
}

}  // namespace shardps
