// The scheduler's gRPC service, its handlers called directly (no server).
#include "scheduler/scheduler_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "scheduler/cluster_state.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

// A loopback port that accepts connections (the scheduler checks that a
// server's data address is reachable), closed when it goes away.
struct Listener {
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    address = absl::StrCat("tcp://127.0.0.1:", ntohs(a.sin_port));
  }
  ~Listener() { close(fd); }
  int fd;
  std::string address;
};

// chaos17: a registration was answered before the state that holds it was
// written. A scheduler restarted from what a full disk left behind knew
// neither a rank's new process, which then failed at its next barrier ("not
// a registered worker"), nor a server that had joined. It is answered once
// written, and a store that stays full fails it, naming the write's error.
TEST(SchedulerServiceTest, ARegistrationIsAnsweredOnlyOnceTheStateThatHoldsItIsWritten) {
  std::atomic<bool> full{true};
  std::atomic<int> writes{0};
  ClusterConfig config;
  config.set_num_servers(1);
  config.set_num_workers(1);
  config.set_rendezvous_timeout_ms(5000);
  auto state = std::make_unique<ClusterState>(config, absl::Now, [&](const SchedulerState&) {
    ++writes;
    return full ? absl::ResourceExhaustedError("/state/scheduler.state: No space left on device")
                : absl::OkStatus();
  });
  auto service = NewSchedulerService(std::move(state), absl::Seconds(1));

  Listener data_port;
  grpc::ServerContext server_call;
  RegisterRequest server;
  server.set_protocol_version(kProtocolVersion);
  server.set_role(SERVER);
  server.set_data_address(data_port.address);
  RegisterResponse answer;
  const absl::Time start = absl::Now();
  const grpc::Status refused = service->Register(&server_call, &server, &answer);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr(absl::StrCat("server 0 at ", data_port.address,
                                                              ": registered, but the scheduler could not write its "
                                                              "state before the deadline")));
  EXPECT_THAT(refused.error_message(), HasSubstr("No space left on device"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the call's own limit (1 s) was not kept";
  EXPECT_GE(writes.load(), 2) << "a failed write was not tried again";

  // The disk freed meanwhile: the worker's registration (and the server's,
  // in the same state) is written, then answered.
  full = false;
  grpc::ServerContext worker_call;
  RegisterRequest worker;
  worker.set_protocol_version(kProtocolVersion);
  worker.set_role(WORKER);
  worker.set_rank(0);
  const grpc::Status registered = service->Register(&worker_call, &worker, &answer);
  EXPECT_TRUE(registered.ok()) << registered.error_message();
}

}  // namespace
}  // namespace shardps
