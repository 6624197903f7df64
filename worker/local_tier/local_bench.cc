#include "worker/local_tier/local_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/local_tier/device_cpu.h"
#include "worker/local_tier/device_cuda.h"
#include "compression/codec_params.h"
#include "worker/local_tier/local_reducer.h"

namespace shardps {
namespace {

using DeviceList = std::vector<std::unique_ptr<Device>>;
using BufferList = std::vector<std::unique_ptr<DeviceBuffer>>;

struct Figures {
  int devices = 0;
  int gpus = 0;
  size_t bytes = 0;
  double merge_gbps = 0, broadcast_gbps = 0, copy_gbps = 0, to_host_gbps = 0;
  // Push path, with a codec only.
  double encode_gbps = 0, raw_gbps = 0, host_copy_gbps = 0, pinned_gbps = 0;
  size_t payload_bytes = 0;
};

absl::StatusOr<DeviceList> MakeDevices(DeviceKind kind, int count) {
  DeviceList devices;
  const int gpus = CudaDeviceCount();
  if (kind == DeviceKind::kCuda && gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat("bench-local --kind=cuda: no GPU found",
                                                      CudaBuilt() ? "" : " (build has no CUDA)"));
  }
  for (int i = 0; i < count; ++i) {
    if (kind == DeviceKind::kCpu) {
      devices.push_back(CpuDevice::Create(i));
      continue;
    }
    SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCudaDevice(i % gpus, i));
    devices.push_back(std::move(device));
  }
  return devices;
}

// Median seconds of `iters` runs of `step`, after one untimed warm-up run.
absl::StatusOr<double> MedianSeconds(int iters, const std::function<absl::Status()>& step) {
  SHARDPS_RETURN_IF_ERROR(step());
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    SHARDPS_RETURN_IF_ERROR(step());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

double Gbps(double bytes, double seconds) { return bytes / seconds / 1e9; }

// Ranges of options.range_bytes over n values of `inputs`.
std::vector<EncodeRange> Ranges(const LocalBenchOptions& options, size_t n,
                                absl::Span<const DeviceBuffer* const> inputs) {
  const size_t step = std::max<size_t>(1, options.range_bytes / sizeof(float));
  std::vector<EncodeRange> ranges;
  for (size_t offset = 0; offset < n; offset += step) {
    ranges.push_back({inputs, offset, std::min(step, n - offset), offset, offset});
  }
  return ranges;
}

// Median seconds of MergeEncode over `ranges` with a reducer on `devices`
// (codec spec empty: fp32); adds up the payload bytes of one call.
absl::StatusOr<double> MergeEncodeSeconds(const LocalBenchOptions& options,
                                          const std::vector<Device*>& devices,
                                          const std::string& codec,
                                          const std::vector<EncodeRange>& ranges,
                                          size_t* payload_bytes) {
  LocalReducerOptions reducer_options;
  reducer_options.num_threads = options.num_threads;
  if (!codec.empty()) {
    SHARDPS_ASSIGN_OR_RETURN(reducer_options.push_codec, compression::ParseCodecSpec(codec));
    reducer_options.error_feedback = true;
  }
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<LocalReducer> reducer,
                           LocalReducer::Create(devices, reducer_options));
  return MedianSeconds(options.iters, [&] {
    *payload_bytes = 0;
    return reducer->MergeEncode(ranges, MergeOp::kAverage,
                                [&](size_t, absl::Span<const uint8_t> payload) {
                                  *payload_bytes += payload.size();
                                  return absl::OkStatus();
                                });
  });
}

