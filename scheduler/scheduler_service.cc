// gRPC layer of the scheduler: translates calls into ClusterState methods and
// bounds every blocking call by the caller's deadline (answering a little
// before it, so the caller gets our explanation rather than a bare timeout).
#include <atomic>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "proto/cluster.grpc.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler.h"

namespace shardps {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

class SchedulerService final : public Scheduler::Service {
 public:
  explicit SchedulerService(ClusterConfig config) : state_(std::move(config)) {}

  void Stop() { stopping_.store(true); }

  grpc::Status Register(grpc::ServerContext* ctx, const RegisterRequest* req, RegisterResponse* resp) override {
    absl::StatusOr<RegisterResponse> r;
    if (req->role() == SERVER) {
      r = state_.RegisterServer(*req);
      if (r.ok()) LOG(INFO) << "server " << r->server_index() << " registered at " << req->data_address();
    } else if (req->role() == WORKER) {
      r = state_.RegisterWorker(*req);
      if (r.ok()) {
        LOG(INFO) << "worker rank " << req->rank() << " registered from " << req->host();
        absl::Time limit = absl::Now() + absl::Milliseconds(state_.config().rendezvous_timeout_ms());
        absl::Status s = state_.WaitForCluster(std::min(limit, Deadline(ctx)));
        if (!s.ok()) r = s;
      }
    } else {
      r = absl::InvalidArgumentError("register: role must be server or worker");
    }
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* req, HeartbeatResponse* resp) override {
    auto r = state_.Heartbeat(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *r;
    return grpc::Status::OK;
  }

  grpc::Status DefineTensors(grpc::ServerContext* ctx, const DefineTensorsRequest* req, ShardMap* resp) override {
    std::vector<TensorSpec> tensors(req->tensors().begin(), req->tensors().end());
    auto r = state_.DefineTensors(tensors, Deadline(ctx));
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status WatchShardMap(grpc::ServerContext* ctx, const WatchShardMapRequest* req,
                             grpc::ServerWriter<ShardMap>* writer) override {
    uint64_t known = req->known_epoch();
    while (!ctx->IsCancelled() && !stopping_.load()) {
      std::optional<ShardMap> map = state_.WaitForMap(known, absl::Now() + absl::Milliseconds(200));
      if (!map) continue;
      if (!writer->Write(*map)) break;
      known = map->epoch();
    }
    return stopping_.load() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler shutting down")
                            : grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const BarrierRequest* req, BarrierResponse*) override {
    return ToGrpc(state_.Barrier(req->node_id(), req->name(), Deadline(ctx)));
  }

  grpc::Status Status(grpc::ServerContext*, const StatusRequest*, StatusResponse* resp) override {
    *resp = state_.Status();
    return grpc::Status::OK;
  }

 private:
  // The caller's deadline less a margin for the answer to travel back.
  static absl::Time Deadline(grpc::ServerContext* ctx) {
    absl::Time d = absl::FromChrono(ctx->deadline());
    if (d == absl::InfiniteFuture()) return absl::Now() + absl::Hours(24);
    return d - absl::Milliseconds(200);
  }

  ClusterState state_;
  std::atomic<bool> stopping_{false};
};

class GrpcSchedulerDaemon : public SchedulerDaemon {
 public:
  GrpcSchedulerDaemon(std::unique_ptr<SchedulerService> service, std::unique_ptr<grpc::Server> server,
                      std::string address)
      : service_(std::move(service)), server_(std::move(server)), address_(std::move(address)) {}
  ~GrpcSchedulerDaemon() override { Shutdown(); }

  std::string address() const override { return address_; }
  void Wait() override { server_->Wait(); }
  void Shutdown() override {
    if (shut_down_.exchange(true)) return;
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

 private:
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerDaemon>> SchedulerDaemon::Create(const SchedulerOptions& options) {
  if (absl::Status s = ValidateConfig(options.config); !s.ok()) return s;
  auto service = std::make_unique<SchedulerService>(options.config);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("scheduler cannot listen on ", options.listen_address));
  }
  std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  return std::unique_ptr<SchedulerDaemon>(
      new GrpcSchedulerDaemon(std::move(service), std::move(server), absl::StrCat(host, ":", port)));
}

}  // namespace shardps
