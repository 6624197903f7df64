// CUDA LocalReducer. Default path: the root (device 0) stream waits for every
// device's stream, peer-copies inputs 1..D-1 into root scratch, runs an
// element-wise kernel that adds them in device order (explicit __fadd_rn /
// __fmul_rn, so no FMA contraction: bitwise equal to the CPU reducer), then
// copies the result to pinned host staging and from there to the caller.
// Broadcast: caller -> pinned staging -> device 0 -> peer copies (root stream).
// With use_nccl (and SHARDPS_WITH_NCCL): ncclReduce / ncclBroadcast instead.
// Scratch and staging grow on first use for a size and are reused after.
//
// MergeEncode runs on device 0 with two streams: the root stream merges range
// k (peer copies + sum kernel, or straight into the device payload area for
// fp32) and encodes it with the compression CUDA kernels (error-feedback
// residuals fused, kept per key on device 0); a copy stream waits for that
// and copies just the payload into pinned host staging (cudaHostAlloc), while
// the root stream goes on with range k+1. The sink gets range k once its copy
// event fired. DecodeBroadcast copies the payload to device 0, decodes there
// (validating first) and peer-copies the values to the other devices.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "compression/cuda_codec_ops.h"
#include "worker/local_tier/device_cuda_internal.h"
#include "worker/local_tier/local_cuda_reducer.h"

#if defined(SHARDPS_WITH_NCCL)
#include <nccl.h>

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

class CudaLocalReducer : public LocalReducer {
 public:
  CudaLocalReducer(std::vector<Device*> devices, bool use_nccl)
      : LocalReducer(devices), use_nccl_(use_nccl) {
    for (Device* d : devices) ordinals_.push_back(AsCudaDevice(*d).ordinal());
  }
  ~CudaLocalReducer() override;

  // Creates one event per device (and NCCL communicators when asked).
  absl::Status Init();

 protected:
  absl::Status DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                       absl::Span<float> out, MergeOp op) override;
  absl::Status DoBroadcast(absl::Span<const float> in, absl::Span<DeviceBuffer* const> outputs,
                           size_t offset) override;
  absl::Status DoMergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op,
                             PayloadSink sink) override;
  absl::Status DoDecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed, size_t length,
                                 bool accumulate, absl::Span<DeviceBuffer* const> outputs,
                                 size_t offset) override;

 private:
  CudaDevice& cuda(int d) const { return AsCudaDevice(device(d)); }
  cudaStream_t root_stream() const { return cuda(0).stream(); }

  absl::Status EnsureScratch(size_t floats);  // On device 0.
  absl::Status EnsureStaging(size_t floats);  // Pinned host.
  // Makes the root stream wait for all work queued so far on every device.
  absl::Status RootWaitsForDevices();
  absl::Status CopyResultToHost(const float* device_result, absl::Span<float> out);
  // Merges into `dest` (device 0), or into scratch when dest is null; with
  // D = 1 and kSum *result is the input itself.
  absl::Status MergeWithPeerCopies(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                                   size_t len, MergeOp op, float* dest, const float** result);
  // Device payload area, pinned staging, events and codec workspace for
  // `ranges` (laid out by PlanPayloads into `total` bytes).
  absl::Status EnsureEncodeBuffers(absl::Span<const EncodeRange> ranges, size_t total);
  absl::Status EnsureWorkspace(const compression::CodecParams& params, size_t len);
  // Queues merge + encode of ranges[i] on the root stream and its payload's
  // copy to pinned staging on the copy stream.
  absl::Status QueueEncode(const EncodeRange& range, size_t i, MergeOp op);
  // The key's residual on device 0 (zeroed when new).
  absl::StatusOr<float*> Residual(uint64_t key, size_t len);
  // Waits for both streams (after an error: nothing may still write staging).
  void Drain();
#if defined(SHARDPS_WITH_NCCL)
  absl::Status MergeWithNccl(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                             size_t len, MergeOp op, const float** result);
  absl::Status BroadcastWithNccl(absl::Span<DeviceBuffer* const> outputs, size_t offset,
                                 size_t len);
  std::vector<ncclComm_t> comms_;
