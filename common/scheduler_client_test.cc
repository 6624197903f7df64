// GrpcSchedulerClient against a real gRPC Scheduler service on loopback.
#include <atomic>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/scheduler_client.h"
#include "proto/cluster.grpc.pb.h"

namespace shardps {
namespace {


// Answers Register UNAVAILABLE "Socket closed" `cut_off` times first: what a
// client sees of a call in flight when the scheduler is SIGKILLed. With
// CANCELLED: of a call that reached a scheduler stopping on SIGTERM before a
// handler took it (gRPC cancels those as it shuts down).
class CutOffScheduler : public Scheduler::Service {
 public:
  explicit CutOffScheduler(int cut_off, grpc::Status cut = grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"))
      : cut_off_(cut_off), cut_(std::move(cut)) {}
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse* response) override {
    if (calls_++ < cut_off_) return cut_;
    response->set_server_index(7);
    return grpc::Status::OK;
  }
  grpc::Status DefineTensors(grpc::ServerContext*, const DefineTensorsRequest*, ShardMap*) override { return cut_; }
  std::atomic<int> calls_{0};
  const int cut_off_;
  const grpc::Status cut_;
};

// A service on a free loopback port, and a client of it (null if none).
struct Served {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<SchedulerClient> client;
};

Served Serve(Scheduler::Service& service) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  Served served{builder.BuildAndStart(), nullptr};
  if (port == 0) return served;
  auto client = SchedulerClient::Create("127.0.0.1:" + std::to_string(port));
  if (client.ok()) served.client = *std::move(client);
  return served;
}

RegisterRequest ServerRegistration() {
  RegisterRequest request;
  request.set_role(SERVER);
  request.set_data_address("tcp://127.0.0.1:1");
  return request;
}

TEST(SchedulerClientTest, ARegistrationTheSchedulersDeathCutOffIsSentAgainWithinItsDeadline) {
  CutOffScheduler service(2);
  Served served = Serve(service);
  ASSERT_NE(served.client, nullptr);
  auto registered = served.client->Register(ServerRegistration(), absl::Seconds(10));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->server_index(), 7u);
  EXPECT_EQ(service.calls_, 3);
  // Past the deadline the error says what cut it off.
  CutOffScheduler always(1000);
  Served served2 = Serve(always);
  ASSERT_NE(served2.client, nullptr);
  auto refused = served2.client->Register(ServerRegistration(), absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("Socket closed"), std::string::npos) << refused.status();
  served.server->Shutdown();
  served2.server->Shutdown();
}

// Seen in tools/rotation_drill.sh: a rank rejoining as the scheduler was
// restarted got CANCELLED from DefineTensors and left the job, where the
// worker asks again while the scheduler is unavailable.
TEST(SchedulerClientTest, ACallTheStoppingSchedulerCancelledIsUnavailableAndARegistrationIsSentAgain) {
  CutOffScheduler service(2, grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED"));
  Served served = Serve(service);
  ASSERT_NE(served.client, nullptr);
  auto registered = served.client->Register(ServerRegistration(), absl::Seconds(10));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(service.calls_, 3);
  absl::Status defined = served.client->DefineTensors(DefineTensorsRequest(), absl::Seconds(10)).status();
  EXPECT_TRUE(absl::IsUnavailable(defined)) << defined;
  EXPECT_NE(defined.message().find("defining tensors: the scheduler stopped before answering"), std::string::npos)
      << defined;
  served.server->Shutdown();
}

}  // namespace
}  // namespace shardps
