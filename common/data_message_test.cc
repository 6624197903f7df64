#include "common/data_message.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/protocol.h"
#include "common/shared_buffer.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(DataMessageTest, HeaderRoundTrips) {
  DataHeader h;
  h.set_op(PUSH);
  h.set_request_id(42);
  h.set_partition_id(7);
  zmq::message_t frame = HeaderFrame(h);
  auto parsed = ParseDataHeader(frame);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request_id(), 42u);
  EXPECT_EQ(parsed->protocol_version(), kProtocolVersion);
}

TEST(DataMessageTest, RejectsGarbageEmptyAndOversizeFrames) {
  zmq::message_t garbage(std::string("\xff\xff\xff\xff\xff", 5));
  EXPECT_THAT(ParseDataHeader(garbage).status().message(), HasSubstr("malformed"));
  zmq::message_t empty;
  EXPECT_THAT(ParseDataHeader(empty).status().message(), HasSubstr("empty"));
  zmq::message_t huge(kMaxHeaderBytes + 1);
  EXPECT_THAT(ParseDataHeader(huge).status().message(), HasSubstr("exceeds"));
}

TEST(DataMessageTest, RejectsOtherProtocolVersion) {
  DataHeader h;
  h.set_op(PULL);
  h.set_protocol_version(kProtocolVersion + 1);
  std::string bytes = h.SerializeAsString();
  zmq::message_t frame(bytes.data(), bytes.size());
  auto parsed = ParseDataHeader(frame);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(parsed.status().message(), HasSubstr("protocol version"));
}

TEST(DataMessageTest, RejectsUnknownOp) {
  DataHeader h;
  h.set_protocol_version(kProtocolVersion);
  h.set_op(static_cast<Op>(99));
  std::string bytes = h.SerializeAsString();
  zmq::message_t frame(bytes.data(), bytes.size());
  EXPECT_THAT(ParseDataHeader(frame).status().message(), HasSubstr("unknown op"));
}

TEST(DataMessageTest, ResponseStatusRoundTrips) {
  DataHeader h;
  SetResponseStatus(absl::NotFoundError("no partition 9"), &h);
  absl::Status s = ResponseStatus(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no partition 9");
}

TEST(SharedBufferTest, ZeroCopyMessageHoldsAReference) {
  SharedBufferPtr buf(SharedBuffer::Create(16));
  buf->data()[3] = 1.5f;
  {
    zmq::message_t msg = buf->ZeroCopyMessage();
    EXPECT_FALSE(buf->unique());
    EXPECT_EQ(msg.data<float>()[3], 1.5f);
    EXPECT_EQ(msg.size(), 64u);
  }
  EXPECT_TRUE(buf->unique());
}

}  // namespace
}  // namespace shardps