#endif

  const bool use_nccl_;
  // The devices' ordinals, kept so that teardown never dereferences a
  // device: a reducer replaced after its devices were destroyed freed its
  // memory through a dangling Device (an invalid ordinal, then a stale error
  // blamed on the next kernel launch).
  std::vector<int> ordinals_;
  std::vector<cudaEvent_t> events_;  // events_[d] lives on device d.
  float* scratch_ = nullptr;         // Device 0: D-1 peer slices + 1 result.
  size_t scratch_floats_ = 0;
  float* staging_ = nullptr;  // Pinned host.
  size_t staging_floats_ = 0;
  // MergeEncode / DecodeBroadcast state, all on device 0 (or pinned host).
  cudaStream_t copy_stream_ = nullptr;
  std::vector<cudaEvent_t> encoded_, copied_;  // Per range.
  uint8_t* device_payloads_ = nullptr;
  uint8_t* pinned_payloads_ = nullptr;
  size_t payload_bytes_ = 0;  // Capacity of both.
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  uint8_t* pull_payload_ = nullptr;  // Device copy of a DecodeBroadcast payload.
  size_t pull_bytes_ = 0;
  struct DeviceResidual {
    float* data = nullptr;
    size_t len = 0;
  };
  std::vector<std::pair<uint64_t, DeviceResidual>> residuals_;  // Few keys: linear search.
};

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

absl::Status CudaLocalReducer::EnsureWorkspace(const compression::CodecParams& params, size_t len) {
  SHARDPS_ASSIGN_OR_RETURN(size_t need, compression::CudaWorkspaceBytes(params, len));
  if (need <= workspace_bytes_) return absl::OkStatus();
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(root_stream()));
  if (workspace_ != nullptr) SHARDPS_CUDA_RETURN_IF_ERROR(cudaFree(workspace_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, need));
  workspace_bytes_ = need;
  return absl::OkStatus();
}

absl::Status CudaLocalReducer::EnsureEncodeBuffers(absl::Span<const EncodeRange> ranges,
                                                   size_t total) {
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  while (encoded_.size() < ranges.size()) {
    cudaEvent_t encoded = nullptr, copied = nullptr;
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&encoded, cudaEventDisableTiming));
    encoded_.push_back(encoded);
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    copied_.push_back(copied);
  }
  size_t longest = 0;
  for (const EncodeRange& range : ranges) longest = std::max(longest, range.length);
  // Sized up front: growing inside the pipeline would wait for it.
  SHARDPS_RETURN_IF_ERROR(EnsureScratch(static_cast<size_t>(num_devices()) * longest));
  if (push_params() != nullptr) SHARDPS_RETURN_IF_ERROR(EnsureWorkspace(*push_params(), longest));
  if (total <= payload_bytes_) return absl::OkStatus();
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  if (device_payloads_ != nullptr) SHARDPS_CUDA_RETURN_IF_ERROR(cudaFree(device_payloads_));
  if (pinned_payloads_ != nullptr) SHARDPS_CUDA_RETURN_IF_ERROR(cudaFreeHost(pinned_payloads_));
  device_payloads_ = pinned_payloads_ = nullptr;
  payload_bytes_ = 0;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&device_payloads_, total));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&pinned_payloads_, total, cudaHostAllocDefault));
  payload_bytes_ = total;
  return absl::OkStatus();
}

absl::StatusOr<float*> CudaLocalReducer::Residual(uint64_t key, size_t len) {
  for (auto& [k, residual] : residuals_) {
    if (k != key) continue;
    if (residual.len != len) {
      return absl::InvalidArgumentError(absl::StrCat("MergeEncode: residual key ", key, " holds ",
                                                     residual.len, " values, range has ", len));
    }
    return residual.data;
  }
  float* data = nullptr;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, len * sizeof(float)));
  residuals_.push_back({key, DeviceResidual{data, len}});
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, len * sizeof(float), root_stream()));
  return data;
}

