#include "worker/local_tier/local_bench.h"

#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/local_tier/device_cuda.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

LocalBenchOptions Tiny() {
  LocalBenchOptions options;
  options.devices = {1, 3};
  options.sizes_bytes = {4096, 4100};
  options.iters = 2;
  return options;
}

TEST(LocalBenchTest, JsonModePrintsOneObjectPerFigure) {
  LocalBenchOptions options = Tiny();
  options.json = true;
  std::ostringstream out;
  ASSERT_TRUE(RunLocalBench(options, out).ok());
  std::istringstream lines(out.str());
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    EXPECT_THAT(line, HasSubstr("\"kind\":\"cpu\""));
    for (const char* key : {"\"devices\":", "\"bytes\":", "\"merge_gbps\":", "\"broadcast_gbps\":",
                            "\"copy_gbps\":"}) {
      EXPECT_THAT(line, HasSubstr(key));
    }
  }
  EXPECT_EQ(count, 4);
}

TEST(LocalBenchTest, CodecAddsThePushPathFiguresAndTheirLimit) {
  LocalBenchOptions options = Tiny();
  options.json = true;
  options.codec = "2bit";
  options.range_bytes = 1024;
  std::ostringstream out;
  ASSERT_TRUE(RunLocalBench(options, out).ok());
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    for (const char* key : {"\"codec\":\"2bit\"", "\"encode_gbps\":", "\"raw_gbps\":",
                            "\"host_copy_gbps\":", "\"pinned_gbps\":", "\"encode_vs_raw\":",
                            "\"host_copy_vs_pinned\":"}) {
      EXPECT_THAT(line, HasSubstr(key));
    }
  }
  // 4096 bytes = 1024 values in ranges of 256: four 2bit payloads of 4 + 64 bytes.
  EXPECT_THAT(out.str(), HasSubstr("\"bytes\":4096,"));
  EXPECT_THAT(out.str(), HasSubstr("\"payload_bytes\":272,"));
}

TEST(LocalBenchTest, UnknownCodecIsInvalidArgumentNamingIt) {
  LocalBenchOptions options = Tiny();
  options.codec = "nonesuch";
  std::ostringstream out;
  absl::Status s = RunLocalBench(options, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nonesuch"));
}

TEST(LocalBenchTest, TableSaysWhatMergeBandwidthCounts) {
  std::ostringstream out;
  ASSERT_TRUE(RunLocalBench(Tiny(), out).ok());
  EXPECT_THAT(out.str(), HasSubstr("merge GB/s counts every input byte"));
  EXPECT_THAT(out.str(), HasSubstr("merge_GB/s"));
}

TEST(LocalBenchTest, SizeNotMultipleOfFloatIsInvalidArgument) {
  LocalBenchOptions options = Tiny();
  options.sizes_bytes = {6};
  std::ostringstream out;
  EXPECT_EQ(RunLocalBench(options, out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalBenchTest, CudaKindWithoutGpuIsFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "machine has GPUs";
  LocalBenchOptions options = Tiny();
  options.kind = DeviceKind::kCuda;
  std::ostringstream out;
  EXPECT_EQ(RunLocalBench(options, out).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardps
