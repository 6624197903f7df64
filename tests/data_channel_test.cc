// DataChannel against fake servers (plain ZeroMQ ROUTER sockets): what a
// worker sends, in which order, when a partition's primary moves.
#include "worker/data_channel.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
    }
    return got;
  }
  zmq::socket_t socket;
  std::string address;
};

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
  for (int i = 0; i < kPushes; ++i) {
    DataChannel::Request r;
    r.server = 0;
    r.header.set_op(PUSH);
    r.header.set_partition_id(7);
    r.header.set_round(i);
    r.header.set_epoch(1);
    r.header.set_num_elements(gradient.size());
    r.header.set_dtype(FLOAT32);
    r.payload = gradient.data();
    std::vector<DataChannel::Request> one;
    one.push_back(std::move(r));
    (*channel)->Submit(std::move(one), absl::StrCat("push ", i));
  }
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

}  // namespace
}  // namespace shardps
