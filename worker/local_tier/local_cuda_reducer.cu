// CUDA LocalReducer. Default path: the root (device 0) stream waits for every
// device's stream, peer-copies inputs 1..D-1 into root scratch, runs an
// element-wise kernel that adds them in device order (explicit __fadd_rn /
// __fmul_rn, so no FMA contraction: bitwise equal to the CPU reducer), then
// copies the result to pinned host staging and from there to the caller.
// Broadcast: caller -> pinned staging -> device 0 -> peer copies (root stream).
// With use_nccl (and SHARDPS_WITH_NCCL): ncclReduce / ncclBroadcast instead.
// Scratch and staging grow on first use for a size and are reused after.
//
// MergeEncode and DecodeBroadcast are in local_cuda_encode.cu.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "worker/local_tier/local_cuda_reducer.h"
#include "worker/local_tier/local_cuda_reducer_internal.h"

#if defined(SHARDPS_WITH_NCCL)
#define SHARDPS_NCCL_RETURN_IF_ERROR(call)                                                         \
  do {                                                                                             \
    ncclResult_t _r = (call);                                                                      \
    if (_r != ncclSuccess) {                                                                       \
      return absl::InternalError(absl::StrCat(#call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                              ncclGetErrorString(_r)));                            \
    }                                                                                              \
  } while (0)
#endif

namespace shardps {
namespace {

constexpr int kThreads = 256;

// out[i] = ((in0[i] + peers[0][i]) + peers[1][i]) + ...; then * scale.
__global__ void SumInDeviceOrderKernel(const float* __restrict__ in0,
                                       const float* __restrict__ peers, int num_peers,
                                       size_t stride, size_t len, bool apply_scale, float scale,
                                       float* __restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < len;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = in0[i];
    for (int p = 0; p < num_peers; ++p) acc = __fadd_rn(acc, peers[p * stride + i]);
    out[i] = apply_scale ? __fmul_rn(acc, scale) : acc;
  }
}

// data[i] = data[i] * scale (averaging after an NCCL sum).
__global__ void ScaleKernel(float* data, size_t len, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < len;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = __fmul_rn(data[i], scale);
  }
}

int Blocks(size_t len) {
  return static_cast<int>(std::min<size_t>((len + kThreads - 1) / kThreads, 65535));
}

}  // namespace

CudaLocalReducer::~CudaLocalReducer() {
  // Teardown errors have no caller to report to.
#if defined(SHARDPS_WITH_NCCL)
  for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
#endif
  for (int d = 0; d < static_cast<int>(events_.size()); ++d) {
    ScopedCudaDevice scoped(ordinals_[d]);
    cudaEventDestroy(events_[d]);
  }
  ScopedCudaDevice scoped(ordinals_[0]);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (cudaEvent_t e : encoded_) cudaEventDestroy(e);
  for (cudaEvent_t e : copied_) cudaEventDestroy(e);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  for (auto& [key, residual] : residuals_) cudaFree(residual.data);
  for (void* p : {static_cast<void*>(scratch_), static_cast<void*>(device_payloads_), workspace_,
                  static_cast<void*>(pull_payload_)}) {
    if (p != nullptr) cudaFree(p);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (pinned_payloads_ != nullptr) cudaFreeHost(pinned_payloads_);
  (void)cudaGetLastError();  // teardown errors have no caller: leave none behind for the next launch check
}

absl::Status CudaLocalReducer::Init() {
  for (int d = 0; d < num_devices(); ++d) {
    ScopedCudaDevice scoped(cuda(d).ordinal());
    SHARDPS_RETURN_IF_ERROR(scoped.status());
    cudaEvent_t event = nullptr;
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.push_back(event);
    // Direct peer access where the hardware allows; copies work without it.
    if (d > 0 && cuda(d).ordinal() != cuda(0).ordinal()) {
      int can_access = 0;
      SHARDPS_CUDA_RETURN_IF_ERROR(
          cudaDeviceCanAccessPeer(&can_access, cuda(0).ordinal(), cuda(d).ordinal()));
      ScopedCudaDevice root(cuda(0).ordinal());
      if (can_access && cudaDeviceEnablePeerAccess(cuda(d).ordinal(), 0) != cudaSuccess) {
        cudaGetLastError();  // Already enabled by another reducer: fine.
      }
    }
  }
  {
    ScopedCudaDevice root(cuda(0).ordinal());
    SHARDPS_RETURN_IF_ERROR(root.status());
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }
#if defined(SHARDPS_WITH_NCCL)
  if (use_nccl_) {
    std::vector<int> ordinals;
    for (int d = 0; d < num_devices(); ++d) ordinals.push_back(cuda(d).ordinal());
    comms_.resize(ordinals.size());
    SHARDPS_NCCL_RETURN_IF_ERROR(
        ncclCommInitAll(comms_.data(), static_cast<int>(ordinals.size()), ordinals.data()));
  }
#endif
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::EnsureScratch(size_t floats) {
  if (floats <= scratch_floats_) return absl::OkStatus();
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  if (scratch_ != nullptr) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(root_stream()));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_floats_ = 0;
  }
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, floats * sizeof(float)));
  scratch_floats_ = floats;
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::EnsureStaging(size_t floats) {
  if (floats <= staging_floats_) return absl::OkStatus();
  if (staging_ != nullptr) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_floats_ = 0;
  }
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging_, floats * sizeof(float)));
  staging_floats_ = floats;
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::RootWaitsForDevices() {
  for (int d = 1; d < num_devices(); ++d) {
    ScopedCudaDevice scoped(cuda(d).ordinal());
    SHARDPS_RETURN_IF_ERROR(scoped.status());
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[d], cuda(d).stream()));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(root_stream(), events_[d], 0));
  }
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::MergeWithPeerCopies(absl::Span<const DeviceBuffer* const> inputs,
                                                   size_t offset, size_t len, MergeOp op,
                                                   float* dest, const float** result) {
  const int peers = num_devices() - 1;
  if (peers == 0 && op == MergeOp::kSum) {
    *result = inputs[0]->data() + offset;
    return absl::OkStatus();
  }
  SHARDPS_RETURN_IF_ERROR(EnsureScratch((peers + 1) * len));
  SHARDPS_RETURN_IF_ERROR(RootWaitsForDevices());
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  for (int p = 0; p < peers; ++p) {
    SHARDPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyPeerAsync(scratch_ + p * len, cuda(0).ordinal(), inputs[p + 1]->data() + offset,
                            cuda(p + 1).ordinal(), len * sizeof(float), root_stream()));
  }
  float* sum = dest != nullptr ? dest : scratch_ + peers * len;
  SHARDPS_CUDA_CLEAR_STALE_ERROR();
  SumInDeviceOrderKernel<<<Blocks(len), kThreads, 0, root_stream()>>>(
      inputs[0]->data() + offset, scratch_, peers, len, len, op == MergeOp::kAverage,
      1.0f / static_cast<float>(num_devices()), sum);
  SHARDPS_CUDA_RETURN_IF_LAUNCH_FAILED();
  *result = sum;
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::CopyResultToHost(const float* device_result, absl::Span<float> out) {
  SHARDPS_RETURN_IF_ERROR(EnsureStaging(out.size()));
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_, device_result, out.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, root_stream()));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(root_stream()));
  std::memcpy(out.data(), staging_, out.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                                       absl::Span<float> out, MergeOp op) {
  const float* result = nullptr;
#if defined(SHARDPS_WITH_NCCL)
  if (use_nccl_) {
    SHARDPS_RETURN_IF_ERROR(MergeWithNccl(inputs, offset, out.size(), op, &result));
    return CopyResultToHost(result, out);
  }
#endif
  SHARDPS_RETURN_IF_ERROR(MergeWithPeerCopies(inputs, offset, out.size(), op, nullptr, &result));
  return CopyResultToHost(result, out);
}

