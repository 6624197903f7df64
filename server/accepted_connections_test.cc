#include "server/accepted_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_message.h"

namespace shardps {
namespace {

using Clock = AcceptedConnections::Clock;

// A ROUTER on 127.0.0.1 watched by AcceptedConnections, and raw TCP
// connections to it from other loopback addresses.
class AcceptedConnectionsTest : public ::testing::Test {
 protected:
  void Watch(AcceptedConnections::Limits limits) {
    auto made = AcceptedConnections::Create(context_, router_, limits, "test server");
    ASSERT_TRUE(made.ok()) << made.status();
    connections_ = *std::move(made);
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    const std::string endpoint = router_.get(zmq::sockopt::last_endpoint);
    port_ = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  }

  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
    if (connections_) connections_->Stop();
  }

  // A connection from `source` that sends nothing; its index in fds_.
  size_t Connect(const char* source) {
    sockaddr_in from{}, to{};
    from.sin_family = to.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons(port_);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    fds_.push_back(fd);
    return fds_.size() - 1;
  }

  // Runs Update (at `now`, or the clock's) for `wait`, as the engine thread
  // does; returns the closes it reported, summed.
  AcceptedConnections::Closed Run(absl::Duration wait, std::optional<Clock::time_point> now = std::nullopt) {
    AcceptedConnections::Closed total;
    const absl::Time end = absl::Now() + wait;
    while (absl::Now() < end) {
      const AcceptedConnections::Closed c = connections_->Update(now.value_or(Clock::now()));
      total.over_address_limit += c.over_address_limit;
      total.no_message_in_time += c.no_message_in_time;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return total;
  }

  // Whether the server closed fds_[i] (the read finds the end; its ZeroMQ
  // greeting, if any, is read past).
  bool ClosedByServer(size_t i) {
    char buf[256];
    pollfd p{.fd = fds_[i], .events = POLLIN, .revents = 0};
    while (poll(&p, 1, 0) > 0) {
      const ssize_t n = read(fds_[i], buf, sizeof(buf));
      if (n <= 0) return true;
    }
    return false;
  }

  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::unique_ptr<AcceptedConnections> connections_;
  int port_ = 0;
  std::vector<int> fds_;
};

TEST_F(AcceptedConnectionsTest, ConnectionsPastTheLimitOfTheirAddressAreClosedThoseOfOthersAreNot) {
  Watch({.max_per_address = 3, .proof_deadline = std::chrono::hours(1)});
  for (int i = 0; i < 5; ++i) Connect("127.0.0.2");
  for (int i = 0; i < 2; ++i) Connect("127.0.0.3");
  const AcceptedConnections::Closed closed = Run(absl::Milliseconds(500));
  EXPECT_EQ(closed.over_address_limit, 2u);
  EXPECT_EQ(closed.no_message_in_time, 0u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(ClosedByServer(i)) << "one of the first 3 from 127.0.0.2: " << i;
  for (size_t i = 3; i < 5; ++i) EXPECT_TRUE(ClosedByServer(i)) << "past the limit: " << i;
  for (size_t i = 5; i < 7; ++i) EXPECT_FALSE(ClosedByServer(i)) << "from 127.0.0.3: " << i;
}

TEST_F(AcceptedConnectionsTest, AConnectionThatEndsFreesItsPlace) {
  Watch({.max_per_address = 2, .proof_deadline = std::chrono::hours(1)});
  Connect("127.0.0.2");
  Connect("127.0.0.2");
  EXPECT_EQ(Run(absl::Milliseconds(200)).over_address_limit, 0u);
  close(fds_[0]);
  fds_[0] = -1;
  (void)Run(absl::Milliseconds(200));  // its end reaches libzmq, then the monitor
  const size_t third = Connect("127.0.0.2");
  EXPECT_EQ(Run(absl::Milliseconds(300)).over_address_limit, 0u);
  EXPECT_FALSE(ClosedByServer(third));
}

TEST_F(AcceptedConnectionsTest, PastTheirDeadlineIdleConnectionsBeyondTheAllowanceAreClosedOldestFirst) {
  // A job's own nodes with nothing to send (within the allowance) keep their
  // connections; a flood beyond it loses its oldest.
  Watch({.max_per_address = 64, .proof_deadline = std::chrono::seconds(30), .max_idle = 2});
  std::vector<size_t> idle;
  for (int i = 0; i < 2; ++i) idle.push_back(Connect("127.0.0.2"));
  EXPECT_EQ(Run(absl::Milliseconds(300)).no_message_in_time, 0u);  // taken in
  EXPECT_EQ(Run(absl::Milliseconds(300), Clock::now() + std::chrono::seconds(31)).no_message_in_time, 0u);
  EXPECT_FALSE(ClosedByServer(idle[0]) || ClosedByServer(idle[1])) << "closed within the allowance";
  for (int i = 0; i < 3; ++i) idle.push_back(Connect("127.0.0.3"));
  EXPECT_EQ(Run(absl::Milliseconds(300)).no_message_in_time, 0u);
  EXPECT_EQ(Run(absl::Milliseconds(300), Clock::now() + std::chrono::seconds(31)).no_message_in_time, 3u);
  EXPECT_TRUE(ClosedByServer(idle[0]) && ClosedByServer(idle[1]) && ClosedByServer(idle[2]));
  EXPECT_FALSE(ClosedByServer(idle[3]) || ClosedByServer(idle[4]));
}

TEST_F(AcceptedConnectionsTest, OnlyAConnectionThatCarriedNoValidMessageIsClosedAtItsDeadline) {
  Watch({.max_per_address = 64, .proof_deadline = std::chrono::seconds(30), .max_idle = 0});
  const size_t idle = Connect("127.0.0.2");
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::reconnect_ivl, -1);
  auto watched = WatchConnections(context_, dealer, "inproc://dealer", ZMQ_EVENT_DISCONNECTED);
  ASSERT_TRUE(watched.ok()) << watched.status();
  dealer.connect(absl::StrCat("tcp://127.0.0.1:", port_));
  dealer.send(zmq::str_buffer("a request"), zmq::send_flags::none);
  std::vector<zmq::message_t> frames(2);
  router_.set(zmq::sockopt::rcvtimeo, 5000);
  ASSERT_TRUE(router_.recv(frames[0]));  // routing id
  ASSERT_TRUE(router_.recv(frames[1]));
  connections_->Proven(frames[1]);
  // Before the deadline nothing; past it (a clock 31 s ahead) the idle one.
  EXPECT_EQ(Run(absl::Milliseconds(200)).no_message_in_time, 0u);
  EXPECT_EQ(Run(absl::Milliseconds(300), Clock::now() + std::chrono::seconds(31)).no_message_in_time, 1u);
  EXPECT_TRUE(ClosedByServer(idle));
  EXPECT_TRUE(TakeConnectionEvents(*watched).empty()) << "the connection that carried a message was closed";
  (void)zmq_socket_monitor(dealer.handle(), nullptr, 0);
}

}  // namespace
}  // namespace shardps
