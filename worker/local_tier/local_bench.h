// RunLocalBench: throughput of the local first tier (LocalReducer merge and
// broadcast) next to the plain copy bandwidth of the same buffer, measured in
// the same run. Wired into the CLI as `shardps bench-local`.
//
// Figures are medians of `iters` timed runs after one warm-up:
//   merge_gbps      D * n * 4 bytes (every input byte) / merge time
//   broadcast_gbps  D * n * 4 bytes (every output byte) / broadcast time
//   copy_gbps       n * 4 bytes / time of one buffer copy on device 0
//                   (memcpy on CPU, device-to-device on CUDA)
//   to_host_gbps    n * 4 bytes / time of DeviceBuffer::CopyToHost into
//                   pageable host memory
// With a codec (`codec` set), each row adds the push path of the tier, over
// ranges of `range_bytes` (partitions, pipelined by MergeEncode):
//   encode_gbps     D * n * 4 / time of MergeEncode with the codec and error
//                   feedback (merge + residual + encode + payload to host)
//   raw_gbps        D * n * 4 / time of MergeEncode without a codec (merge +
//                   fp32 sum into the host staging the data plane sends from)
//   host_copy_gbps  n * 4 / that same time: the uncompressed host copy
//   pinned_gbps     n * 4 / time of one plain device-to-host cudaMemcpyAsync
//                   into pinned memory (CPU: the memcpy of copy_gbps), the
//                   limit host_copy_gbps is held against
//   encode_vs_raw = encode_gbps / raw_gbps, host_copy_vs_pinned =
//   host_copy_gbps / pinned_gbps, payload_bytes = encoded bytes of one call.
// Thread safety: runs on the calling thread (plus the reducer's threads).
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_BENCH_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_BENCH_H_

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/local_tier/device.h"

namespace shardps {

struct LocalBenchOptions {
  // Device kind to measure. Default CPU. For CUDA, device counts above the
  // number of GPUs reuse GPUs round-robin (the `gpus` column says how many).
  DeviceKind kind = DeviceKind::kCpu;
  // Device counts D to measure. Default {1, 2, 4, 8}.
  std::vector<int> devices = {1, 2, 4, 8};
  // Per-device buffer sizes in bytes (multiples of 4). Default 1, 4, 16, 64 MiB.
  std::vector<size_t> sizes_bytes = {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20,
                                     size_t{64} << 20};
  // Timed iterations per figure (median reported). Default 10.
  int iters = 10;
  // One JSON object per line instead of a table. Default false.
  bool json = false;
  // CPU reducer threads; default 0 = all cores.
  int num_threads = 0;
  // Push codec spec (e.g. "2bit"); empty (default): no push-path figures.
  std::string codec;
  // Bytes per MergeEncode range in the push-path figures. Default 4 MiB.
  size_t range_bytes = size_t{4} << 20;
};

// Runs the benchmark and writes the results to `out`. InvalidArgument for bad
// options; FailedPrecondition when the requested devices do not exist; other
// errors as the devices report them.
absl::Status RunLocalBench(const LocalBenchOptions& options, std::ostream& out);

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_BENCH_H_
