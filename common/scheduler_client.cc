#include "common/scheduler_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "common/endpoint.h"
#include "common/failover_scheduler_client.h"
#include "common/scheduler_refusal.h"
#include "common/status_macros.h"
#include "proto/cluster.grpc.pb.h"

namespace shardps {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& address, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  std::string detail = s.error_message();
  // This client never cancels a unary call (nor reports the watch it
  // cancelled): CANCELLED is gRPC's answer to a call that reached a scheduler
  // shutting down before a handler took it (SIGTERM, a restart). Callers ask
  // a restarting scheduler again on UNAVAILABLE, so it reads as one.
  if (s.error_code() == grpc::StatusCode::CANCELLED) {
    code = absl::StatusCode::kUnavailable;
    detail = absl::StrCat("the scheduler stopped before answering (", detail, ")");
  } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE && !IsSchedulerRefusal(detail)) {
    // A standby (or a deposed scheduler) answers UNAVAILABLE itself, saying so.
    detail = absl::StrCat("cannot reach the scheduler (", detail, ")");
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && detail == "Deadline Exceeded") {
    detail = "no answer before the deadline";
  }
  // The scheduler's own refusal may already say what it refuses ("barrier
  // 'init': ..."): before 2026-11-26 every barrier error said it twice (chaos17).
  const std::string context = absl::StrCat(what, ": ");
  return absl::Status(code, absl::StrCat("scheduler ", address, ": ", absl::StartsWith(detail, context) ? "" : context,
                                         detail));
}

