#include "tools/train/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardps::train {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool HaveRealData() { return std::filesystem::exists(kFashionMnistDir); }

// An IDX file image: big-endian magic, dimensions, then the payload.
std::string Idx(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string out;
  auto put32 = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  return out + payload;
}

void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

// A scratch dataset directory holding a small, valid training split that
// each test then breaks in one way.
class FakeDatasetTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kCount = 3;

  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    WriteImages(Idx(0x803, {kCount, 28, 28}, std::string(kCount * 784, '\x80')));
    WriteLabels(Idx(0x801, {kCount}, std::string("\x00\x09\x05", kCount)));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string ImagesPath() const { return dir_ / "train-images-idx3-ubyte.gz"; }
  std::string LabelsPath() const { return dir_ / "train-labels-idx1-ubyte.gz"; }
  void WriteImages(const std::string& bytes) { WriteGz(ImagesPath(), bytes); }
  void WriteLabels(const std::string& bytes) { WriteGz(LabelsPath(), bytes); }
  absl::StatusOr<Dataset> Load() { return LoadFashionMnist(dir_, Split::kTrain); }

  std::filesystem::path dir_;
};

TEST(LoadFashionMnistTest, ReadsRealTrainingSplit) {
  if (!HaveRealData()) GTEST_SKIP() << kFashionMnistDir << " absent (dataset-fashion-mnist)";
  absl::StatusOr<Dataset> data = LoadFashionMnist(kFashionMnistDir, Split::kTrain);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), 60000u);
  ASSERT_EQ(data->images.size(), 60000u * kImagePixels);
  std::array<int, kNumClasses> per_class{};
  for (uint8_t label : data->labels) {
    ASSERT_LT(label, kNumClasses);
    ++per_class[label];
  }
  for (int count : per_class) EXPECT_EQ(count, 6000);  // Fashion-MNIST is balanced.
  const auto [lo, hi] = std::minmax_element(data->images.begin(), data->images.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
}

TEST(LoadFashionMnistTest, ReadsRealTestSplit) {
  if (!HaveRealData()) GTEST_SKIP() << kFashionMnistDir << " absent (dataset-fashion-mnist)";
  absl::StatusOr<Dataset> data = LoadFashionMnist(kFashionMnistDir, Split::kTest);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 10000u);
  EXPECT_EQ(data->images.size(), 10000u * kImagePixels);
  EXPECT_TRUE(std::all_of(data->labels.begin(), data->labels.end(),
                          [](uint8_t l) { return l < kNumClasses; }));
}

TEST(LoadFashionMnistTest, LimitReadsTheFirstSamples) {
  if (!HaveRealData()) GTEST_SKIP() << kFashionMnistDir << " absent (dataset-fashion-mnist)";
  absl::StatusOr<Dataset> small = LoadFashionMnist(kFashionMnistDir, Split::kTest, 10);
  absl::StatusOr<Dataset> larger = LoadFashionMnist(kFashionMnistDir, Split::kTest, 20);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(larger.ok()) << larger.status();
  ASSERT_EQ(small->size(), 10u);
  EXPECT_TRUE(std::equal(small->images.begin(), small->images.end(), larger->images.begin()));
  EXPECT_TRUE(std::equal(small->labels.begin(), small->labels.end(), larger->labels.begin()));
}

TEST(LoadFashionMnistTest, MissingDirectoryIsNotFound) {
  absl::StatusOr<Dataset> data = LoadFashionMnist("/nonexistent/fmnist", Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("t10k-images-idx3-ubyte.gz"));
}

TEST_F(FakeDatasetTest, ReadsValidFilesScaledToUnitRange) {
  absl::StatusOr<Dataset> data = Load();
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels, ElementsAre(0, 9, 5));
  EXPECT_EQ(data->images.size(), kCount * kImagePixels);
  EXPECT_EQ(data->images[0], 128.0f / 255.0f);
}

TEST_F(FakeDatasetTest, RejectsBadMagic) {
  WriteImages(Idx(0x801, {kCount, 28, 28}, std::string(kCount * 784, '\0')));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(),
              AllOf(HasSubstr(ImagesPath()), HasSubstr("bad magic number 0x00000801")));
}

TEST_F(FakeDatasetTest, RejectsImagesThatAreNot28x28) {
  WriteImages(Idx(0x803, {kCount, 28, 27}, std::string(kCount * 28 * 27, '\0')));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(), AllOf(HasSubstr(ImagesPath()), HasSubstr("28x27")));
}

TEST_F(FakeDatasetTest, RejectsTruncatedPixelData) {
  WriteImages(Idx(0x803, {kCount, 28, 28}, std::string(kCount * 784 - 100, '\0')));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(), AllOf(HasSubstr(ImagesPath()), HasSubstr("truncated")));
}

