#include "compression/codec_bench.h"

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

using ::testing::HasSubstr;

TEST(CodecBenchTest, JsonHasOneLinePerCodecSizeAndDevice) {
  std::ostringstream out;
  CodecBenchOptions options{.codecs = {"2bit", "topk:ratio=0.1"}, .sizes_bytes = {4096, 65536},
                            .iters = 1, .json = true, .gpu = false};
  ASSERT_TRUE(RunCodecBench(options, out).ok());
  std::istringstream lines(out.str());
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    for (const char* key : {"\"codec\":", "\"bytes\":", "\"device\":", "\"compress_gbps\":",
                            "\"decompress_gbps\":", "\"copy_gbps\":"}) {
      EXPECT_THAT(line, HasSubstr(key));
    }
  }
  EXPECT_EQ(count, 2 * 2 * 2);
}

TEST(CodecBenchTest, TableHasHeader) {
  std::ostringstream out;
  CodecBenchOptions options{.codecs = {"fp16"}, .sizes_bytes = {4096}, .iters = 1, .gpu = false};
  ASSERT_TRUE(RunCodecBench(options, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("comp GB/s"));
  EXPECT_THAT(out.str(), HasSubstr("cpu1"));
}

TEST(CodecBenchTest, BadSpecIsRejected) {
  std::ostringstream out;
  CodecBenchOptions options{.codecs = {"zip"}, .sizes_bytes = {4096}, .iters = 1};
  EXPECT_EQ(RunCodecBench(options, out).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardps::compression
