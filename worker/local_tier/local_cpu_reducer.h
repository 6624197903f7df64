// CpuLocalReducer: the LocalReducer for CPU devices. Splits the range into
// fixed chunks of kChunkFloats and sums each chunk on a LocalThreadPool using
// every core. Each element is summed in device order whatever the chunking or
// thread count, so results are bitwise reproducible (see local_reducer.h).
//
// Ownership: owns its thread pool; borrows the devices.
// Thread safety: as LocalReducer.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_CPU_REDUCER_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_CPU_REDUCER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/local_tier/local_reducer.h"
#include "worker/local_tier/local_thread_pool.h"

namespace shardps {

class CpuLocalReducer : public LocalReducer {
 public:
  // 16 Ki floats = 64 KiB per input per task: D inputs stay within L2.
  static constexpr size_t kChunkFloats = 16 * 1024;

  // REQUIRES: devices non-empty, all DeviceKind::kCpu.
  static absl::StatusOr<std::unique_ptr<LocalReducer>> Create(std::vector<Device*> devices,
                                                              const LocalReducerOptions& options);

 protected:
  absl::Status DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                       absl::Span<float> out, MergeOp op) override;
  absl::Status DoBroadcast(absl::Span<const float> in, absl::Span<DeviceBuffer* const> outputs,
                           size_t offset) override;

 private:
  CpuLocalReducer(std::vector<Device*> devices, int num_threads);

  static size_t NumChunks(size_t len) { return (len + kChunkFloats - 1) / kChunkFloats; }

  LocalThreadPool pool_;
  std::vector<const float*> sources_;  // Per-call input pointers; reused.
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_CPU_REDUCER_H_
