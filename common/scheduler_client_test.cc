// GrpcSchedulerClient against a real gRPC Scheduler service on loopback.
#include <atomic>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/scheduler_client.h"
#include "proto/cluster.grpc.pb.h"

namespace shardps {
namespace {

// Answers Register UNAVAILABLE "Socket closed" `cut_off` times first: what a
// client sees of a call in flight when the scheduler is SIGKILLed.
class CutOffScheduler : public Scheduler::Service {
 public:
  explicit CutOffScheduler(int cut_off) : cut_off_(cut_off) {}
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse* response) override {
    if (calls_++ < cut_off_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed");
    response->set_server_index(7);
    return grpc::Status::OK;
  }
  std::atomic<int> calls_{0};
  const int cut_off_;
};

TEST(SchedulerClientTest, ARegistrationTheSchedulersDeathCutOffIsSentAgainWithinItsDeadline) {
  CutOffScheduler service(2);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto client = SchedulerClient::Create("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(client.ok()) << client.status();
  RegisterRequest request;
  request.set_role(SERVER);
  request.set_data_address("tcp://127.0.0.1:1");
  auto registered = (*client)->Register(request, absl::Seconds(10));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->server_index(), 7u);
  EXPECT_EQ(service.calls_, 3);
  // Past the deadline the error says what cut it off.
  CutOffScheduler always(1000);
  grpc::ServerBuilder builder2;
  int port2 = 0;
  builder2.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port2);
  builder2.RegisterService(&always);
  std::unique_ptr<grpc::Server> server2 = builder2.BuildAndStart();
  auto client2 = SchedulerClient::Create("127.0.0.1:" + std::to_string(port2));
  ASSERT_TRUE(client2.ok()) << client2.status();
  auto refused = (*client2)->Register(request, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("Socket closed"), std::string::npos) << refused.status();
  server->Shutdown();
  server2->Shutdown();
}

}  // namespace
}  // namespace shardps
