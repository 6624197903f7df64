// DeviceGroup against a fake Worker whose "server" applies w = w * 0.5 - g per
// partition when a request is waited for: the pipelined per-partition round
// must give exactly what merging whole tensors and updating them at once
// gives, for D = 1..8 and odd sizes. CUDA tests skip without a GPU.
#include "worker/local_tier/device_group.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/local_tier/device_cuda.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);

// The server update the fake applies; one float op each, same on any range.
void Update(absl::Span<float> w, absl::Span<const float> g) {
  for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * 0.5f - g[i];
}

// A Worker with in-memory tensors cut into partitions of `partition_elements`
// (the last one shorter). Requests run when waited for; `log` records them.
class FakeWorker : public Worker {
 public:
  FakeWorker(std::vector<GroupTensor> tensors, size_t partition_elements) {
    for (const GroupTensor& t : tensors) {
      Tensor& state = tensors_[t.name];
      state.weights.assign(t.num_elements, 1.0f);
      for (size_t off = 0; off < t.num_elements; off += partition_elements) {
        state.partitions.push_back({off, std::min(partition_elements, t.num_elements - off), 0});
      }
    }
  }

  std::vector<float>& server_weights(const std::string& name) { return tensors_[name].weights; }
  std::vector<std::string> log;
  size_t outstanding() const { return pending_.size(); }
  // Makes the Wait of the n-th request (0-based) fail.
  int fail_wait_of = -1;

