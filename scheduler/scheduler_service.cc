// gRPC layer of the scheduler: translates calls into ClusterState methods and
// bounds every blocking call by the caller's deadline (answering a little
// before it, so the caller gets our explanation rather than a bare timeout).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include <glog/logging.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/durable_file.h"
#include "common/endpoint.h"
#include "common/names.h"
#include "common/scheduler_refusal.h"
#include "proto/cluster.grpc.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/etcd_election.h"
#include "scheduler/etcd_scheduler_role.h"
#include "scheduler/state_record.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/scheduler_credentials.h"

namespace shardps {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string StateFile(const std::string& dir) { return dir + "/scheduler.state"; }

// Writes the state to `dir` after every change.
ClusterState::Persist StateWriter(const std::string& dir) {
  if (dir.empty()) return nullptr;
  return SealedStateWriter([path = StateFile(dir)](const std::string& sealed) { return WriteFileDurably(path, sealed); });
}

// Holds `dir`/LOCK for the life of the process (the kernel releases it when
// the process dies, SIGKILL included), so two schedulers never share a state.
absl::StatusOr<int> LockStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--state-dir ", dir, ": ", ec.message()));
  const std::string path = dir + "/LOCK";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("--state-dir ", dir, " is in use by another scheduler (", path,
                                                      " is locked)"));
  }
  return fd;
}

// The state persisted in `dir`; nullopt when there is none yet.
absl::StatusOr<std::optional<SchedulerState>> LoadState(const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  const std::string path = StateFile(dir);
  auto data = ReadWholeFile(path);
  if (absl::IsNotFound(data.status())) return std::nullopt;
  if (!data.ok()) return data.status();
  return ParseStateRecord(*data, path);
}

// A server's data address must be tcp://host:port with a host that
// resolves here and a port that accepts connections (a server binds before
// it registers), so addresses no worker could reach do not take the slots.
absl::Status CheckDataAddress(const std::string& address) {
  if (absl::Status s = CheckName("server data address", address); !s.ok()) return s;
  auto endpoint = ParseTcpEndpoint(address, "server data address");
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = CheckResolvable(endpoint->host, "server data address"); !s.ok()) return s;
  absl::Status reachable = CheckReachable(*endpoint, absl::Seconds(1), "server data address");
  if (reachable.ok()) return reachable;
  if (reachable.code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(absl::StrCat("the scheduler is out of file descriptors (raise its RLIMIT_NOFILE: "
                                                     "ulimit -n, LimitNOFILE=): ", reachable.message()));
  }
  // Not UNAVAILABLE: the scheduler answered, and a node reads that code as
  // "cannot reach the scheduler" (and a failover client tries the next one).
  return absl::FailedPreconditionError(absl::StrCat(
      reachable.message(), " (seen from the scheduler; does --advertise-host name this host as others reach it?)"));
}

// Calls that wait (rendezvous, tensor definition, barriers, map watches) each
// hold one of gRPC's sync-server threads while they wait. What one cluster
// needs is a few per node; more are refused at once, so callers that never
// complete cannot make the scheduler grow a thread each, and heartbeats and
// status always find a thread. `servers`: the server indices handed out, more
// than the config's in a cluster grown by joins (before 2026-11-25 only the
// config counted, and there the servers that joined last were refused their
// registration or map watch).
uint32_t MaxWaitingCalls(const ClusterConfig& c, uint32_t servers) {
  return 4 * (std::max(c.num_servers(), servers) + c.num_workers()) + 64;
}
// Backstop for the waiting-call limit: gRPC never runs more threads than the
// calls one cluster needs plus room for heartbeats and status.
int MaxThreads(uint32_t max_waiting_calls) { return static_cast<int>(max_waiting_calls) + 64; }

// Serves the cluster state once active; before (a standby scheduler) and
// after (one deposed from its etcd leadership) it answers every call
// UNAVAILABLE with the reason Refuse() gave, so nodes try the next address.
class SchedulerService final : public Scheduler::Service {
 public:
  // Active at once.
  SchedulerService(std::unique_ptr<ClusterState> state, absl::Duration max_wait)
      : SchedulerService(state->config(), max_wait, "") {
    Activate(std::move(state));
  }
  // A standby for `config`, refusing calls with `why` until Activate.
  SchedulerService(const ClusterConfig& config, absl::Duration max_wait, std::string why)
      : config_(config), max_wait_(max_wait), thread_limit_(MaxWaitingCalls(config, 0)), refusal_(std::move(why)) {
    quota_.SetMaxThreads(MaxThreads(thread_limit_));
  }
  ~SchedulerService() override { Stop(); }

