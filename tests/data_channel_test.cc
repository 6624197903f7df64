// DataChannel against fake servers (plain ZeroMQ ROUTER sockets): what a
// worker sends, in which order, when a partition's primary moves.
#include "worker/data_channel.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_message.h"
#include "proto/cluster.pb.h"

namespace shardps {
namespace {

// A server socket that records the requests it receives and answers none.
struct FakeServer {
  explicit FakeServer(zmq::context_t& context) : socket(context, zmq::socket_type::router) {
    socket.bind("tcp://127.0.0.1:*");
    address = socket.get(zmq::sockopt::last_endpoint);
  }
  // Receives `n` requests (peer, header, payload frames) within `timeout_ms`.
  std::vector<DataHeader> Receive(size_t n, int timeout_ms = 10000) {
    std::vector<DataHeader> got;
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    while (got.size() < n && zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) > 0) {
      zmq::message_t peer, head;
      (void)socket.recv(peer);
      (void)socket.recv(head);
      if (head.more()) {
        zmq::message_t payload;
        (void)socket.recv(payload);
      }
      auto header = ParseDataHeader(head);
      EXPECT_TRUE(header.ok()) << header.status();
      if (header.ok()) got.push_back(*header);
      peers.push_back(std::move(peer));
    }
    return got;
  }
  // Answers `request` (the i-th received) OK with `n` weights of the given
  // completed rounds.
  void AnswerWeights(size_t i, const DataHeader& request, uint64_t completed_rounds, size_t n) {
    DataHeader answer;
    answer.set_request_id(request.request_id());
    answer.set_partition_id(request.partition_id());
    answer.set_op(request.op());
    answer.set_num_elements(n);
    answer.set_dtype(FLOAT32);
    answer.set_completed_rounds(completed_rounds);
    SetResponseStatus(absl::OkStatus(), &answer);
    std::vector<float> weights(n, static_cast<float>(completed_rounds));
    zmq::message_t peer(peers[i].data(), peers[i].size());
    zmq::message_t head = HeaderFrame(answer);
    zmq::message_t payload(weights.data(), weights.size() * sizeof(float));
    socket.send(peer, zmq::send_flags::sndmore);
    socket.send(head, zmq::send_flags::sndmore);
    socket.send(payload, zmq::send_flags::none);
  }
  std::vector<zmq::message_t> peers;  // of the requests received, in order
  zmq::socket_t socket;
  std::string address;
};

// Submits a PUSH of `gradient` (borrowed) for partition 7, round `round`,
// to server 0 at epoch 1; returns its handle.
uint64_t SubmitPush(DataChannel& channel, const std::vector<float>& gradient, uint64_t round) {
  DataChannel::Request r;
  r.server = 0;
  r.header.set_op(PUSH);
  r.header.set_partition_id(7);
  r.header.set_round(round);
  r.header.set_epoch(1);
  r.header.set_num_elements(gradient.size());
  r.header.set_dtype(FLOAT32);
  r.payload = gradient.data();
  std::vector<DataChannel::Request> one;
  one.push_back(std::move(r));
  return channel.Submit(std::move(one), absl::StrCat("push ", round));
}

// Several pushes of one partition in flight (the C ABI lets a job push a
// tensor again before the first answer): when the partition's primary moves,
// they reach the new primary in the order they were first sent, so it takes
// none of the later ones for a retry of an earlier one.
TEST(DataChannelTest, RerouteResendsAPartitionsWaitingRequestsInTheOrderTheyWereSent) {
  zmq::context_t context;
  FakeServer old_primary(context), new_primary(context);
  auto channel = DataChannel::Create({{old_primary.address, "", false}, {new_primary.address, "", false}}, 0);
  ASSERT_TRUE(channel.ok()) << channel.status();
  constexpr int kPushes = 48;
  std::vector<float> gradient(4, 1.0f);
  for (int i = 0; i < kPushes; ++i) (void)SubmitPush(**channel, gradient, i);
  std::vector<DataHeader> first = old_primary.Receive(kPushes);
  ASSERT_EQ(first.size(), static_cast<size_t>(kPushes));
  EXPECT_EQ((*channel)->Reroute({{7, 1}}, 2), kPushes);
  std::vector<DataHeader> again = new_primary.Receive(kPushes);
  ASSERT_EQ(again.size(), static_cast<size_t>(kPushes));
  for (int i = 0; i < kPushes; ++i) {
    EXPECT_EQ(again[i].request_id(), first[i].request_id()) << "re-sent request " << i << " out of order";
    EXPECT_EQ(again[i].round(), static_cast<uint64_t>(i));
    EXPECT_EQ(again[i].epoch(), 2u);
  }
}

// A push submitted after its server died waits in ZeroMQ's queue for a
// reconnection. The server is declared dead and the push re-sent to the new
// primary, which answers it; the caller may then reuse its gradient buffer.
// A replacement that listens at the dead server's address must not get the
// queued copy (ZeroMQ would read the borrowed buffer to send it).
TEST(DataChannelTest, APushQueuedForADeadServerIsNotSentToItsReplacementAfterItsResendWasAnswered) {
  zmq::context_t context;
  auto dead = std::make_unique<FakeServer>(context);
  FakeServer new_primary(context);
  const std::string address = dead->address;
  auto channel = DataChannel::Create({{address, "", false}, {new_primary.address, "", false}}, 0);
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::vector<float> gradient(4, 1.0f);
  (void)SubmitPush(**channel, gradient, 0);
  ASSERT_EQ(dead->Receive(1).size(), 1u) << "connected";
  dead.reset();  // SIGKILLed: its connection drops
  absl::SleepFor(absl::Milliseconds(300));
  const uint64_t handle = SubmitPush(**channel, gradient, 1);  // queued: nothing is connected
  (*channel)->DropQueued(0);        // the map declares server 0 dead
  EXPECT_EQ((*channel)->Reroute({{7, 1}}, 2), 2);
  std::vector<DataHeader> resent = new_primary.Receive(2);
  ASSERT_EQ(resent.size(), 2u);
  for (size_t i = 0; i < resent.size(); ++i) new_primary.AnswerWeights(i, resent[i], 1, 0);
  ASSERT_TRUE((*channel)->Wait(handle, absl::Seconds(10)).ok());
  gradient.assign(4, -7.0f);  // the caller reuses its buffer
  zmq::socket_t replacement(context, zmq::socket_type::router);
  replacement.bind(address);
  zmq::pollitem_t item{replacement.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(1500)), 0)
      << "the replacement got a request queued for the dead server";
}

