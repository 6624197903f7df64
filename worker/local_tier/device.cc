#include "worker/local_tier/device.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "worker/local_tier/device_cpu.h"
#include "worker/local_tier/device_cuda.h"

namespace shardps {
namespace {

constexpr int kMaxCpuDevices = 1024;

using DeviceList = std::vector<std::unique_ptr<Device>>;

absl::Status BadSpec(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad device spec \"", spec, "\": ", why,
                                                 " (want cpu, cpu:N, cuda or cuda:I,cuda:J)"));
}

absl::StatusOr<DeviceList> CreateCpuDevices(absl::string_view spec, absl::string_view count) {
  int n = 0;
  if (!absl::SimpleAtoi(count, &n) || n < 1 || n > kMaxCpuDevices) {
    return BadSpec(spec, absl::StrCat("CPU device count must be 1..", kMaxCpuDevices));
  }
  DeviceList devices;
  for (int i = 0; i < n; ++i) devices.push_back(CpuDevice::Create(i));
  return devices;
}

// Parses "cuda:I,cuda:J" (or "cuda" for all GPUs) into ordinals.
absl::StatusOr<std::vector<int>> ParseCudaOrdinals(absl::string_view spec, int gpus) {
  std::vector<int> ordinals;
  if (spec == "cuda") {
    for (int i = 0; i < gpus; ++i) ordinals.push_back(i);
    if (ordinals.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("device spec \"cuda\": no GPU found",
                                                        CudaBuilt() ? "" : " (build has no CUDA)"));
    }
    return ordinals;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    int ordinal = -1;
    if (!absl::ConsumePrefix(&item, "cuda:") || !absl::SimpleAtoi(item, &ordinal) || ordinal < 0) {
      return BadSpec(spec, absl::StrCat("\"", item, "\" is not cuda:ORDINAL"));
    }
    if (std::find(ordinals.begin(), ordinals.end(), ordinal) != ordinals.end()) {
      return BadSpec(spec, absl::StrCat("cuda:", ordinal, " listed twice"));
    }
    ordinals.push_back(ordinal);
  }
  return ordinals;
}

absl::StatusOr<DeviceList> CreateCudaDevices(absl::string_view spec) {
  const int gpus = CudaDeviceCount();
  SHARDPS_ASSIGN_OR_RETURN(std::vector<int> ordinals, ParseCudaOrdinals(spec, gpus));
  std::vector<std::string> missing;
  for (int ordinal : ordinals) {
    if (ordinal >= gpus) missing.push_back(absl::StrCat("cuda:", ordinal));
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device spec \"", spec, "\" names ", absl::StrJoin(missing, ", "), " but ",
                     gpus, " GPU(s) found", CudaBuilt() ? "" : " (build has no CUDA)"));
  }
  DeviceList devices;
  for (int ordinal : ordinals) {
    SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                             CreateCudaDevice(ordinal, static_cast<int>(devices.size())));
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace

const char* DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kCpu ? "cpu" : "cuda"; }

std::string Device::name() const {
  return absl::StrCat(DeviceKindName(kind_), ":", kind_ == DeviceKind::kCpu ? index_ : ordinal_);
}

absl::StatusOr<DeviceList> CreateDevices(std::string_view spec_in) {
  const absl::string_view spec(spec_in.data(), spec_in.size());
  if (spec == "cpu") return CreateCpuDevices(spec, "1");
  absl::string_view rest = spec;
  if (absl::ConsumePrefix(&rest, "cpu:")) return CreateCpuDevices(spec, rest);
  if (absl::StartsWith(spec, "cuda")) return CreateCudaDevices(spec);
  return BadSpec(spec, "unknown device kind");
}

}  // namespace shardps
