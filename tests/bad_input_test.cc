// A raw ZeroMQ client throws malformed messages at a real server process:
// every one gets an error answer, the server keeps serving, weights stay put.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zmq.hpp>

#include "common/tensor_spec.h"
#include "common/data_message.h"
#include "common/protocol.h"
#include "tests/test_cluster.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(1);
    config.set_num_workers(1);
    config.set_consistency(ASYNC);
    auto started = StartWithRawClient(config, kN, 7.0f, context_);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(started->cluster);
    worker_ = std::move(started->worker);
    socket_ = std::move(started->socket);
  }

  // Sends raw frames; returns the answer's header (fails the test on no answer).
  DataHeader Exchange(std::vector<std::string> frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::message_t head;
    EXPECT_TRUE(socket_.recv(head).has_value()) << "no answer from the server";
    DataHeader h;
    h.ParseFromArray(head.data(), head.size());
    while (head.more()) (void)socket_.recv(head);
    return h;
  }

  DataHeader Valid(Op op) {
    DataHeader h;
    h.set_protocol_version(kProtocolVersion);
    h.set_op(op);
    h.set_epoch(1);
    h.set_partition_id(0);
    h.set_request_id(1000 + next_++);
    h.set_dtype(FLOAT32);
    h.set_num_elements(kN);
    return h;
  }

  std::vector<float> Weights() { return PullWeights(*worker_, "w", kN); }

  static constexpr int kN = 64;
  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Worker> worker_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  int next_ = 0;
};

TEST_F(BadInputTest, MalformedMessagesGetErrorsAndChangeNothing) {
  const std::string good_payload(kN * 4, '\0');
  struct Case {
    std::string name;
    std::vector<std::string> frames;
    std::string expect;
  };
  DataHeader wrong_version = Valid(PUSH);
  wrong_version.set_protocol_version(kProtocolVersion + 1);
  DataHeader huge = Valid(PUSH);
  huge.set_num_elements(uint64_t{1} << 60);
  DataHeader unknown = Valid(PUSH);
  unknown.set_partition_id(424242);
  DataHeader stale = Valid(PUSH);
  stale.set_epoch(99);
  DataHeader bad_rank = Valid(PUSH);
  bad_rank.set_worker_rank(17);
  DataHeader bad_dtype = Valid(PUSH);
  bad_dtype.set_dtype(7);
  DataHeader bad_op = Valid(PUSH);
  bad_op.set_op(static_cast<Op>(42));
  const std::vector<Case> cases = {
      {"garbage header", {"\xff\xfe\xfd garbage", good_payload}, "malformed"},
      {"empty header", {"", good_payload}, "empty header"},
      {"oversize header", {std::string(kMaxHeaderBytes + 1, 'x')}, "exceeds the limit"},
      {"other protocol version", {wrong_version.SerializeAsString(), good_payload}, "protocol version"},
      {"absurd length", {huge.SerializeAsString(), good_payload}, "elements"},
      {"truncated payload", {Valid(PUSH).SerializeAsString(), good_payload.substr(0, 10)}, "payload of 10 bytes"},
      {"missing payload", {Valid(PUSH).SerializeAsString()}, "no payload"},
      {"unknown partition", {unknown.SerializeAsString(), good_payload}, "not served"},
      {"stale epoch", {stale.SerializeAsString(), good_payload}, "wrong epoch"},
      {"rank out of range", {bad_rank.SerializeAsString(), good_payload}, "rank 17"},
      {"wrong dtype", {bad_dtype.SerializeAsString(), good_payload}, "dtype"},
      {"unknown op", {bad_op.SerializeAsString(), good_payload}, "unknown op"},
      {"extra frames", {Valid(PUSH).SerializeAsString(), good_payload, "x", "y"}, "frames"},
  };
  for (const Case& c : cases) {
    DataHeader answer = Exchange(c.frames);
    EXPECT_NE(answer.status_code(), 0) << c.name;
    EXPECT_THAT(answer.error(), HasSubstr(c.expect)) << c.name;
  }
  EXPECT_EQ(Weights(), std::vector<float>(kN, 7.0f)) << "a rejected message changed the weights";
  // The server still applies a well-formed push after all that.
  DataHeader ok = Exchange({Valid(PUSH).SerializeAsString(), std::string(kN * 4, '\0')});
  EXPECT_EQ(ok.status_code(), 0) << ok.error();
}

}  // namespace
}  // namespace shardps
