// Test-only: a local tier (D devices of one kind, one buffer each, a reducer)
// for the MergeEncode / DecodeBroadcast tests, CPU and CUDA alike. Setup
// failures are returned as statuses for the test to assert on.
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_ENCODE_TEST_UTIL_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_ENCODE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/local_tier/device_cpu.h"
#include "worker/local_tier/device_cuda.h"
#include "worker/local_tier/local_reducer.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {

class EncodeTier {
 public:
  // D = grads.size() devices of `kind` (CUDA: round-robin over the GPUs),
  // buffer d holding grads[d].
  absl::Status Init(DeviceKind kind, const std::vector<std::vector<float>>& grads,
                    const LocalReducerOptions& options) {
    std::vector<Device*> raw;
    for (size_t d = 0; d < grads.size(); ++d) {
      const int index = static_cast<int>(d);
      if (kind == DeviceKind::kCpu) {
        devices_.push_back(CpuDevice::Create(index));
      } else {
        SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                                 CreateCudaDevice(index % CudaDeviceCount(), index));
        devices_.push_back(std::move(device));
      }
      raw.push_back(devices_.back().get());
      SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                               devices_.back()->Allocate(grads[d].size()));
      buffers_.push_back(std::move(buffer));
    }
    SHARDPS_RETURN_IF_ERROR(SetContents(grads));
    SHARDPS_ASSIGN_OR_RETURN(reducer_, LocalReducer::Create(raw, options));
    return absl::OkStatus();
  }

  absl::Status SetContents(const std::vector<std::vector<float>>& values) {
    for (size_t d = 0; d < buffers_.size(); ++d) {
      SHARDPS_RETURN_IF_ERROR(buffers_[d]->CopyFromHost(values[d]));
    }
    return absl::OkStatus();
  }

  std::vector<float> Contents(int d) const {
    std::vector<float> out(buffers_[d]->size());
    absl::Status s = buffers_[d]->CopyToHost(0, absl::MakeSpan(out));
    if (!s.ok()) out.clear();
    return out;
  }

  // MergeEncode over `ranges`; payloads copied out in sink order. The sink
  // also checks that it is called in range order.
  // Ranges get this tier's buffers as inputs.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Encode(std::vector<EncodeRange> ranges,
                                                           MergeOp op = MergeOp::kAverage) {
    const std::vector<const DeviceBuffer*> in = inputs();
    for (EncodeRange& range : ranges) range.inputs = in;
    std::vector<std::vector<uint8_t>> payloads;
    SHARDPS_RETURN_IF_ERROR(reducer_->MergeEncode(
        ranges, op, [&](size_t index, absl::Span<const uint8_t> payload) {
          if (index != payloads.size()) return absl::InternalError("sink called out of order");
          payloads.emplace_back(payload.begin(), payload.end());
          return absl::OkStatus();
        }));
    return payloads;
  }

  LocalReducer& reducer() { return *reducer_; }
  std::vector<const DeviceBuffer*> inputs() const { return BufferPointers<const DeviceBuffer>(buffers_); }
  std::vector<DeviceBuffer*> raw_buffers() const { return BufferPointers<DeviceBuffer>(buffers_); }

 private:
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;  // Destroyed before devices_.
  std::unique_ptr<LocalReducer> reducer_;               // Destroyed first.
};

// Three uneven ranges covering [0, n), seeds and residual keys per range.
inline std::vector<EncodeRange> ThreeRanges(size_t n, uint64_t round) {
  const size_t a = n / 3 + 5, b = n / 3 - 7;
  return {{{}, 0, a, round * 31 + 1, 10},
          {{}, a, b, round * 31 + 2, 11},
          {{}, a + b, n - a - b, round * 31 + 3, 12}};
}

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_ENCODE_TEST_UTIL_H_
