#include "common/durable_file.h"

#include <filesystem>

#include <gtest/gtest.h>

namespace shardps {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))).string();
}

TEST(DurableFileTest, WrittenRecordReadsBack) {
  const std::string path = TempPath("durable-ok-");
  ASSERT_TRUE(WriteFileDurably(path, SealRecord("state", "hello")).ok());
  auto data = ReadWholeFile(path);
  ASSERT_TRUE(data.ok()) << data.status();
  auto payload = UnsealRecord("state", *data, path);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "hello");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  std::filesystem::remove(path);
}

TEST(DurableFileTest, AFailedWriteLeavesNoTempFileBehind) {
  // The target is a directory that is not empty: the rename into place fails
  // after the temp file was written in full (as a full disk fails the write).
  const std::string dir = TempPath("durable-fail-");
  std::filesystem::create_directories(dir + "/target/inside");
  absl::Status s = WriteFileDurably(dir + "/target", SealRecord("state", "hello"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot rename into place " + dir + "/target.tmp."), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir + "/target.tmp." + std::to_string(::getpid())));
  std::filesystem::remove_all(dir);
}

TEST(DurableFileTest, CorruptTruncatedOrForeignRecordsAreRefusedNamingTheFile) {
  const std::string good = SealRecord("state", "payload bytes");
  std::string flipped = good;
  flipped.back() ^= 1;
  auto corrupt = UnsealRecord("state", flipped, "/x/state");
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find("/x/state fails its checksum"), std::string::npos);
  auto torn = UnsealRecord("state", good.substr(0, good.size() - 3), "/x/state");
  EXPECT_NE(torn.status().message().find("truncated"), std::string::npos) << torn.status();
  EXPECT_EQ(UnsealRecord("checkpoint", good, "/x/state").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(UnsealRecord("state", "garbage", "/x/state").status().code(), absl::StatusCode::kDataLoss);
}

TEST(DurableFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadWholeFile(TempPath("durable-missing-")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardps
