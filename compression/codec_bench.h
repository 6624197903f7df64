// RunCodecBench: measures compress/decompress throughput of the codecs next to
// a plain copy of the same buffer, for `shardps bench-codec`. Stateless;
// safe to call from any thread (it uses the shared kernel thread pool).
#ifndef SHARDPS_COMPRESSION_CODEC_BENCH_H_
#define SHARDPS_COMPRESSION_CODEC_BENCH_H_

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardps::compression {

struct CodecBenchOptions {
  // Codec specs (e.g. "topk:ratio=0.001"); empty (default) = every codec with
  // its default parameters.
  std::vector<std::string> codecs;
  // fp32 input sizes in bytes. Default 64 KiB, 1 MiB, 16 MiB, 64 MiB.
  std::vector<size_t> sizes_bytes = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20,
                                     size_t{64} << 20};
  // Timed iterations per measurement (the median is reported); default 7.
  int iters = 7;
  // One JSON object per line instead of a table; default false.
  bool json = false;
  // Also measure on the GPU when a device is present; default true.
  bool gpu = true;
};

// For each codec and size, writes one row per device: "cpu1" (one core),
// "cpu" (all cores), "cuda" (when available). Rows carry codec, spec, bytes,
// device, compress_gbps, decompress_gbps, copy_gbps (memcpy on the same
// threads; cudaMemcpy device-to-device for cuda) and payload_bytes; GB/s are of
// fp32 input, medians over `iters` runs. InvalidArgument for a bad spec, size
// or iters < 1.
absl::Status RunCodecBench(const CodecBenchOptions& options, std::ostream& out);

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CODEC_BENCH_H_