// The metadata key of the cluster token (common/security.h).
constexpr char kTokenKey[] = "authorization";

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const SecurityCredentials& security,
                                                             grpc::ChannelArguments& args) {
  if (!security.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = security.ca_pem;
  tls.pem_private_key = security.key_pem;
  tls.pem_cert_chain = security.cert_pem;
  // Without an override the certificate must name the address's host (a DNS
  // name or an IP address; `shardps certs --hosts`).
  if (!security.server_name.empty()) args.SetSslTargetNameOverride(security.server_name);
  return grpc::SslCredentials(tls);
}

class GrpcSchedulerClient : public SchedulerClient {
 public:
  static constexpr absl::Duration kRegisterRetry = absl::Milliseconds(200);

  // `wait_for_ready`: calls that may wait for a restarting scheduler do, up
  // to their deadline; off, every call fails at once (UNAVAILABLE) while the
  // scheduler cannot be reached, so a FailoverSchedulerClient moves on.
  GrpcSchedulerClient(const std::string& address, const SecurityCredentials& security, bool wait_for_ready)
      : SchedulerClient(address), token_(security.enabled && !security.token.empty() ? "Bearer " + security.token : ""),
        secure_(security.enabled), ca_name_(security.ca_file.empty() ? "the CA given in memory"
                                                                      : absl::StrCat("CA file ", security.ca_file)),
        wait_for_ready_(wait_for_ready), channel_(Channel(address, security)),
        stub_(shardps::Scheduler::NewStub(channel_)) {}

  // gRPC's default reconnect backoff grows to 2 minutes: a scheduler that
  // restarts after a minute would be found late. Retry every second at most.
  static std::shared_ptr<grpc::Channel> Channel(const std::string& address, const SecurityCredentials& security) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A connection whose packets are dropped (a network partition) is noticed
    // within seconds by keepalive pings, not after TCP gives up. A ping is
    // sent every 2 s but given 10 s (heartbeat_timeout_ms's default) to be
    // answered: a scheduler (or this process) stalled for a few seconds on a
    // loaded host is no partition, and closing the connection would fail
    // every call waiting on it (Register, DefineTensors) with UNAVAILABLE.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    auto credentials = ChannelCredentials(security, args);
    return grpc::CreateCustomChannel(address, credentials, args);
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request,
                                            absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::string what = request.role() == SERVER
                           ? absl::StrCat("registering server ", request.data_address())
                           : absl::StrCat("registering worker rank ", request.rank());
    for (;;) {
      RegisterResponse response;
      auto ctx = Context(deadline - absl::Now());
      ctx->set_wait_for_ready(wait_for_ready_);  // keep trying to connect until the deadline
      SHARDPS_RETURN_IF_ERROR(AwaitHandshake(ctx->deadline(), what));
      const grpc::Status g = stub_->Register(ctx.get(), request, &response);
      // wait_for_ready waits to connect, not for a call the scheduler's
      // death cut off (its connection closed or reset under it: a server
      // started as the scheduler was killed gave up at once, "Socket
      // closed"): sent again, to the restarted one, until the deadline.
      // (A registration the dead one saved first is refused as alive.)
      const bool cut_off =
          (g.error_code() == grpc::StatusCode::UNAVAILABLE && !IsSchedulerRefusal(g.error_message())) ||
          g.error_code() == grpc::StatusCode::CANCELLED;  // a scheduler stopping (FromGrpc)
      if (wait_for_ready_ && cut_off && absl::Now() + kRegisterRetry < deadline) {
        LOG(WARNING) << "scheduler " << address() << ": " << what << ": " << g.error_message() << "; sending it again";
        absl::SleepFor(kRegisterRetry);
        continue;
      }
      absl::Status s = Check(g, address(), absl::StrCat(what, " (waited up to ", absl::FormatDuration(timeout), ")"));
      if (!s.ok()) return s;
      return response;
    }
  }

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request,
                                              absl::Duration timeout) override {
    HeartbeatResponse response;
    auto ctx = Context(timeout);
    absl::Status s = Check(stub_->Heartbeat(ctx.get(), request, &response), address(), "heartbeat");
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<ShardMap> DefineTensors(const DefineTensorsRequest& request,
                                         absl::Duration timeout) override {
    ShardMap response;
    auto ctx = Context(timeout);
    ctx->set_wait_for_ready(wait_for_ready_);
    SHARDPS_RETURN_IF_ERROR(AwaitHandshake(ctx->deadline(), "defining tensors"));
    absl::Status s = Check(stub_->DefineTensors(ctx.get(), request, &response), address(),
                              "defining tensors");
    if (!s.ok()) return s;
    return response;
  }

  absl::Status Barrier(const BarrierRequest& request, absl::Duration timeout, BarrierResponse* out) override {
    BarrierResponse response;
    auto ctx = Context(timeout);
    ctx->set_wait_for_ready(wait_for_ready_);
    SHARDPS_RETURN_IF_ERROR(AwaitHandshake(ctx->deadline(), absl::StrCat("barrier '", request.name(), "'")));
    grpc::Status s = stub_->Barrier(ctx.get(), request, &response);
    if (s.ok() && out != nullptr) *out = std::move(response);
    return Check(s, address(),
                    absl::StrCat("barrier '", request.name(), "'"));
  }

  absl::StatusOr<CheckpointResponse> RequestCheckpoint(const CheckpointRequest& request,
                                                       absl::Duration timeout) override {
    CheckpointResponse response;
    auto ctx = Context(timeout);
    absl::Status s = Check(stub_->RequestCheckpoint(ctx.get(), request, &response), address(),
                              absl::StrCat("checkpoint into ", request.dir()));
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<DrainResponse> Drain(const DrainRequest& request, absl::Duration timeout) override {
    DrainResponse response;
    auto ctx = Context(timeout);
    absl::Status s = Check(stub_->Drain(ctx.get(), request, &response), address(),
                           absl::StrCat("drain of server ", request.server()));
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<StatusResponse> Status(absl::Duration timeout) override {
    StatusResponse response;
    auto ctx = Context(timeout);
    ctx->set_wait_for_ready(wait_for_ready_);  // within the deadline, a restarting scheduler is waited for
    SHARDPS_RETURN_IF_ERROR(AwaitHandshake(ctx->deadline(), "cluster status"));
    absl::Status s = Check(stub_->Status(ctx.get(), StatusRequest(), &response), address(),
                              "cluster status");
    if (!s.ok()) return s;
    return response;
  }

  std::unique_ptr<Watch> WatchShardMap(uint64_t node_id, std::function<void(const ShardMap&)> on_map,
                                       std::function<void(const absl::Status&)> on_error) override {
    return std::make_unique<StreamWatch>(stub_.get(), address(), token_, wait_for_ready_, node_id, std::move(on_map),
                                         std::move(on_error));
  }

 private:
  class StreamWatch : public Watch {
   public:
    StreamWatch(shardps::Scheduler::Stub* stub, std::string address, std::string token, bool wait_for_ready,
                uint64_t node_id, std::function<void(const ShardMap&)> on_map,
                std::function<void(const absl::Status&)> on_error) {
      thread_ = std::thread([this, stub, address, token, wait_for_ready, node_id, on_map = std::move(on_map),
                             on_error = std::move(on_error)] {
        Loop(stub, address, token, wait_for_ready, node_id, on_map, on_error);
      });
    }
    ~StreamWatch() override {
      {
        absl::MutexLock lock(&mu_);
        cancelled_ = true;
        if (ctx_ != nullptr) ctx_->TryCancel();
      }
      thread_.join();
    }

   private:
    void Loop(shardps::Scheduler::Stub* stub, const std::string& address, const std::string& token,
              bool wait_for_ready, uint64_t node_id,
              const std::function<void(const ShardMap&)>& on_map,
              const std::function<void(const absl::Status&)>& on_error) {
      WatchShardMapRequest request;
      request.set_node_id(node_id);
      absl::Duration pause = absl::Milliseconds(100);
      for (;;) {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(wait_for_ready);  // a restarting scheduler is waited for
        if (!token.empty()) ctx.AddMetadata(kTokenKey, token);
        {
          absl::MutexLock lock(&mu_);
          if (cancelled_) return;
          ctx_ = &ctx;
        }
        auto reader = stub->WatchShardMap(&ctx, request);
        ShardMap map;
        while (reader->Read(&map)) {
          request.set_known_epoch(map.epoch());
          pause = absl::Milliseconds(100);
          on_map(map);
        }
        grpc::Status s = reader->Finish();
        {
          absl::MutexLock lock(&mu_);
          ctx_ = nullptr;
          if (cancelled_) return;
        }
        absl::Status st = FromGrpc(s, address, "watching the shard map");
        if (st.ok()) st = absl::UnavailableError(absl::StrCat("scheduler ", address, " closed the shard-map stream"));
        on_error(st);
        {
          absl::MutexLock lock(&mu_);
          auto cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; };
          mu_.AwaitWithTimeout(absl::Condition(&cancelled), pause);
        }
        pause = std::min(pause * 2, absl::Seconds(2));
      }
    }

    absl::Mutex mu_;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
    std::thread thread_;
  };

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!token_.empty()) ctx->AddMetadata(kTokenKey, token_);
    return ctx;
  }

  // Before a call that waits for the scheduler (wait_for_ready): waits for
  // the channel to connect, up to `deadline`, and fails at once when a
  // connection's TLS handshake failed on a certificate: a scheduler that is
  // not up yet or restarting is worth the wait, a certificate that fails
  // verification fails every attempt alike. Anything else (no connection by
  // the deadline included) is left to the call, which waits and says why.
  absl::Status AwaitHandshake(std::chrono::system_clock::time_point deadline, absl::string_view what) {
    if (!secure_ || !wait_for_ready_) return absl::OkStatus();
    grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY && std::chrono::system_clock::now() < deadline) {
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        if (std::string problem = CertificateProblem(LastConnectError()); !problem.empty()) {
          // Not UNAVAILABLE: callers ask again on that, until their deadline.
          return absl::UnauthenticatedError(absl::StrCat("scheduler ", address(), ": ", what, ": ", problem));
        }
      }
      // Each state change, or every 200 ms: a failed attempt may go by
      // between two looks (TRANSIENT_FAILURE, then CONNECTING again).
      channel_->WaitForStateChange(state, std::min(deadline, std::chrono::system_clock::now() +
                                                                 std::chrono::milliseconds(200)));
      state = channel_->GetState(/*try_to_connect=*/true);
    }
    return absl::OkStatus();
  }

  // What a failed connection says about certificates, as a sentence for the
  // node's error; empty when it is no certificate problem. gRPC reports a
  // failed handshake as e.g. "Ssl handshake failed: SSL_ERROR_SSL: error:
  // 0A000086:SSL routines::certificate verify failed", or, for a valid
  // certificate of another host, "Peer name H is not in peer certificate".
  std::string CertificateProblem(const std::string& error) const {
    if (absl::StrContains(absl::AsciiStrToLower(error), "certificate verify failed")) {
      return absl::StrCat("TLS handshake failed: certificate verification against ", ca_name_,
                          " failed: the scheduler's certificate is not signed by that CA, or has expired; waiting "
                          "will not change that (is security.tls_ca_file the cluster's CA?) (", error, ")");
    }
    if (absl::StrContains(error, "not in peer certificate")) {
      return absl::StrCat("TLS handshake failed: the scheduler's certificate does not name the host this node "
                          "expects (the address's host, or security.tls_server_name); waiting will not change that "
                          "(`shardps certs --hosts` names more hosts) (", error, ")");
    }
    return "";
  }

  // FromGrpc, plus a hint when a call waited out its deadline on a connection
  // that keeps failing: nothing listening at the address (connection refused),
  // something that is not gRPC there, or, with TLS on either side only, a
  // handshake refused.
  absl::Status Check(const grpc::Status& s, const std::string& address, absl::string_view what) {
    absl::Status status = FromGrpc(s, address, what);
    if (status.ok() || s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED ||
        channel_->GetState(false) != GRPC_CHANNEL_TRANSIENT_FAILURE) {
      return status;
    }
    const std::string last_error = LastConnectError();
    std::string hint;
    if (absl::StrContains(last_error, "Connection refused")) {
      hint = "connection refused: nothing listens there; is the scheduler running, on that port?";
    } else if (absl::StrContains(last_error, "Failed parsing HTTP/2")) {
      hint = "what listens there is no gRPC service: a server's data port or a metrics port?";
    } else if (absl::StrContains(last_error, "DNS resolution failed")) {
      // Certificates are not the cause: no connection was ever made.
      hint = absl::StrCat("the scheduler's host name does not resolve on this host: ", last_error);
    } else {
      hint = absl::StrCat("connections keep failing", last_error.empty() ? "" : ": ", last_error, "; ",
                          secure_ ? "does the scheduler's certificate come from this node's security.tls_ca_file, "
                                    "and does the scheduler accept this node's certificate?"
                                  : "a secured scheduler needs --security-config");
    }
    return absl::Status(status.code(), absl::StrCat(status.message(), " (", hint, ")"));
  }

  // Why the channel's connections fail, from one cheap call that fails at
  // once instead of waiting for a connection; empty if it got an answer.
  std::string LastConnectError() {
    auto ctx = Context(absl::Seconds(1));
    StatusResponse response;
    grpc::Status s = stub_->Status(ctx.get(), StatusRequest(), &response);
    return s.ok() ? "" : s.error_message();
  }

  const std::string token_;  // "Bearer <token>", or empty: security off
  const bool secure_;
  const std::string ca_name_;  // "CA file PATH", for messages
  const bool wait_for_ready_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<shardps::Scheduler::Stub> stub_;
};

}  // namespace