  // The gRPC server's thread limit, raised as the cluster grows.
  grpc::ResourceQuota& quota() { return quota_; }

  // Serves `state` from now on and judges liveness. Called at most once.
  void Activate(std::unique_ptr<ClusterState> state) {
    absl::MutexLock lock(&stop_mu_);
    if (stopping_.load()) return;
    state_owner_ = std::move(state);
    active_.store(state_owner_.get());
    liveness_ = std::thread([this, s = state_owner_.get()] { LivenessLoop(*s); });
  }
  // Refuses every call with `why` from now on (calls already inside finish).
  void Refuse(std::string why) {
    absl::MutexLock lock(&refusal_mu_);
    refusal_ = std::move(why);
    active_.store(nullptr);
  }

  void Stop() {
    {
      absl::MutexLock lock(&stop_mu_);
      stopping_.store(true);
    }
    if (liveness_.joinable()) liveness_.join();
  }

  grpc::Status Register(grpc::ServerContext* ctx, const RegisterRequest* req, RegisterResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    WaitingCall waiting(this, *state);
    if (!waiting.admitted()) return waiting.Refusal("Register");
    absl::StatusOr<RegisterResponse> r;
    // A registration is answered once the state that holds it is written:
    // before 2026-11-26 it was answered at once, and a scheduler restarted
    // from what a full disk left behind knew neither a rank's new process
    // (which failed at its next barrier) nor a server that had joined.
    if (req->role() == SERVER) {
      if (absl::Status s = CheckDataAddress(req->data_address()); !s.ok()) {
        r = s;
      } else {
        r = state->RegisterServer(*req);
      }
      if (r.ok()) {
        LOG(INFO) << "server " << r->server_index() << " registered at " << req->data_address();
        const std::string what = absl::StrCat("server ", r->server_index(), " at ", req->data_address(), ": registered");
        if (absl::Status s = state->Written(Deadline(ctx), what); !s.ok()) r = s;
      }
    } else if (req->role() == WORKER) {
      r = state->RegisterWorker(*req);
      if (r.ok()) {
        LOG(INFO) << "worker rank " << req->rank() << " registered from " << req->host();
        const absl::Time deadline =
            std::min(absl::Now() + absl::Milliseconds(config_.rendezvous_timeout_ms()), Deadline(ctx));
        absl::Status s = state->WaitForCluster(deadline, r->node_id(), [ctx] { return ctx->IsCancelled(); });
        if (s.ok()) s = state->Written(deadline, absl::StrCat("worker rank ", req->rank(), ": registered"));
        if (!s.ok()) r = s;
      }
    } else {
      r = absl::InvalidArgumentError("register: role must be server or worker");
    }
    // Its write refused for a lost leadership (deposed as it returned): the
    // successor never heard of this node, which asks it on this refusal.
    if (Serving(&refused) != state) return refused;
    if (!r.ok()) {
      // A new process for a rank still held asks again every quarter second
      // until the old one is declared dead: said once in a while, not each time.
      // Nor a rejoin's call ended to be asked again (every few seconds while it waits): not a failure.
      if (IsRejoinAskAgainRefusal(r.status().message())) return ToGrpc(r.status());
      if (!IsRankStillHeldRefusal(r.status().message()) || still_held_refusals_.fetch_add(1) % 40 == 0) {
        // The peer as gRPC saw it: host and address are what the caller says.
        LOG(WARNING) << "scheduler: Register failed (" << (req->role() == SERVER ? "server at " : "worker from ")
                     << ToUtf8(req->role() == SERVER ? req->data_address() : req->host(), 256) << ", peer "
                     << ctx->peer() << "): " << r.status();
      }
      return ToGrpc(r.status());
    }
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* req, HeartbeatResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    auto r = state->Heartbeat(*req);
    // Its write deposed this scheduler (a leave, a finished move): the
    // successor never heard of it, and the node tells it on this refusal
    // (before 2026-11-25 a leave was answered OK and the node stopped).
    if (Serving(&refused) != state) return refused;
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *r;
    return grpc::Status::OK;
  }

