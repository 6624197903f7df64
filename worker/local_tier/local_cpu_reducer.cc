#include "worker/local_tier/local_cpu_reducer.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "worker/local_tier/local_sum.h"

namespace shardps {

CpuLocalReducer::CpuLocalReducer(std::vector<Device*> devices, int num_threads)
    : LocalReducer(devices), pool_(num_threads), sources_(devices.size()) {}

absl::StatusOr<std::unique_ptr<LocalReducer>> CpuLocalReducer::Create(
    std::vector<Device*> devices, const LocalReducerOptions& options) {
  int threads = options.num_threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<LocalReducer>(new CpuLocalReducer(std::move(devices), threads));
}

absl::Status CpuLocalReducer::DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                                      absl::Span<float> out, MergeOp op) {
  const int n = num_devices();
  for (int d = 0; d < n; ++d) sources_[d] = inputs[d]->data() + offset;
  const float scale = 1.0f / static_cast<float>(n);
  const size_t len = out.size();
  const float* const* sources = sources_.data();
  pool_.ParallelFor(NumChunks(len), [&](size_t chunk) {
    const size_t begin = chunk * kChunkFloats;
    const size_t end = std::min(begin + kChunkFloats, len);
    if (n == 1 && op == MergeOp::kSum) {
      std::memcpy(out.data() + begin, sources[0] + begin, (end - begin) * sizeof(float));
    } else if (op == MergeOp::kSum) {
      SumInOrder(sources, n, begin, end, out.data());
    } else {
      SumInOrderAndScale(sources, n, begin, end, scale, out.data());
    }
  });
  return absl::OkStatus();
}

absl::Status CpuLocalReducer::DoBroadcast(absl::Span<const float> in,
                                          absl::Span<DeviceBuffer* const> outputs, size_t offset) {
  const size_t len = in.size();
  pool_.ParallelFor(NumChunks(len), [&](size_t chunk) {
    const size_t begin = chunk * kChunkFloats;
    const size_t bytes = (std::min(begin + kChunkFloats, len) - begin) * sizeof(float);
    for (DeviceBuffer* output : outputs) {
      std::memcpy(output->data() + offset + begin, in.data() + begin, bytes);
    }
  });
  return absl::OkStatus();
}

}  // namespace shardps