absl::Status CudaLocalReducer::QueueEncode(const EncodeRange& range, size_t i, MergeOp op) {
  uint8_t* payload = device_payloads_ + payload_offsets()[i];
  const size_t bytes = PayloadBytes(range.length);
  const compression::CodecParams* params = push_params();
  const float* merged = nullptr;
  SHARDPS_RETURN_IF_ERROR(MergeWithPeerCopies(range.inputs, range.offset, range.length, op,
                                              params ? nullptr : reinterpret_cast<float*>(payload),
                                              &merged));
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  const uint8_t* source = params ? payload : reinterpret_cast<const uint8_t*>(merged);
  if (params != nullptr) {
    float* residual = nullptr;
    if (error_feedback()) {
      SHARDPS_ASSIGN_OR_RETURN(residual, Residual(range.residual_key, range.length));
    }
    SHARDPS_ASSIGN_OR_RETURN(size_t written,
                             compression::CudaEncode(*params, merged, range.length, residual,
                                                     range.seed, payload, bytes, workspace_,
                                                     workspace_bytes_, root_stream()));
    if (written != bytes) {
      return absl::InternalError(absl::StrCat("MergeEncode: GPU ", params->name, " wrote ", written,
                                              " bytes, expected ", bytes));
    }
  }
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(encoded_[i], root_stream()));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, encoded_[i], 0));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned_payloads_ + payload_offsets()[i], source,
                                               bytes, cudaMemcpyDeviceToHost, copy_stream_));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[i], copy_stream_));
  return absl::OkStatus();
}

void CudaLocalReducer::Drain() {
  ScopedCudaDevice scoped(cuda(0).ordinal());
  (void)cudaStreamSynchronize(root_stream());
  (void)cudaStreamSynchronize(copy_stream_);
}

absl::Status CudaLocalReducer::DoMergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op,
                                             PayloadSink sink) {
#if defined(SHARDPS_WITH_NCCL)
  if (use_nccl_) return LocalReducer::DoMergeEncode(ranges, op, sink);
#endif
  const size_t total = PlanPayloads(ranges);
  absl::Status status = EnsureEncodeBuffers(ranges, total);
  // Range i is queued before range i-1 is waited for and sunk.
  for (size_t i = 0; status.ok() && i <= ranges.size(); ++i) {
    if (i < ranges.size()) status = QueueEncode(ranges[i], i, op);
    if (!status.ok() || i == 0) continue;
    status = CudaStatus(cudaEventSynchronize(copied_[i - 1]), "cudaEventSynchronize", __FILE__,
                        __LINE__);
    if (status.ok()) {
      status = sink(i - 1, absl::MakeConstSpan(pinned_payloads_ + payload_offsets()[i - 1],
                                               PayloadBytes(ranges[i - 1].length)));
    }
  }
  if (!status.ok()) Drain();
  return status;
}

absl::Status CudaLocalReducer::DoDecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed,
                                                 size_t length, bool accumulate,
                                                 absl::Span<DeviceBuffer* const> outputs,
                                                 size_t offset) {
  const compression::CodecParams& params = pull_params();
  ScopedCudaDevice scoped(cuda(0).ordinal());
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  SHARDPS_RETURN_IF_ERROR(EnsureWorkspace(params, length));
  if (payload.size() > pull_bytes_) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(root_stream()));
    if (pull_payload_ != nullptr) SHARDPS_CUDA_RETURN_IF_ERROR(cudaFree(pull_payload_));
    pull_payload_ = nullptr;
    pull_bytes_ = 0;
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMalloc(&pull_payload_, std::max<size_t>(payload.size(), 4)));
    pull_bytes_ = payload.size();
  }
  SHARDPS_RETURN_IF_ERROR(RootWaitsForDevices());  // Earlier readers of outputs are done.
  if (!payload.empty()) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pull_payload_, payload.data(), payload.size(),
                                                 cudaMemcpyHostToDevice, root_stream()));
  }
  float* root = outputs[0]->data() + offset;
  // Validates (waiting for the copy) before writing `root`.
  SHARDPS_RETURN_IF_ERROR(compression::CudaDecode(params, pull_payload_, payload.size(), seed, root,
                                                  length, accumulate, workspace_, workspace_bytes_,
                                                  root_stream()));
  for (int d = 1; d < num_devices(); ++d) {
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(outputs[d]->data() + offset, cuda(d).ordinal(),
                                                     root, cuda(0).ordinal(),
                                                     length * sizeof(float), root_stream()));
  }
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

}  // namespace

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