  grpc::Status DefineTensors(grpc::ServerContext* ctx, const DefineTensorsRequest* req, ShardMap* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    WaitingCall waiting(this, *state);
    if (!waiting.admitted()) return waiting.Refusal("DefineTensors");
    std::vector<TensorSpec> tensors(req->tensors().begin(), req->tensors().end());
    auto r = state->DefineTensors(tensors, Deadline(ctx));
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status WatchShardMap(grpc::ServerContext* ctx, const WatchShardMapRequest* req,
                             grpc::ServerWriter<ShardMap>* writer) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    WaitingCall waiting(this, *state);
    if (!waiting.admitted()) return waiting.Refusal("WatchShardMap");
    // Ended by the node's side (cancelled): its connection closed, which
    // CheckLiveness takes as this scheduler still reaching its host.
    state->WatchOpened(req->node_id());
    absl::Cleanup ended = [state, ctx, id = req->node_id()] { state->WatchEnded(id, ctx->IsCancelled()); };
    uint64_t known = req->known_epoch();
    while (!ctx->IsCancelled() && !stopping_.load()) {
      std::optional<ShardMap> map = state->WaitForMap(known, absl::Now() + absl::Milliseconds(200));
      // Deposed, the watcher moves on; looked at after the wait too: a write
      // refused for a lost leadership deposes as it returns, and the map it
      // could not write must not go out (the successor may issue that epoch
      // with other contents).
      if (Serving(&refused) != state) return refused;
      if (!map) continue;
      if (!writer->Write(*map)) break;
      known = map->epoch();
    }
    return stopping_.load() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler shutting down")
                            : grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const BarrierRequest* req, BarrierResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    WaitingCall waiting(this, *state);
    if (!waiting.admitted()) return waiting.Refusal("Barrier");
    std::vector<uint32_t> live;
    absl::Status s = state->Barrier(req->node_id(), req->name(), Deadline(ctx), &live,
                                    req->has_passes_seen() ? std::optional<uint64_t>(req->passes_seen()) : std::nullopt);
    // A pass whose write deposed this scheduler: its successor never heard
    // of it, and the ranks enter the barrier there on this refusal.
    if (Serving(&refused) != state) return refused;
    for (uint32_t r : live) resp->add_live_workers(r);
    return ToGrpc(s);
  }

  // The served state's status; a standby's holds only the config.
  StatusResponse Snapshot() {
    ClusterState* state = active_.load();
    if (state != nullptr) return state->Status();
    StatusResponse status;
    *status.mutable_config() = config_;
    return status;
  }
  // The served state's count (ClusterState::NodesDeclaredDead); 0 for a standby.
  uint64_t NodesDeclaredDead() {
    ClusterState* state = active_.load();
    return state != nullptr ? state->NodesDeclaredDead() : 0;
  }

  grpc::Status Status(grpc::ServerContext*, const StatusRequest*, StatusResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    *resp = state->Status();
    return grpc::Status::OK;
  }

  grpc::Status RequestCheckpoint(grpc::ServerContext* ctx, const CheckpointRequest* req,
                                 CheckpointResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    auto r = state->RequestCheckpoint(req->dir());
    // Its write deposed this scheduler: no server will be asked (the map
    // that asks goes to no watcher), and the successor knows of no request.
    if (Serving(&refused) != state) return refused;
    if (!r.ok()) {
      LOG(WARNING) << "scheduler: checkpoint into " << ToUtf8(req->dir(), 256) << " refused (peer " << ctx->peer()
                   << "): " << r.status();
      return ToGrpc(r.status());
    }
    LOG(INFO) << "checkpoint of round " << r->round() << " into " << r->dir() << " requested";
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const DrainRequest* req, DrainResponse* resp) override {
    grpc::Status refused;
    ClusterState* state = Serving(&refused);
    if (state == nullptr) return refused;
    auto r = req->cancel() ? state->CancelDrain(req->server()) : state->Drain(req->server());
    // Its write deposed this scheduler: no server is sent the map, and the
    // successor never heard of the drain (or its cancel).
    if (Serving(&refused) != state) return refused;
    if (!r.ok()) {
      // Said to the caller, and here: a drain moves every copy of a server.
      LOG(WARNING) << "scheduler: " << (req->cancel() ? "cancelling the drain of" : "drain of") << " server "
                   << req->server() << " refused (peer " << ctx->peer() << "): " << r.status();
      return ToGrpc(r.status());
    }
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  // Declares silent nodes dead, a few times per heartbeat timeout.
  void LivenessLoop(ClusterState& state) {
    const absl::Duration period =
        std::min(absl::Milliseconds(250), absl::Milliseconds(config_.heartbeat_timeout_ms()) / 4);
    absl::MutexLock lock(&stop_mu_);
    auto stopping = [this] { return stopping_.load(); };
    while (!stop_mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) {
      if (active_.load() != &state) continue;  // deposed: declares no one dead
      for (const std::string& line : state.CheckLiveness()) LOG(WARNING) << "scheduler: " << line;
    }
  }

  // The state served, or nullptr with `*refusal` set.
  ClusterState* Serving(grpc::Status* refusal) {
    ClusterState* state = active_.load();
    if (state == nullptr) {
      absl::MutexLock lock(&refusal_mu_);
      *refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, refusal_);
    }
    return state;
  }

