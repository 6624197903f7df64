// `shardps bench-checkpoint`: the time a server takes to write a checkpoint
// of the demo model (every partition file and the manifest, as
// server/partition_checkpoint.cc writes them), against one plain file write
// of the same bytes, with and without an fsync.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_store.h"
#include "common/logging.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/train/mlp.h"
#include "tools/train_job.h"

namespace shardps {
namespace {

constexpr int kAdamSlots = 2;  // the default optimizer's state per weight

// The demo model's partitions (tensors cut at `partition_bytes`), random contents.
std::vector<PartitionCheckpoint> DemoPartitions(const std::vector<int>& layers, size_t partition_bytes) {
  auto model = train::Mlp::Create(layers);
  std::vector<PartitionCheckpoint> parts;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const train::TensorShape& t : model->tensors()) {
    for (size_t offset = 0; offset < t.numel; offset += partition_bytes / sizeof(float)) {
      const size_t n = std::min(partition_bytes / sizeof(float), t.numel - offset);
      std::vector<float> w(n * (1 + kAdamSlots));
      for (float& x : w) x = value(rng);
      PartitionCheckpoint p;
      p.set_partition_id(parts.size());
      p.set_tensor(t.name);
      p.set_offset(offset);
      p.set_num_elements(n);
      p.set_round(1);
      p.set_initialized(true);
      p.set_weights(std::string(reinterpret_cast<const char*>(w.data()), n * sizeof(float)));
      p.set_optimizer_state(std::string(reinterpret_cast<const char*>(w.data() + n), kAdamSlots * n * sizeof(float)));
      parts.push_back(std::move(p));
    }
  }
  return parts;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One checkpoint round; returns the bytes written.
absl::StatusOr<size_t> WriteCheckpoint(const std::string& round_dir, const std::vector<PartitionCheckpoint>& parts) {
  CheckpointManifest manifest;
  manifest.set_round(1);
  size_t bytes = 0;
  for (const PartitionCheckpoint& p : parts) {
    auto entry = WritePartitionCheckpoint(round_dir, p, manifest.server(), manifest.job());
    if (!entry.ok()) return entry.status();
    bytes += entry->bytes();
    *manifest.add_entries() = *std::move(entry);
  }
  if (absl::Status s = WriteCheckpointManifest(round_dir, manifest); !s.ok()) return s;
  return bytes;
}

absl::Status WritePlain(const std::string& path, const std::string& data, bool sync) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError("cannot create " + path);
  const bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) && (!sync || fsync(fd) == 0);
  close(fd);
  return ok ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status Run(const std::string& dir, const std::string& hidden, int iters, bool json) {
  auto layers = ParseLayers(hidden);
  if (!layers.ok()) return absl::InvalidArgumentError(absl::StrCat("--hidden: ", layers.status().message()));
  const std::vector<PartitionCheckpoint> parts = DemoPartitions(*layers, 1 << 20);
  std::vector<double> checkpoint, plain, plain_sync;
  size_t bytes = 0;
  for (int i = 0; i < iters; ++i) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto start = std::chrono::steady_clock::now();
    auto written = WriteCheckpoint(CheckpointRoundDir(dir, i + 1), parts);
    if (!written.ok()) return written.status();
    checkpoint.push_back(Seconds(start));
    bytes = *written;
    const std::string blob(bytes, '\x5a');
    for (bool sync : {false, true}) {
      start = std::chrono::steady_clock::now();
      if (absl::Status s = WritePlain(dir + "/plain", blob, sync); !s.ok()) return s;
      (sync ? plain_sync : plain).push_back(Seconds(start));
    }
  }
  std::filesystem::remove_all(dir);
  const double c = Median(checkpoint), p = Median(plain), ps = Median(plain_sync);
  if (json) {
    std::cout << absl::StrFormat(
        "{\"partitions\": %d, \"bytes\": %d, \"checkpoint_ms\": %.2f, \"plain_write_ms\": %.2f, "
        "\"plain_write_fsync_ms\": %.2f, \"ratio_to_plain_fsync\": %.2f}\n",
        parts.size(), bytes, c * 1e3, p * 1e3, ps * 1e3, c / ps);
  } else {
    std::cout << absl::StrFormat(
        "checkpoint of %d partitions, %d bytes: %.2f ms (median of %d); one plain write of the same bytes %.2f ms, "
        "with fsync %.2f ms (ratio %.2f)\n",
        parts.size(), bytes, c * 1e3, iters, p * 1e3, ps * 1e3, c / ps);
  }
  return absl::OkStatus();
}

}  // namespace

int BenchCheckpointCommand(const Args& args) {
  std::string dir = (std::filesystem::temp_directory_path() / ("shardps-bench-checkpoint-" + std::to_string(getpid())));
  std::string hidden = "256,128";
  int64_t iters = 20;
  bool json = false;
  CliFlags flags("bench-checkpoint");
  flags.String("dir", &dir, "scratch directory on the file system to measure (removed afterwards)");
  flags.String("hidden", &hidden, "hidden layer widths of the MLP whose checkpoint is written");
  flags.Int("iters", &iters, "timed checkpoints (median reported)");
  flags.Bool("json", &json, "one JSON object");
  absl::Status s = flags.Parse(args);
  if (s.ok() && flags.help()) return 0;
  InitLogging("shardps-bench-checkpoint", false);
  if (s.ok() && iters < 1) s = absl::InvalidArgumentError("--iters must be >= 1");
  if (s.ok()) s = Run(dir, hidden, static_cast<int>(iters), json);
  if (s.ok()) return 0;
  std::cerr << "shardps bench-checkpoint: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace shardps
