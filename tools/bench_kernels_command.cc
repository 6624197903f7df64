// `shardps bench-codec` and `shardps bench-local`: flag parsing around the
// benchmark functions of compression/ and the worker's local tier.
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "compression/codec_bench.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "worker/local_tier/local_bench.h"

namespace shardps {
namespace {

template <typename T>
absl::Status ParseList(const std::string& flag, const std::string& text, std::vector<T>* out) {
  if (text.empty()) return absl::OkStatus();
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", std::string(part), "' is not a positive integer"));
    }
    out->push_back(static_cast<T>(v));
  }
  return absl::OkStatus();
}

int Report(const std::string& command, const absl::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "shardps " << command << ": " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int BenchCodecCommand(const Args& args) {
  compression::CodecBenchOptions o;
  std::string codecs, sizes;
  int64_t iters = o.iters;
  bool no_gpu = false;
  CliFlags flags("bench-codec");
  flags.String("codecs", &codecs, "comma-separated codec specs, e.g. 2bit,topk:ratio=0.01 (default: all)");
  flags.String("sizes", &sizes, "comma-separated input sizes in bytes (default 64 KiB..64 MiB)");
  flags.Int("iters", &iters, "timed iterations per figure (median reported)");
  flags.Bool("json", &o.json, "one JSON object per line");
  flags.Bool("no-gpu", &no_gpu, "skip the GPU even when present");
  if (absl::Status s = flags.Parse(args); !s.ok()) return Report("bench-codec", s);
  if (flags.help()) return 0;
  if (iters < 1) return Report("bench-codec", absl::InvalidArgumentError("--iters must be >= 1"));
  InitLogging("shardps-bench-codec", false);
  if (!codecs.empty()) o.codecs = absl::StrSplit(codecs, ',');
  if (absl::Status s = ParseList("sizes", sizes, &o.sizes_bytes); !s.ok()) return Report("bench-codec", s);
  o.iters = static_cast<int>(iters);
  o.gpu = !no_gpu;
  return Report("bench-codec", compression::RunCodecBench(o, std::cout));
}

int BenchLocalCommand(const Args& args) {
  LocalBenchOptions o;
  std::string kind = "cpu", devices, sizes;
  int64_t iters = o.iters, threads = 0;
  CliFlags flags("bench-local");
  flags.String("kind", &kind, "cpu or cuda");
  flags.String("devices", &devices, "comma-separated device counts (default 1,2,4,8)");
  flags.String("sizes", &sizes, "comma-separated per-device sizes in bytes (default 1..64 MiB)");
  flags.Int("iters", &iters, "timed iterations per figure (median reported)");
  flags.Int("threads", &threads, "CPU reducer threads (0 = all cores)");
  flags.Bool("json", &o.json, "one JSON object per line");
  flags.String("codec", &o.codec,
               "push codec (e.g. 2bit): also measure merge + encode + copy to host, the same "
               "without a codec, and a pinned device-to-host copy (default sizes then 16,64 MiB)");
  int64_t range_bytes = static_cast<int64_t>(o.range_bytes);
  flags.Int("range-bytes", &range_bytes, "bytes per pipelined range (partition) with --codec");
  if (absl::Status s = flags.Parse(args); !s.ok()) return Report("bench-local", s);
  if (flags.help()) return 0;
  if (iters < 1) return Report("bench-local", absl::InvalidArgumentError("--iters must be >= 1"));
  InitLogging("shardps-bench-local", false);
  if (kind == "cpu") {
    o.kind = DeviceKind::kCpu;
  } else if (kind == "cuda") {
    o.kind = DeviceKind::kCuda;
  } else {
    return Report("bench-local", absl::InvalidArgumentError(absl::StrCat("--kind '", kind, "': allowed: cpu, cuda")));
  }
  if (absl::Status s = ParseList("devices", devices, &o.devices); !s.ok()) return Report("bench-local", s);
  if (absl::Status s = ParseList("sizes", sizes, &o.sizes_bytes); !s.ok()) return Report("bench-local", s);
  if (!o.codec.empty() && sizes.empty()) o.sizes_bytes = {size_t{16} << 20, size_t{64} << 20};
  if (range_bytes < 4) return Report("bench-local", absl::InvalidArgumentError("--range-bytes must be >= 4"));
  o.range_bytes = static_cast<size_t>(range_bytes);
  o.iters = static_cast<int>(iters);
  o.num_threads = static_cast<int>(threads);
  return Report("bench-local", RunLocalBench(o, std::cout));
}

}  // namespace shardps