  // The caller's deadline less a margin for the answer to travel back, and
  // at most max_wait_ from now.
  absl::Time Deadline(grpc::ServerContext* ctx) const {
    const absl::Time limit = absl::Now() + max_wait_;
    absl::Time d = absl::FromChrono(ctx->deadline());
    if (d == absl::InfiniteFuture()) return limit;
    return std::min(limit, d - absl::Milliseconds(200));
  }

  // The waiting calls `state`'s cluster needs (MaxWaitingCalls), with the
  // thread limit raised to match.
  uint32_t MaxWaiting(ClusterState& state) {
    const uint32_t max = MaxWaitingCalls(config_, state.ServerIndices());
    if (max > thread_limit_.load()) {
      absl::MutexLock lock(&quota_mu_);
      if (max > thread_limit_.load()) {
        quota_.SetMaxThreads(MaxThreads(max));
        thread_limit_.store(max);
      }
    }
    return max;
  }

  // Counts one call that may wait; admitted() is false beyond MaxWaiting.
  class WaitingCall {
   public:
    WaitingCall(SchedulerService* service, ClusterState& state)
        : service_(service), count_(service->waiting_.fetch_add(1) + 1), max_(service->MaxWaiting(state)) {}
    ~WaitingCall() { service_->waiting_.fetch_sub(1); }
    bool admitted() const { return count_ <= max_; }
    grpc::Status Refusal(const char* call) const {
      LOG_EVERY_N(WARNING, 100) << "scheduler: refused " << call << ": " << max_ << " calls already waiting ["
                                << google::COUNTER << " refused so far]";
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("scheduler: ", max_, " calls already wait (rendezvous, ",
                                       "tensor definition, barriers, map watches); refusing ", call));
    }

   private:
    SchedulerService* service_;
    const uint32_t count_;
    const uint32_t max_;
  };

  const ClusterConfig config_;
  // Set once by Activate and kept to the end: calls that found it active
  // may still use it after Refuse.
  std::unique_ptr<ClusterState> state_owner_;
  std::atomic<ClusterState*> active_{nullptr};  // nullptr: refusing
  const absl::Duration max_wait_;
  std::atomic<uint32_t> waiting_{0};
  // The MaxWaitingCalls the thread limit of quota_ was set for.
  std::atomic<uint32_t> thread_limit_;
  absl::Mutex quota_mu_;  // one raise at a time
  grpc::ResourceQuota quota_{"shardps-scheduler"};
  std::atomic<uint64_t> still_held_refusals_{0};  // Register: see IsRankStillHeldRefusal
  absl::Mutex stop_mu_;
  std::atomic<bool> stopping_{false};
  std::thread liveness_;
  absl::Mutex refusal_mu_;
  std::string refusal_ ABSL_GUARDED_BY(refusal_mu_);
};

class GrpcSchedulerDaemon : public SchedulerDaemon {
 public:
  GrpcSchedulerDaemon(std::unique_ptr<SchedulerService> service, std::unique_ptr<grpc::Server> server,
                      std::string address, int state_lock)
      : service_(std::move(service)), server_(std::move(server)), address_(std::move(address)),
        state_lock_(state_lock) {}
  ~GrpcSchedulerDaemon() override {
    Shutdown();
    if (state_lock_ >= 0) close(state_lock_);
  }

