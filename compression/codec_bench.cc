#include "compression/codec_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "compression/codec.h"
#include "compression/cuda_codec_ops.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

struct BenchRow {
  std::string device;
  double compress_gbps = 0;
  double decompress_gbps = 0;
  double copy_gbps = 0;
};

// Median GB/s of `bytes` processed by fn over `iters` timed runs (one warm-up).
template <typename Fn>
double MedianGbps(size_t bytes, int iters, Fn&& fn) {
  fn();
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + iters / 2, seconds.end());
  return static_cast<double>(bytes) / std::max(seconds[iters / 2], 1e-9) / 1e9;
}

absl::StatusOr<BenchRow> BenchCpu(CodecParams params, int threads, absl::Span<const float> in,
                                  int iters) {
  params.num_threads = threads;
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CreateCodec(params));
  const size_t bytes = in.size() * sizeof(float);
  std::vector<uint8_t> payload(codec->EncodedBytes(in.size()));
  std::vector<float> decoded(in.size());
  absl::Status status;
  BenchRow row{threads == 1 ? "cpu1" : "cpu"};
  row.compress_gbps = MedianGbps(bytes, iters, [&] {
    auto size = codec->Encode(in, /*seed=*/42, absl::MakeSpan(payload));
    if (!size.ok()) status = size.status();
  });
  row.decompress_gbps = MedianGbps(bytes, iters, [&] {
    status.Update(codec->Decode(payload, /*seed=*/42, absl::MakeSpan(decoded)));
  });
  row.copy_gbps = MedianGbps(bytes, iters, [&] {
    ForEachChunk(in.size(), kChunkElements, threads, [&](size_t b, size_t e) {
      std::memcpy(decoded.data() + b, in.data() + b, (e - b) * sizeof(float));
    });
  });
  SHARDPS_RETURN_IF_ERROR(status);
  return row;
}

void PrintRow(const CodecParams& params, size_t bytes, size_t payload, const BenchRow& row,
              bool json, std::ostream& out) {
  if (json) {
    out << absl::StrFormat(
        "{\"codec\":\"%s\",\"spec\":\"%s\",\"bytes\":%d,\"payload_bytes\":%d,\"device\":\"%s\","
        "\"compress_gbps\":%.3f,\"decompress_gbps\":%.3f,\"copy_gbps\":%.3f}\n",
        params.name, params.ToString(), bytes, payload, row.device, row.compress_gbps,
        row.decompress_gbps, row.copy_gbps);
    return;
  }
  out << absl::StrFormat("%-30s %10d %-5s %10.2f %10.2f %10.2f %9.1fx\n", params.ToString(), bytes,
                         row.device, row.compress_gbps, row.decompress_gbps, row.copy_gbps,
                         payload == 0 ? 0.0 : static_cast<double>(bytes) / payload);
}

absl::Status BenchOne(const CodecParams& params, size_t bytes, const CodecBenchOptions& options,
                      std::ostream& out) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> in(n);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : in) v = normal(rng);
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CreateCodec(params));
  const size_t payload = codec->EncodedBytes(n);
  for (int threads : {1, 0}) {
    SHARDPS_ASSIGN_OR_RETURN(BenchRow row, BenchCpu(params, threads, in, options.iters));
    PrintRow(params, bytes, payload, row, options.json, out);
  }
  if (options.gpu && CudaDeviceAvailable()) {
    SHARDPS_ASSIGN_OR_RETURN(CudaCodecTiming t, CudaBenchCodec(params, n, options.iters));
    PrintRow(params, bytes, payload, {"cuda", t.compress_gbps, t.decompress_gbps, t.copy_gbps},
             options.json, out);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCodecBench(const CodecBenchOptions& options, std::ostream& out) {
  if (options.iters < 1) return absl::InvalidArgumentError("bench iters must be >= 1");
  std::vector<CodecParams> codecs;
  for (const std::string& spec : options.codecs.empty() ? CodecNames() : options.codecs) {
    SHARDPS_ASSIGN_OR_RETURN(CodecParams params, ParseCodecSpec(spec));
    codecs.push_back(params);
  }
  for (size_t bytes : options.sizes_bytes) {
    if (bytes < sizeof(float) || bytes / sizeof(float) > Codec::kMaxElements) {
      return absl::InvalidArgumentError(absl::StrFormat("bench size %d bytes out of range", bytes));
    }
  }
  if (!options.json) {
    out << absl::StrFormat("%-30s %10s %-5s %10s %10s %10s %10s\n", "codec", "bytes", "dev",
                           "comp GB/s", "dec GB/s", "copy GB/s", "ratio");
  }
  for (const CodecParams& params : codecs) {
    for (size_t bytes : options.sizes_bytes) {
      SHARDPS_RETURN_IF_ERROR(BenchOne(params, bytes, options, out));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardps::compression