// A caller that keeps a second step in flight computes on the weights it
// has waited for: an answer that arrived but whose handle was not handed back
// yet is not what the next gradient is based on.
TEST(DataChannelTest, WeightsVersionIsThatOfTheAnswersHandedBackNotOfTheLatestArrival) {
  zmq::context_t context;
  FakeServer server(context);
  auto channel = DataChannel::Create({{server.address, "", false}}, 0);
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::vector<float> gradient(4, 1.0f), weights(4, 0.0f), later(4, 0.0f);
  auto push_pull = [&](float* out) {
    DataChannel::Request r;
    r.header.set_op(PUSH_PULL);
    r.header.set_partition_id(7);
    r.header.set_epoch(1);
    r.header.set_num_elements(gradient.size());
    r.header.set_dtype(FLOAT32);
    r.payload = gradient.data();
    r.out = out;
    std::vector<DataChannel::Request> one;
    one.push_back(std::move(r));
    return (*channel)->Submit(std::move(one), "push_pull");
  };
  const uint64_t first = push_pull(weights.data());
  std::vector<DataHeader> got = server.Receive(1);
  ASSERT_EQ(got.size(), 1u);
  server.AnswerWeights(0, got[0], 5, gradient.size());
  ASSERT_TRUE((*channel)->Wait(first, absl::Seconds(10)).ok());
  EXPECT_EQ((*channel)->weights_version(7), 5u);

  const uint64_t second = push_pull(later.data());
  const uint64_t third = push_pull(later.data());
  got = server.Receive(2);
  ASSERT_EQ(got.size(), 2u);
  server.AnswerWeights(1, got[0], 6, gradient.size());
  // Waiting on the third (never answered here) drains the second's answer.
  absl::Status status;
  for (int i = 0; i < 200 && later[0] != 6.0f; ++i) {
    EXPECT_FALSE((*channel)->WaitAny(absl::MakeConstSpan(&third, 1), absl::Milliseconds(10), &status).ok());
  }
  ASSERT_EQ(later[0], 6.0f) << "the second answer never arrived";
  EXPECT_EQ((*channel)->weights_version(7), 5u) << "arrived, but not handed back";
  ASSERT_TRUE((*channel)->Wait(second, absl::Seconds(10)).ok());
  EXPECT_EQ((*channel)->weights_version(7), 6u);
}

}  // namespace
}  // namespace shardps
