// CudaLocalReducer's MergeEncode and DecodeBroadcast (see
// local_cuda_reducer_internal.h). MergeEncode runs on device 0 with two
// streams: the root stream merges range k (peer copies + sum kernel, or
// straight into the device payload area for fp32) and encodes it with the
// compression CUDA kernels (error-feedback residuals fused, kept per key on
// device 0); a copy stream waits for that and copies just the payload into
// pinned host staging (cudaHostAlloc), while the root stream goes on with
// range k+1. The sink gets range k once its copy event fired.
// DecodeBroadcast copies the payload to device 0, decodes there (validating
// first) and peer-copies the values to the other devices.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "compression/cuda_codec_ops.h"
#include "worker/local_tier/local_cuda_reducer_internal.h"

namespace shardps {

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

}  // namespace shardps