TEST_F(FakeDatasetTest, RejectsTruncatedGzipStream) {
  std::filesystem::resize_file(ImagesPath(), std::filesystem::file_size(ImagesPath()) / 2);
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(), AllOf(HasSubstr(ImagesPath()), HasSubstr("truncated")));
}

TEST_F(FakeDatasetTest, RejectsGzipStreamMissingItsTrailer) {
  std::filesystem::resize_file(LabelsPath(), std::filesystem::file_size(LabelsPath()) - 6);
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(), AllOf(HasSubstr(LabelsPath()), HasSubstr("truncated")));
}

TEST_F(FakeDatasetTest, RejectsBytesAfterTheDeclaredRecords) {
  WriteLabels(Idx(0x801, {kCount}, std::string("\x00\x09\x05\x01", kCount + 1)));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(),
              AllOf(HasSubstr(LabelsPath()), HasSubstr("unexpected bytes")));
}

TEST_F(FakeDatasetTest, RejectsLabelOutOfRange) {
  WriteLabels(Idx(0x801, {kCount}, std::string("\x00\x0a\x05", kCount)));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(),
              AllOf(HasSubstr(LabelsPath()), HasSubstr("label 10 at index 1")));
}

TEST_F(FakeDatasetTest, RejectsImageLabelCountMismatch) {
  WriteLabels(Idx(0x801, {kCount - 1}, std::string(kCount - 1, '\0')));
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Load().status().message(), AllOf(HasSubstr("holds 3 images"), HasSubstr("2 labels")));
}

TEST(GatherBatchTest, CopiesTheIndexedSamplesInOrder) {
  Dataset data;
  data.labels = {0, 1, 2};
  data.images.resize(3 * kImagePixels);
  for (size_t i = 0; i < data.images.size(); ++i) data.images[i] = i / kImagePixels;
  std::vector<float> images;
  std::vector<uint8_t> labels;
  const std::vector<uint32_t> indices = {2, 0};
  GatherBatch(data, indices, &images, &labels);
  EXPECT_THAT(labels, ElementsAre(2, 0));
  ASSERT_EQ(images.size(), 2u * kImagePixels);
  EXPECT_EQ(images[0], 2.0f);
  EXPECT_EQ(images[kImagePixels], 0.0f);
}

TEST(ShardIndicesTest, ShardsAreDisjointAndCoverEverySample) {
  constexpr size_t kN = 1003;
  constexpr int kWorld = 3;
  std::vector<int> seen(kN, 0);
  for (int rank = 0; rank < kWorld; ++rank) {
    for (uint32_t i : ShardIndices(kN, rank, kWorld, 7, 0)) {
      ASSERT_LT(i, kN);
      ++seen[i];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

TEST(ShardIndicesTest, ShardIsAShuffledPermutationOfItsContiguousRange) {
  std::vector<uint32_t> shard = ShardIndices(1000, 1, 4, 7, 0);  // [250, 500).
  ASSERT_EQ(shard.size(), 250u);
  EXPECT_FALSE(std::is_sorted(shard.begin(), shard.end()));
  std::sort(shard.begin(), shard.end());
  for (size_t i = 0; i < shard.size(); ++i) EXPECT_EQ(shard[i], 250 + i);
}

TEST(ShardIndicesTest, OrderDiffersAcrossEpochsAndSeeds) {
  const std::vector<uint32_t> base = ShardIndices(1000, 0, 2, 7, 0);
  EXPECT_NE(ShardIndices(1000, 0, 2, 7, 1), base);
  EXPECT_NE(ShardIndices(1000, 0, 2, 8, 0), base);
}

TEST(ShardIndicesTest, OrderIsIdenticalAcrossCalls) {
  EXPECT_EQ(ShardIndices(60000, 3, 4, 42, 5), ShardIndices(60000, 3, 4, 42, 5));
}

TEST(ShardIndicesTest, OrderIsPinnedForEveryPlatform) {
  // Golden values: a change here changes every run's sample order.
  EXPECT_THAT(ShardIndices(10, 0, 1, 42, 0), ElementsAre(9, 2, 4, 8, 5, 7, 1, 0, 6, 3));
}

TEST(ShardIndicesTest, HandlesMoreRanksThanSamples) {
  EXPECT_TRUE(ShardIndices(2, 0, 4, 1, 0).empty());
  EXPECT_EQ(ShardIndices(2, 1, 4, 1, 0).size() + ShardIndices(2, 3, 4, 1, 0).size(), 2u);
}

}  // namespace
}  // namespace shardps::train