absl::Status MeasurePushPath(const LocalBenchOptions& options, const std::vector<Device*>& devices,
                             absl::Span<const DeviceBuffer* const> inputs, size_t n, Figures& f) {
  const std::vector<EncodeRange> ranges = Ranges(options, n, inputs);
  size_t raw_bytes = 0;
  SHARDPS_ASSIGN_OR_RETURN(double encode,
                           MergeEncodeSeconds(options, devices, options.codec, ranges, &f.payload_bytes));
  SHARDPS_ASSIGN_OR_RETURN(double raw, MergeEncodeSeconds(options, devices, "", ranges, &raw_bytes));
  const double all_bytes = static_cast<double>(devices.size()) * n * sizeof(float);
  f.encode_gbps = Gbps(all_bytes, encode);
  f.raw_gbps = Gbps(all_bytes, raw);
  f.host_copy_gbps = Gbps(static_cast<double>(n) * sizeof(float), raw);
  f.pinned_gbps = f.copy_gbps;
  if (options.kind == DeviceKind::kCuda) {
    SHARDPS_ASSIGN_OR_RETURN(double pinned, CudaPinnedToHostSeconds(devices[0]->ordinal(),
                                                                    n * sizeof(float), options.iters));
    f.pinned_gbps = Gbps(static_cast<double>(n) * sizeof(float), pinned);
  }
  return absl::OkStatus();
}

absl::StatusOr<Figures> Measure(const LocalBenchOptions& options, int d, size_t bytes) {
  const size_t n = bytes / sizeof(float);
  SHARDPS_ASSIGN_OR_RETURN(DeviceList devices, MakeDevices(options.kind, d));
  std::vector<Device*> raw;
  std::set<int> gpus;
  BufferList buffers;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) * 0.001f;
  for (auto& device : devices) {
    raw.push_back(device.get());
    gpus.insert(device->ordinal());
    SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer, device->Allocate(n));
    SHARDPS_RETURN_IF_ERROR(buffer->CopyFromHost(host));
    buffers.push_back(std::move(buffer));
  }
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> copy, devices[0]->Allocate(n));
  LocalReducerOptions reducer_options;
  reducer_options.num_threads = options.num_threads;
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<LocalReducer> reducer,
                           LocalReducer::Create(raw, reducer_options));
  std::vector<const DeviceBuffer*> inputs;
  std::vector<DeviceBuffer*> outputs;
  for (auto& buffer : buffers) {
    inputs.push_back(buffer.get());
    outputs.push_back(buffer.get());
  }
  std::vector<float> merged(n);

  Figures f{d, options.kind == DeviceKind::kCuda ? static_cast<int>(gpus.size()) : 0, bytes};
  const double all_bytes = static_cast<double>(d) * n * sizeof(float);
  SHARDPS_ASSIGN_OR_RETURN(double merge, MedianSeconds(options.iters, [&] {
                             return reducer->Merge(inputs, 0, absl::MakeSpan(merged));
                           }));
  SHARDPS_ASSIGN_OR_RETURN(double broadcast, MedianSeconds(options.iters, [&] {
                             return reducer->Broadcast(merged, absl::MakeSpan(outputs), 0);
                           }));
  SHARDPS_ASSIGN_OR_RETURN(
      double copy_s, MedianSeconds(options.iters, [&] { return copy->CopyFrom(*buffers[0]); }));
  SHARDPS_ASSIGN_OR_RETURN(double to_host, MedianSeconds(options.iters, [&] {
                             return buffers[0]->CopyToHost(0, absl::MakeSpan(host));
                           }));
  f.merge_gbps = Gbps(all_bytes, merge);
  f.broadcast_gbps = Gbps(all_bytes, broadcast);
  f.copy_gbps = Gbps(static_cast<double>(bytes), copy_s);
  f.to_host_gbps = Gbps(static_cast<double>(bytes), to_host);
  reducer.reset();  // One reducer's staging at a time.
  if (!options.codec.empty()) SHARDPS_RETURN_IF_ERROR(MeasurePushPath(options, raw, inputs, n, f));
  return f;
}

void PrintHeader(const LocalBenchOptions& options, int threads, std::ostream& out) {
  out << "bench-local: kind=" << DeviceKindName(options.kind) << " cpu_threads=" << threads
      << " iters=" << options.iters << " (medians)\n"
      << "  merge GB/s counts every input byte (D*n*4 / time); broadcast GB/s every output\n"
      << "  byte (D*n*4 / time); copy GB/s = n*4 / one same-buffer copy on device 0 ("
      << (options.kind == DeviceKind::kCpu ? "memcpy" : "device-to-device") << ");\n"
      << "  to_host GB/s = n*4 / CopyToHost into pageable memory.\n"
      << absl::StrFormat("%-5s %7s %10s %11s %11s %10s %12s %11s\n", "kind", "devices", "MiB",
                         "merge_GB/s", "bcast_GB/s", "copy_GB/s", "to_host_GB/s", "merge/copy");
}

// The push-path fields of a JSON row (with a codec), starting with a comma.
std::string PushPathJson(const LocalBenchOptions& options, const Figures& f) {
  if (options.codec.empty()) return "";
  return absl::StrFormat(
      ",\"codec\":\"%s\",\"range_bytes\":%d,\"payload_bytes\":%d,\"encode_gbps\":%.3f,"
      "\"raw_gbps\":%.3f,\"host_copy_gbps\":%.3f,\"pinned_gbps\":%.3f,"
      "\"encode_vs_raw\":%.3f,\"host_copy_vs_pinned\":%.3f,\"pinned_kind\":\"%s\"",
      options.codec, options.range_bytes, f.payload_bytes, f.encode_gbps, f.raw_gbps,
      f.host_copy_gbps, f.pinned_gbps, f.encode_gbps / f.raw_gbps, f.host_copy_gbps / f.pinned_gbps,
      options.kind == DeviceKind::kCuda ? "cudaMemcpyAsync to pinned" : "memcpy");
}

void PrintRow(const LocalBenchOptions& options, int threads, const Figures& f, std::ostream& out) {
  const std::string kind = DeviceKindName(options.kind);
  if (options.json) {
    out << absl::StrFormat(
        "{\"kind\":\"%s\",\"devices\":%d,\"gpus\":%d,\"cpu_threads\":%d,\"bytes\":%d,"
        "\"merge_gbps\":%.3f,\"broadcast_gbps\":%.3f,\"copy_gbps\":%.3f,"
        "\"to_host_gbps\":%.3f,\"merge_bytes_counted\":\"input\",\"iters\":%d%s}\n",
        kind, f.devices, f.gpus, threads, f.bytes, f.merge_gbps, f.broadcast_gbps, f.copy_gbps,
        f.to_host_gbps, options.iters, PushPathJson(options, f));
    return;
  }
  out << absl::StrFormat("%-5s %7d %10.1f %11.2f %11.2f %10.2f %12.2f %11.2f\n", kind, f.devices,
                         f.bytes / 1048576.0, f.merge_gbps, f.broadcast_gbps, f.copy_gbps,
                         f.to_host_gbps, f.merge_gbps / f.copy_gbps);
  if (options.codec.empty()) return;
  out << absl::StrFormat(
      "      push path, %s: encode %.2f GB/s, raw %.2f GB/s (x%.2f); host copy %.2f GB/s vs "
      "pinned %.2f GB/s (x%.2f); payload %d bytes\n",
      options.codec, f.encode_gbps, f.raw_gbps, f.encode_gbps / f.raw_gbps, f.host_copy_gbps,
      f.pinned_gbps, f.host_copy_gbps / f.pinned_gbps, f.payload_bytes);
}

absl::Status CheckOptions(const LocalBenchOptions& options) {
  if (options.iters < 1) return absl::InvalidArgumentError("bench-local: iters must be >= 1");
  if (options.range_bytes < sizeof(float)) {
    return absl::InvalidArgumentError("bench-local: range bytes must be >= 4");
  }
  if (!options.codec.empty()) {
    auto params = compression::ParseCodecSpec(options.codec);
    if (!params.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bench-local --codec: ", params.status().message()));
    }
  }
  for (int d : options.devices) {
    if (d < 1) return absl::InvalidArgumentError(absl::StrCat("bench-local: devices ", d));
  }
  for (size_t bytes : options.sizes_bytes) {
    if (bytes < sizeof(float) || bytes % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bench-local: size ", bytes, " is not a positive multiple of 4 bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunLocalBench(const LocalBenchOptions& options, std::ostream& out) {
  SHARDPS_RETURN_IF_ERROR(CheckOptions(options));
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!options.json) PrintHeader(options, threads, out);
  for (int d : options.devices) {
    for (size_t bytes : options.sizes_bytes) {
      SHARDPS_ASSIGN_OR_RETURN(Figures figures, Measure(options, d, bytes));
      PrintRow(options, threads, figures, out);
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace shardps
