// CudaLocalReducer, the CUDA LocalReducer, shared by its two source files:
// local_cuda_reducer.cu (merge, broadcast, NCCL, set-up) and
// local_cuda_encode.cu (MergeEncode, DecodeBroadcast).
//
// Internal: includes CUDA headers, so only .cu files of the local tier include
// it; everyone else uses local_cuda_reducer.h.
// Ownership: borrows its devices (it keeps their ordinals so that teardown
// never dereferences one); owns its events, streams, scratch, staging and
// residuals. Thread safety: as LocalReducer (calls are serialised).
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_INTERNAL_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/local_tier/device_cuda_internal.h"
#include "worker/local_tier/local_reducer.h"

#if defined(SHARDPS_WITH_NCCL)
#include <nccl.h>
#endif

namespace shardps {

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

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_CUDA_REDUCER_INTERNAL_H_