  const ClusterConfig& config() const override { return config_; }
  uint32_t rank() const override { return 0; }
  uint32_t num_servers() const override { return 1; }
  absl::Duration request_timeout() const override { return absl::Seconds(30); }
  absl::Status DefineTensors(const std::vector<TensorSpec>&, absl::Duration) override { return absl::OkStatus(); }
  absl::Status InitTensor(const std::string&, absl::Span<const float>, absl::Duration) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status Barrier(const std::string&, std::vector<uint32_t>*, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Handle> Push(const std::string&, absl::Span<const float>) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<Handle> SkipRound(const std::string&) override { return absl::UnimplementedError("fake"); }
  absl::StatusOr<Handle> PushPull(const std::string&, absl::Span<const float>, absl::Span<float>) override {
    return absl::UnimplementedError("fake: DeviceGroup pushes per partition");
  }
  absl::StatusOr<Handle> Pull(const std::string& name, absl::Span<float> weights) override {
    log.push_back("pull " + name);
    return Enqueue([this, name, weights] {
      const auto& w = tensors_[name].weights;
      std::copy(w.begin(), w.end(), weights.begin());
    });
  }
  absl::StatusOr<uint64_t> WeightsVersion(const std::string&) const override { return 0; }
  absl::StatusOr<std::vector<PartitionExtent>> Partitions(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return absl::NotFoundError(name);
    return it->second.partitions;
  }
  absl::StatusOr<Handle> PushPullPartition(const std::string& name, size_t index, absl::Span<const float> gradient,
                                           absl::Span<float> weights) override {
    log.push_back(absl::StrCat("push ", name, " ", index));
    stats_.bytes_pushed += gradient.size() * sizeof(float);
    const PartitionExtent extent = tensors_[name].partitions[index];
    EXPECT_EQ(gradient.size(), extent.num_elements);
    return Enqueue([this, name, extent, gradient, weights] {
      auto w = absl::MakeSpan(tensors_[name].weights).subspan(extent.offset, extent.num_elements);
      Update(w, gradient);
      std::copy(w.begin(), w.end(), weights.begin());
    });
  }
  absl::Status Wait(Handle handle, absl::Duration) override {
    log.push_back(absl::StrCat("wait ", handle));
    auto it = pending_.find(handle);
    if (it == pending_.end()) return absl::NotFoundError("unknown handle");
    auto run = std::move(it->second);
    pending_.erase(it);
    if (static_cast<int>(handle) == fail_wait_of) return absl::DeadlineExceededError("fake timeout");
    run();
    return absl::OkStatus();
  }
  absl::StatusOr<Handle> PushPullMeanGradient(const std::string&, absl::Span<const float>,
                                              absl::Span<float>) override {
    return absl::UnimplementedError("fake: DeviceGroup does not take mean gradients");
  }
  absl::StatusOr<size_t> WaitAny(absl::Span<const Handle>, absl::Duration, absl::Status*) override {
    return absl::UnimplementedError("fake: DeviceGroup waits per handle");
  }
  WorkerStats stats() const override { return stats_; }
  void SetLeavingError(const std::string&) override {}

 private:
  struct Tensor {
    std::vector<float> weights;
    std::vector<PartitionExtent> partitions;
  };
  Handle Enqueue(std::function<void()> run) {
    pending_[next_handle_] = std::move(run);
    return next_handle_++;
  }

  ClusterConfig config_;
  std::map<std::string, Tensor> tensors_;
  std::map<Handle, std::function<void()>> pending_;
  Handle next_handle_ = 0;
  WorkerStats stats_;
};

std::vector<GroupTensor> OddTensors() { return {{"a", 1}, {"b", 4099}, {"c", 40961}}; }

std::vector<std::unique_ptr<Device>> CpuDevices(int d) {
  auto devices = CreateDevices(absl::StrCat("cpu:", d));
  EXPECT_TRUE(devices.ok()) << devices.status();
  return std::move(*devices);
}

DeviceGroupOptions Priority(std::vector<size_t> order) {
  DeviceGroupOptions options;
  options.priority = std::move(order);
  return options;
}

bool BitwiseEqual(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Writes fixed-seed gradients into every device; returns them per tensor.
std::vector<std::vector<std::vector<float>>> FillGradients(DeviceGroup& group, uint32_t seed) {
  std::vector<std::vector<std::vector<float>>> grads;  // [tensor][device][i]
  for (size_t t = 0; t < group.num_tensors(); ++t) {
    grads.push_back(RandomGradients(group.num_devices(), group.gradient(0, t).size(), seed + t));
    for (int d = 0; d < group.num_devices(); ++d) {
      EXPECT_TRUE(group.gradient(d, t).CopyFromHost(grads[t][d]).ok());
    }
  }
  return grads;
}

// Runs two rounds on `group` and checks every device's weights against the
// unpipelined computation: merge whole tensors, update whole tensors.
void ExpectRoundsMatchUnpipelined(DeviceGroup& group, FakeWorker& worker) {
  const auto tensors = OddTensors();
  std::vector<std::vector<float>> expected;
  for (const auto& t : tensors) expected.push_back(worker.server_weights(t.name));
  for (int round = 0; round < 2; ++round) {
    auto grads = FillGradients(group, 100 * round + 7);
    ASSERT_TRUE(group.Round(kTimeout).ok());
    for (size_t t = 0; t < tensors.size(); ++t) {
      Update(absl::MakeSpan(expected[t]), SerialMerge(grads[t], 0, tensors[t].num_elements, MergeOp::kAverage));
      EXPECT_TRUE(BitwiseEqual(group.host_weights(t), expected[t])) << "round " << round << " tensor " << t;
      for (int d = 0; d < group.num_devices(); ++d) {
        std::vector<float> got(tensors[t].num_elements);
        ASSERT_TRUE(group.weights(d, t).CopyToHost(0, absl::MakeSpan(got)).ok());
        EXPECT_TRUE(BitwiseEqual(got, expected[t])) << "round " << round << " tensor " << t << " device " << d;
      }
    }
  }
  EXPECT_EQ(worker.outstanding(), 0u);
}

TEST(DeviceGroupTest, PipelinedRoundEqualsUnpipelinedForOneToEightDevices) {
  for (int d = 1; d <= 8; ++d) {
    SCOPED_TRACE(absl::StrCat("D = ", d));
    FakeWorker worker(OddTensors(), 1031);
    auto group = DeviceGroup::Create(worker, CpuDevices(d), OddTensors());
    ASSERT_TRUE(group.ok()) << group.status();
    ExpectRoundsMatchUnpipelined(**group, worker);
  }
}

TEST(DeviceGroupTest, PushesEveryPartitionInPriorityOrderBeforeWaitingForTheFirst) {
  FakeWorker worker(OddTensors(), 3000);  // b: 2 partitions, c: 14
  auto group = DeviceGroup::Create(worker, CpuDevices(2), OddTensors(), Priority({2, 0, 1}));
  ASSERT_TRUE(group.ok()) << group.status();
  FillGradients(**group, 1);
  ASSERT_TRUE((*group)->Round(kTimeout).ok());
  std::vector<std::string> want;
  for (int p = 0; p < 14; ++p) want.push_back(absl::StrCat("push c ", p));
  want.push_back("push a 0");
  want.push_back("push b 0");
  want.push_back("push b 1");
  for (int h = 0; h < 17; ++h) want.push_back(absl::StrCat("wait ", h));
  EXPECT_EQ(worker.log, want);
}

TEST(DeviceGroupTest, PushesOneMergedGradientPerPartitionWhateverD) {
  const size_t tensor_bytes = (1 + 4099 + 40961) * sizeof(float);
  for (int d : {1, 4}) {
    FakeWorker worker(OddTensors(), 1031);
    auto group = DeviceGroup::Create(worker, CpuDevices(d), OddTensors());
    ASSERT_TRUE(group.ok()) << group.status();
    for (int round = 0; round < 3; ++round) ASSERT_TRUE((*group)->Round(kTimeout).ok());
    EXPECT_EQ(worker.stats().bytes_pushed, 3 * tensor_bytes) << "D = " << d;
  }
}

TEST(DeviceGroupTest, PullBroadcastsServerWeightsToEveryDevice) {
  FakeWorker worker(OddTensors(), 1031);
  worker.server_weights("c")[40960] = 42.0f;
  auto group = DeviceGroup::Create(worker, CpuDevices(3), OddTensors());
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE((*group)->Pull(kTimeout).ok());
  for (int d = 0; d < 3; ++d) {
    std::vector<float> got(40961);
    ASSERT_TRUE((*group)->weights(d, 2).CopyToHost(0, absl::MakeSpan(got)).ok());
    EXPECT_TRUE(BitwiseEqual(got, worker.server_weights("c"))) << "device " << d;
  }
}

TEST(DeviceGroupTest, FailedWaitIsReportedAndEveryRequestIsStillWaitedFor) {
  FakeWorker worker(OddTensors(), 1031);
  auto group = DeviceGroup::Create(worker, CpuDevices(2), OddTensors());
  ASSERT_TRUE(group.ok()) << group.status();
  worker.fail_wait_of = 1;
  absl::Status s = (*group)->Round(kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(worker.outstanding(), 0u);
}

TEST(DeviceGroupTest, CreateRejectsWhatCannotBePushed) {
  FakeWorker worker(OddTensors(), 1031);
  EXPECT_EQ(DeviceGroup::Create(worker, {}, OddTensors()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceGroup::Create(worker, CpuDevices(2), {{"a", 2}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // size differs from the shard map
  EXPECT_EQ(DeviceGroup::Create(worker, CpuDevices(2), {{"zz", 2}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DeviceGroup::Create(worker, CpuDevices(2), OddTensors(), Priority({0, 0, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceGroup::Create(worker, CpuDevices(2), OddTensors(), Priority({0, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceGroupCudaTest, CudaRoundMeetsTheCpuOracleBitwise) {
  const int gpus = CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device (built with CUDA: " << CudaBuilt() << ")";
  for (int d : {1, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("D = ", d));
    std::vector<std::unique_ptr<Device>> cuda;
    for (int i = 0; i < d; ++i) {
      auto device = CreateCudaDevice(i % gpus, i);
      ASSERT_TRUE(device.ok()) << device.status();
      cuda.push_back(std::move(*device));
    }
    FakeWorker worker(OddTensors(), 1031);
    auto group = DeviceGroup::Create(worker, std::move(cuda), OddTensors());
    ASSERT_TRUE(group.ok()) << group.status();
    ExpectRoundsMatchUnpipelined(**group, worker);  // same oracle the CPU group meets
  }
}

}  // namespace
}  // namespace shardps