  std::string address() const override { return address_; }
  void Wait() override { server_->Wait(); }
  StatusResponse Status() override { return service_->Snapshot(); }
  uint64_t NodesDeclaredDead() override { return service_->NodesDeclaredDead(); }
  void Shutdown() override {
    absl::MutexLock shutting_down(&shutdown_mu_);  // a concurrent Shutdown waits for this one
    EtcdSchedulerRole* role = nullptr;
    {
      absl::MutexLock lock(&role_mu_);
      role = role_.get();  // only Shutdown takes it away
    }
    // Not under role_mu_: Failure() stays answerable while the role stops.
    if (role != nullptr) role->Stop();
    StopServing();
    std::unique_ptr<EtcdSchedulerRole> gone;
    {
      absl::MutexLock lock(&role_mu_);
      if (role_ != nullptr) failure_ = role_->failure();
      gone = std::move(role_);
    }
    gone.reset();  // hands back the lease: a standby takes over at once
  }
  absl::Status Failure() override {
    absl::MutexLock lock(&role_mu_);
    return role_ != nullptr ? role_->failure() : failure_;
  }

  // With --etcd: the service is a standby until `election` is won.
  absl::Status StartElection(std::unique_ptr<EtcdElection> election, const ClusterConfig& config) {
    auto role = EtcdSchedulerRole::Start(
        std::move(election), config, address_,
        {.activate = [this](std::unique_ptr<ClusterState> state) { service_->Activate(std::move(state)); },
         .refuse = [this](std::string why) { service_->Refuse(std::move(why)); },
         .stop_serving = [this] { StopServing(); }});
    if (!role.ok()) return role.status();
    absl::MutexLock lock(&role_mu_);
    role_ = *std::move(role);
    return absl::OkStatus();
  }

 private:
  void StopServing() {
    if (shut_down_.exchange(true)) return;
    if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  const int state_lock_;  // fd holding the --state-dir lock, or -1
  std::atomic<bool> shut_down_{false};
  // One Shutdown at a time: the first stops the role, later ones find it gone.
  absl::Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(role_mu_);
  // --etcd only. Set by StartElection (before the daemon is handed out),
  // taken away by Shutdown.
  absl::Mutex role_mu_;
  std::unique_ptr<EtcdSchedulerRole> role_ ABSL_GUARDED_BY(role_mu_);
  absl::Status failure_ ABSL_GUARDED_BY(role_mu_);  // the role's, once it is gone
};

}  // namespace

std::unique_ptr<Scheduler::Service> NewSchedulerService(std::unique_ptr<ClusterState> state,
                                                        absl::Duration max_wait) {
  return std::make_unique<SchedulerService>(std::move(state), max_wait);
}

std::unique_ptr<Scheduler::Service> NewStandbySchedulerService(const ClusterConfig& config,
                                                               const std::string& address) {
  return std::make_unique<SchedulerService>(config, absl::Hours(24), StandbyRefusal(address, ""));
}

namespace {

// The service over the state saved in options.state_dir (or a new state).
absl::StatusOr<std::unique_ptr<SchedulerService>> FileBackedService(const SchedulerOptions& options) {
  auto saved = LoadState(options.state_dir);
  if (!saved.ok()) return saved.status();
  auto state = ResumeOrCreateState(*saved, options.config,
                                   {.where = options.state_dir.empty() ? "" : StateFile(options.state_dir),
                                    .elsewhere = "another state directory",
                                    .who = "scheduler"},
                                   StateWriter(options.state_dir));
  if (!state.ok()) return state.status();
  return std::make_unique<SchedulerService>(*std::move(state), absl::Hours(24));
}

// "/shardps/" and a digest of the config: schedulers started with the same
// config share a prefix.
std::string DefaultEtcdPrefix(const ClusterConfig& config) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    config.SerializeToCodedStream(&coded);
  }
  return absl::StrCat("/shardps/", absl::Hex(Fnv1a64(bytes), absl::kZeroPad16));
}

