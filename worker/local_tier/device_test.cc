#include "worker/local_tier/device.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/local_tier/device_cuda.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(CreateDevicesTest, CpuSpecGivesThatManyCpuDevicesInOrder) {
  auto devices = CreateDevices("cpu:4");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*devices)[i]->kind(), DeviceKind::kCpu);
    EXPECT_EQ((*devices)[i]->index(), i);
    EXPECT_EQ((*devices)[i]->name(), "cpu:" + std::to_string(i));
  }
}

TEST(CreateDevicesTest, BareCpuIsOneDevice) {
  auto devices = CreateDevices("cpu");
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(devices->size(), 1u);
}

TEST(CreateDevicesTest, MalformedSpecsAreInvalidArgumentNamingTheSpec) {
  for (const char* spec :
       {"", "gpu:0", "cpu:0", "cpu:", "cpu:x", "cpu:2000", "cpu:4,cpu:5", "cuda:", "cuda:-1",
        "cuda:a", "cuda:0,cuda:0", "cuda:0,cpu:1", "cudax"}) {
    auto devices = CreateDevices(spec);
    ASSERT_FALSE(devices.ok()) << spec;
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(devices.status().message(), HasSubstr("\"" + std::string(spec) + "\""));
  }
}

TEST(CreateDevicesTest, MissingGpuIsFailedPreconditionSayingHowManyWereFound) {
  auto devices = CreateDevices("cuda:0,cuda:99");
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(devices.status().message(), HasSubstr("cuda:99"));
  EXPECT_THAT(devices.status().message(),
              HasSubstr(std::to_string(CudaDeviceCount()) + " GPU(s) found"));
}

TEST(CreateDevicesTest, AllGpusSpecFailsCleanlyWithoutGpus) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "machine has GPUs";
  auto devices = CreateDevices("cuda");
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(devices.status().message(), HasSubstr("no GPU found"));
}

TEST(CpuDeviceTest, BufferStartsZeroedAndRoundTripsHostData) {
  auto devices = CreateDevices("cpu");
  ASSERT_TRUE(devices.ok());
  auto buffer = (*devices)[0]->Allocate(5);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->size(), 5u);
  std::vector<float> out(5, -1.0f);
  ASSERT_TRUE((*buffer)->CopyToHost(0, absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ::testing::Each(0.0f));
  const std::vector<float> in = {1, 2, 3};
  ASSERT_TRUE((*buffer)->CopyFromHost(in, 2).ok());
  ASSERT_TRUE((*buffer)->CopyToHost(0, absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ::testing::ElementsAre(0, 0, 1, 2, 3));
}

TEST(CpuDeviceTest, CopyOutsideBufferIsInvalidArgument) {
  auto devices = CreateDevices("cpu");
  ASSERT_TRUE(devices.ok());
  auto buffer = (*devices)[0]->Allocate(4);
  ASSERT_TRUE(buffer.ok());
  std::vector<float> three(3);
  EXPECT_EQ((*buffer)->CopyFromHost(three, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*buffer)->CopyToHost(5, absl::MakeSpan(three).subspan(0, 0)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, CopyFromBufferOfOtherSizeIsInvalidArgument) {
  auto devices = CreateDevices("cpu:2");
  ASSERT_TRUE(devices.ok());
  auto a = (*devices)[0]->Allocate(4);
  auto b = (*devices)[1]->Allocate(4);
  auto c = (*devices)[1]->Allocate(3);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE((*b)->CopyFromHost(std::vector<float>{1, 2, 3, 4}).ok());
  ASSERT_TRUE((*a)->CopyFrom(**b).ok());
  EXPECT_EQ((*a)->data()[3], 4.0f);
  EXPECT_EQ((*a)->CopyFrom(**c).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, SubmittedWorkRunsInOrderOnTheDeviceThread) {
  auto devices = CreateDevices("cpu");
  ASSERT_TRUE(devices.ok());
  Device& device = *(*devices)[0];
  std::vector<int> order;
  std::thread::id worker;
  auto first = device.Submit([&] {
    worker = std::this_thread::get_id();
    order.push_back(1);
    return absl::OkStatus();
  });
  auto second = device.Submit([&] {
    order.push_back(2);
    return absl::DataLossError("boom");
  });
  EXPECT_TRUE(first.get().ok());
  EXPECT_EQ(second.get().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_THAT(order, ::testing::ElementsAre(1, 2));
}

}  // namespace
}  // namespace shardps