absl::Status CudaLocalReducer::DoBroadcast(absl::Span<const float> in,
                                           absl::Span<DeviceBuffer* const> outputs, size_t offset) {
  const size_t len = in.size(), bytes = len * sizeof(float);
  SHARDPS_RETURN_IF_ERROR(EnsureStaging(len));
  // The previous call synchronised the root stream, so staging is free.
  std::memcpy(staging_, in.data(), bytes);
  SHARDPS_RETURN_IF_ERROR(RootWaitsForDevices());  // Earlier readers of outputs are done.
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  float* root = outputs[0]->data() + offset;
  SHARDPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(root, staging_, bytes, cudaMemcpyHostToDevice, root_stream()));
#if defined(SHARDPS_WITH_NCCL)
  if (use_nccl_) return BroadcastWithNccl(outputs, offset, len);
#endif
  for (int d = 1; d < num_devices(); ++d) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(outputs[d]->data() + offset, cuda(d).ordinal(),
                                                     root, cuda(0).ordinal(), bytes,
                                                     root_stream()));
  }
  // Synchronous: once this returns, work on any device stream sees the data.
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(root_stream()));
  return absl::OkStatus();
}


#if defined(SHARDPS_WITH_NCCL)
absl::Status CudaLocalReducer::MergeWithNccl(absl::Span<const DeviceBuffer* const> inputs,
                                             size_t offset, size_t len, MergeOp op,
                                             const float** result) {
  SHARDPS_RETURN_IF_ERROR(EnsureScratch(len));
  SHARDPS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (int d = 0; d < num_devices(); ++d) {
    SHARDPS_NCCL_RETURN_IF_ERROR(ncclReduce(inputs[d]->data() + offset, d == 0 ? scratch_ : nullptr,
                                            len, ncclFloat, ncclSum, 0, comms_[d],
                                            cuda(d).stream()));
  }
  SHARDPS_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  if (op == MergeOp::kAverage) {
    ScopedCudaDevice scoped(cuda(0).ordinal());
    SHARDPS_RETURN_IF_ERROR(scoped.status());
    SHARDPS_CUDA_CLEAR_STALE_ERROR();
    ScaleKernel<<<Blocks(len), kThreads, 0, root_stream()>>>(
        scratch_, len, 1.0f / static_cast<float>(num_devices()));
    SHARDPS_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  *result = scratch_;
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::BroadcastWithNccl(absl::Span<DeviceBuffer* const> outputs,
                                                 size_t offset, size_t len) {
  SHARDPS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (int d = 0; d < num_devices(); ++d) {
    float* data = outputs[d]->data() + offset;
    SHARDPS_NCCL_RETURN_IF_ERROR(
        ncclBroadcast(data, data, len, ncclFloat, 0, comms_[d], cuda(d).stream()));
  }
  SHARDPS_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  for (int d = 0; d < num_devices(); ++d) {
    ScopedCudaDevice scoped(cuda(d).ordinal());
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda(d).stream()));
  }
  return absl::OkStatus();
}
#endif

absl::StatusOr<std::unique_ptr<LocalReducer>> CreateCudaLocalReducer(
    std::vector<Device*> devices, const LocalReducerOptions& options) {
#if !defined(SHARDPS_WITH_NCCL)
  if (options.use_nccl) {
    return absl::FailedPreconditionError("LocalReducer: use_nccl set but the build has no NCCL");
  }
#endif
  auto reducer = std::make_unique<CudaLocalReducer>(std::move(devices), options.use_nccl);
  SHARDPS_RETURN_IF_ERROR(reducer->Init());
  return std::unique_ptr<LocalReducer>(std::move(reducer));
}

}  // namespace shardps