std::unique_ptr<grpc::Server> StartServer(const SchedulerOptions& options,
                                          std::shared_ptr<grpc::ServerCredentials> credentials,
                                          SchedulerService* service, int* port) {
  // grpc.health.v1 (Kubernetes grpc probes, grpc_health_probe): SERVING while up.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, port);
  // gRPC binds with SO_REUSEPORT by default: a second scheduler started on a
  // port in use would share it, each taking some of the nodes' connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service);
  builder.SetResourceQuota(service->quota());
  // Clients ping every 2 s to notice dead connections (common/scheduler_client.cc).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
  return builder.BuildAndStart();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerDaemon>> SchedulerDaemon::Create(const SchedulerOptions& given) {
  SchedulerOptions options = given;
  options.config.clear_security();  // secrets stay with the scheduler
  options.config.clear_job_id();    // a new job's, or the saved state's (ClusterState)
  if (absl::Status s = ValidateConfig(options.config); !s.ok()) return s;
  // CheckLiveness counts a node as heard within the timeout less two
  // intervals, and never less than half the timeout: below three intervals
  // a healthy node's last heartbeat may fall outside that (a majority of
  // healthy nodes can look silent, and a death go undeclared), and one late
  // heartbeat is taken for a death.
  if (options.config.heartbeat_timeout_ms() < 3 * options.config.heartbeat_interval_ms()) {
    LOG(WARNING) << "scheduler: heartbeat_timeout_ms " << options.config.heartbeat_timeout_ms()
                 << " is less than three heartbeat intervals (heartbeat_interval_ms "
                 << options.config.heartbeat_interval_ms() << "): a late heartbeat is taken for a death, and healthy "
                 << "nodes may not count as heard; give it at least three intervals";
  }
  auto listen = ParseHostPort(options.listen_address, "scheduler listen address",
                              {.allow_port_zero = true, .allow_wildcard = true});
  if (!listen.ok()) return listen.status();
  const bool etcd = !options.etcd_endpoints.empty();
  if (etcd && !options.state_dir.empty()) {
    return absl::InvalidArgumentError("--etcd and --state-dir exclude each other: the state lives in one of them");
  }
  if (!etcd && !options.etcd_prefix.empty()) return absl::InvalidArgumentError("--etcd-prefix needs --etcd");
  if (!etcd && !options.etcd_tls.empty()) {
    return absl::InvalidArgumentError("--etcd-ca, --etcd-cert and --etcd-key need --etcd https://...");
  }
  auto credentials = SchedulerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  int lock = -1;
  if (!options.state_dir.empty()) {
    auto locked = LockStateDir(options.state_dir);
    if (!locked.ok()) return locked.status();
    lock = *locked;
  }
  auto unlock_on_error = [lock](absl::Status s) {
    if (lock >= 0) close(lock);
    return s;
  };
  // A standby until its first campaign, which names the bound address.
  absl::StatusOr<std::unique_ptr<SchedulerService>> service =
      etcd ? std::make_unique<SchedulerService>(options.config, absl::Hours(24),
                                                StandbyRefusal(options.listen_address, ""))
           : FileBackedService(options);
  if (!service.ok()) return unlock_on_error(service.status());
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartServer(options, *credentials, service->get(), &port);
  if (server == nullptr || port == 0) {
    return unlock_on_error(absl::UnavailableError(absl::StrCat(
        "scheduler cannot listen on ", options.listen_address,
        ": is the port in use (another scheduler?), or the host not one of this machine's addresses?")));
  }
  std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  const std::string address = absl::StrCat(host, ":", port);
  if (etcd) (*service)->Refuse(StandbyRefusal(address, ""));
  auto daemon = std::make_unique<GrpcSchedulerDaemon>(*std::move(service), std::move(server), address, lock);
  if (!etcd) return std::unique_ptr<SchedulerDaemon>(std::move(daemon));
  auto election = EtcdElection::Create(
      {.endpoints = options.etcd_endpoints,
       .tls = options.etcd_tls,
       .prefix = options.etcd_prefix.empty() ? DefaultEtcdPrefix(options.config) : options.etcd_prefix,
       .address = options.advertise_address.empty() ? address : options.advertise_address,
       .ttl = absl::Milliseconds(options.config.heartbeat_timeout_ms())});
  if (!election.ok()) return election.status();
  if (absl::Status s = daemon->StartElection(*std::move(election), options.config); !s.ok()) return s;
  return std::unique_ptr<SchedulerDaemon>(std::move(daemon));
}

}  // namespace shardps