absl::StatusOr<DrainResponse> SchedulerClient::Drain(const DrainRequest& request, absl::Duration) {
  return absl::UnimplementedError(
      absl::StrCat("drain of server ", request.server(), ": this scheduler client (", address_, ") cannot ask for it"));
}

absl::Status CheckSchedulerAddress(const std::string& address) {
  for (absl::string_view a : absl::StrSplit(address, ',')) {
    if (auto e = ParseHostPort(a, "scheduler address", {.allow_wildcard = true}); !e.ok()) return e.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(const std::string& address,
                                                                        const SecurityCredentials& security) {
  if (absl::Status s = CheckSchedulerAddress(address); !s.ok()) return s;
  std::vector<std::string> addresses = absl::StrSplit(address, ',');
  if (addresses.size() == 1) {
    return std::unique_ptr<SchedulerClient>(new GrpcSchedulerClient(address, security, /*wait_for_ready=*/true));
  }
  std::vector<std::unique_ptr<SchedulerClient>> clients;
  for (const std::string& a : addresses) {
    clients.push_back(std::make_unique<GrpcSchedulerClient>(a, security, /*wait_for_ready=*/false));
  }
  return std::unique_ptr<SchedulerClient>(new FailoverSchedulerClient(address, std::move(clients)));
}

absl::Status SayLeaving(SchedulerClient& scheduler, uint64_t node_id, const ClusterConfig& config,
                        const std::string& error) {
  HeartbeatRequest request;
  request.set_node_id(node_id);
  request.set_leaving(true);
  request.set_leaving_error(error);
  const absl::Duration wait =
      std::clamp(absl::Milliseconds(config.heartbeat_interval_ms()), absl::Milliseconds(100), absl::Seconds(2));
  return scheduler.Heartbeat(request, wait).status();
}

}  // namespace shardps
