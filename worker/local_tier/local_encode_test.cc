// MergeEncode / DecodeBroadcast on CPU devices, against the serial merge
// oracle and the CPU codecs used directly.
#include <cstring>
#include <vector>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "gtest/gtest.h"
#include "worker/local_tier/local_encode_test_util.h"
#include "worker/local_tier/local_test_data.h"

namespace shardps {
namespace {

using compression::CodecParams;

CodecParams Params(const char* spec) {
  auto params = compression::ParseCodecSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  return *params;
}

std::vector<uint8_t> Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(MergeEncodeTest, WithoutCodecHandsOutTheMergedFloatsPerRange) {
  const size_t n = 3001;
  const auto grads = RandomGradients(3, n, 7);
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, grads, {}).ok());
  const auto ranges = ThreeRanges(n, 0);
  auto payloads = tier.Encode(ranges);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  ASSERT_EQ(payloads->size(), ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ((*payloads)[i],
              Bytes(SerialMerge(grads, ranges[i].offset, ranges[i].length, MergeOp::kAverage)))
        << "range " << i;
  }
}

TEST(MergeEncodeTest, PayloadsStayValidUntilTheNextCall) {
  const size_t n = 999;
  const auto grads = RandomGradients(2, n, 8);
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, grads, {}).ok());
  std::vector<absl::Span<const uint8_t>> seen;
  const auto inputs = tier.inputs();
  auto ranges = ThreeRanges(n, 0);
  for (EncodeRange& r : ranges) r.inputs = inputs;
  ASSERT_TRUE(tier.reducer()
                  .MergeEncode(ranges, MergeOp::kSum,
                               [&](size_t, absl::Span<const uint8_t> payload) {
                                 seen.push_back(payload);
                                 return absl::OkStatus();
                               })
                  .ok());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto want = Bytes(SerialMerge(grads, ranges[i].offset, ranges[i].length, MergeOp::kSum));
    EXPECT_EQ(std::vector<uint8_t>(seen[i].begin(), seen[i].end()), want) << "range " << i;
  }
}

TEST(MergeEncodeTest, CodecWithErrorFeedbackMatchesTheCpuCodecOverRounds) {
  const size_t n = 5000;
  for (const char* spec : {"2bit", "onebit", "topk:ratio=0.05", "fp16", "randomk:ratio=0.1"}) {
    SCOPED_TRACE(spec);
    LocalReducerOptions options;
    options.push_codec = Params(spec);
    options.error_feedback = true;
    EncodeTier tier;
    auto grads = RandomGradients(2, n, 9);
    ASSERT_TRUE(tier.Init(DeviceKind::kCpu, grads, options).ok());
    auto reference = compression::ErrorFeedback::Create(*options.push_codec);
    ASSERT_TRUE(reference.ok());
    for (uint64_t round = 0; round < 3; ++round) {
      grads = RandomGradients(2, n, 100 + round);
      ASSERT_TRUE(tier.SetContents(grads).ok());
      const auto ranges = ThreeRanges(n, round);
      auto payloads = tier.Encode(ranges);
      ASSERT_TRUE(payloads.ok()) << payloads.status();
      for (size_t i = 0; i < ranges.size(); ++i) {
        const EncodeRange& r = ranges[i];
        const auto merged = SerialMerge(grads, r.offset, r.length, MergeOp::kAverage);
        std::vector<uint8_t> want((*reference)->MaxEncodedBytes(r.length));
        auto written = (*reference)->Encode(r.residual_key, merged, r.seed, absl::MakeSpan(want));
        ASSERT_TRUE(written.ok());
        want.resize(*written);
        EXPECT_EQ((*payloads)[i], want) << "round " << round << " range " << i;
      }
    }
  }
}

TEST(MergeEncodeTest, SinkErrorStopsTheCall) {
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, RandomGradients(2, 300, 1), {}).ok());
  int calls = 0;
  const auto inputs = tier.inputs();
  auto ranges = ThreeRanges(300, 0);
  for (EncodeRange& r : ranges) r.inputs = inputs;
  absl::Status s = tier.reducer().MergeEncode(
      ranges, MergeOp::kSum, [&](size_t, absl::Span<const uint8_t>) {
        ++calls;
        return absl::UnavailableError("wire down");
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
}

TEST(MergeEncodeTest, RangeOutsideTheBuffersIsRefusedNamingIt) {
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, RandomGradients(2, 100, 1), {}).ok());
  const auto inputs = tier.inputs();
  std::vector<EncodeRange> ranges = {{inputs, 0, 50, 0, 0}, {inputs, 50, 51, 0, 1}};
  absl::Status s = tier.reducer().MergeEncode(
      ranges, MergeOp::kSum,
      [](size_t, absl::Span<const uint8_t>) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("range 1"), absl::string_view::npos) << s;
}

TEST(DecodeBroadcastTest, DecodesIntoEveryDeviceAndAccumulates) {
  const size_t n = 777, offset = 100, len = 600;
  LocalReducerOptions options;
  options.pull_codec = Params("2bit");
  auto start = RandomGradients(1, n, 3)[0];
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, {start, start, start}, options).ok());
  auto codec = compression::CreateCodec(*options.pull_codec);
  ASSERT_TRUE(codec.ok());
  const auto delta = RandomGradients(1, len, 4)[0];
  std::vector<uint8_t> payload((*codec)->EncodedBytes(len));
  ASSERT_TRUE((*codec)->Encode(delta, 5, absl::MakeSpan(payload)).ok());
  std::vector<float> want(start);
  ASSERT_TRUE((*codec)->DecodeAdd(payload, 5, absl::MakeSpan(want).subspan(offset, len)).ok());

  auto outputs = tier.raw_buffers();
  ASSERT_TRUE(tier.reducer().DecodeBroadcast(payload, 5, len, true, absl::MakeSpan(outputs), offset).ok());
  for (int d = 0; d < 3; ++d) EXPECT_EQ(tier.Contents(d), want) << "device " << d;

  ASSERT_TRUE((*codec)->Decode(payload, 5, absl::MakeSpan(want).subspan(offset, len)).ok());
  ASSERT_TRUE(tier.reducer().DecodeBroadcast(payload, 5, len, false, absl::MakeSpan(outputs), offset).ok());
  for (int d = 0; d < 3; ++d) EXPECT_EQ(tier.Contents(d), want) << "device " << d;
}

TEST(DecodeBroadcastTest, MalformedPayloadChangesNothing) {
  const auto start = RandomGradients(1, 64, 3)[0];
  EncodeTier tier;
  ASSERT_TRUE(tier.Init(DeviceKind::kCpu, {start, start}, {}).ok());
  const std::vector<uint8_t> short_payload(10);
  auto outputs = tier.raw_buffers();
  absl::Status s = tier.reducer().DecodeBroadcast(short_payload, 0, 64, false, absl::MakeSpan(outputs), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (int d = 0; d < 2; ++d) EXPECT_EQ(tier.Contents(d), start);
}

}  // namespace
}  // namespace shardps
