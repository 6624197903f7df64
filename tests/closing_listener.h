// A TCP listener that closes every connection it accepts at once, for tests
// of what a data connection does when its peer ends it in the handshake.
#ifndef SHARDPS_TESTS_CLOSING_LISTENER_H_
#define SHARDPS_TESTS_CLOSING_LISTENER_H_

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace shardps {

// A port whose owner refuses the handshake: counts the connections it closed.
class ClosingListener {
 public:
  ClosingListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd f{fd_, POLLIN, 0};
        if (poll(&f, 1, 20) <= 0) continue;
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        close(c);
        ++accepted_;
      }
    });
  }
  ~ClosingListener() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  std::string address() const { return absl::StrCat("tcp://127.0.0.1:", port_); }
  int accepted() const { return accepted_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace shardps

#endif  // SHARDPS_TESTS_CLOSING_LISTENER_H_
