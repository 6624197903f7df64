#include "scheduler/etcd_client.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/endpoint.h"
#include "proto/etcd.grpc.pb.h"

namespace shardps {
namespace {

using etcdserverpb::Compare;

struct ParsedEndpoint {
  std::string address;  // host:port
  bool tls = false;     // https://
};

// "http://host:port", "https://host:port" or "host:port" (plain).
absl::StatusOr<ParsedEndpoint> ParseEndpoint(absl::string_view url) {
  absl::string_view hostport = url;
  ParsedEndpoint parsed;
  parsed.tls = absl::ConsumePrefix(&hostport, "https://");
  if (!parsed.tls) absl::ConsumePrefix(&hostport, "http://");
  absl::ConsumeSuffix(&hostport, "/");
  if (auto e = ParseHostPort(hostport, "--etcd endpoint"); !e.ok()) return e.status();
  parsed.address = std::string(hostport);
  return parsed;
}

// Plain for http:// endpoints; TLS with the files' CA (and client
// certificate) for https:// ones. Errors name `endpoints` and what is wrong.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const std::string& endpoints, bool tls,
                                                                             const EtcdTlsFiles& files) {
  if (!tls) {
    if (files.empty()) return grpc::InsecureChannelCredentials();
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd ", endpoints, ": --etcd-ca, --etcd-cert and --etcd-key need https:// endpoints"));
  }
  if (files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd ", endpoints, ": https:// endpoints need --etcd-ca, the CA that signed etcd's certificate"));
  }
  auto pem = LoadEtcdTls(files);
  if (!pem.ok()) return absl::Status(pem.status().code(), absl::StrCat("--etcd ", endpoints, ": ", pem.status().message()));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem->ca;
  options.pem_cert_chain = pem->cert;
  options.pem_private_key = pem->key;
  return grpc::SslCredentials(options);
}

// What a failed connection most likely means, appended to its error: gRPC
// reports etcd's refusal of a client certificate only as a failed read or,
// when the alert races the first write, a reset connection.
std::string ConnectionHint(bool https, const EtcdTlsFiles& tls, absl::string_view error) {
  if (!https) {
    return absl::StrContains(error, "Socket closed") ? " (if etcd serves TLS, give https:// and --etcd-ca)" : "";
  }
  if (absl::StrContains(error, "certificate verify failed")) {
    return absl::StrCat(" (etcd's certificate is not signed by --etcd-ca ", tls.ca_file, ")");
  }
  if (!absl::StrContains(error, "Endpoint read failed") && !absl::StrContains(error, "Connection reset by peer")) {
    return "";
  }
  if (tls.cert_file.empty()) {
    return " (etcd closed the TLS connection: with --client-cert-auth it refuses a client without a certificate; "
           "give --etcd-cert and --etcd-key)";
  }
  return absl::StrCat(" (etcd closed the TLS connection: with --client-cert-auth it refuses --etcd-cert ",
                      tls.cert_file, " unless its --trusted-ca-file signed it)");
}

Compare LeaderCompare(const std::string& key, int64_t create_revision) {
  Compare c;
  c.set_result(Compare::EQUAL);
  c.set_target(Compare::CREATE);
  c.set_key(key);
  c.set_create_revision(create_revision);
  return c;
}

}  // namespace

class EtcdClient::Impl {
 public:
  struct Endpoint {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  };

  Impl(std::vector<std::string> addresses, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
       bool https, EtcdTlsFiles tls, absl::Duration timeout)
      : timeout_(timeout), https_(https), tls_(std::move(tls)) {
    for (std::string& a : addresses) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // A member that was down is found again within a second, not after
      // the resolver's default pause between resolutions.
      args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 500);
      auto channel = grpc::CreateCustomChannel(a, credentials, args);
      endpoints_.push_back({std::move(a), etcdserverpb::KV::NewStub(channel), etcdserverpb::Lease::NewStub(channel),
                            etcdserverpb::Watch::NewStub(channel)});
    }
  }

  // Runs `call` on the endpoint that last answered, then on the others while
  // they are unreachable. `what` names the request in errors.
  template <typename Call>
  absl::Status Run(absl::string_view what, Call call) {
    std::string unreachable;
    const size_t start = current_.load();
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      const size_t i = (start + k) % endpoints_.size();
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
      grpc::Status s = call(endpoints_[i], ctx);
      if (s.ok()) {
        current_.store(i);
        return absl::OkStatus();
      }
      const std::string error = absl::StrCat("etcd ", endpoints_[i].address, ": ", what, ": ", s.error_message());
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::Status(static_cast<absl::StatusCode>(s.error_code()), error);
      }
      absl::StrAppend(&unreachable, unreachable.empty() ? "" : "; ", error,
                      ConnectionHint(https_, tls_, s.error_message()));
    }
    return absl::UnavailableError(absl::StrCat("no etcd endpoint answered (", unreachable, ")"));
  }

  // The endpoint that answered last.
  const std::string& answered() const { return endpoints_[current_.load()].address; }

  absl::StatusOr<bool> AwaitDeletion(const std::string& key, int64_t from_revision, absl::Duration timeout) {
    Endpoint& e = endpoints_[current_.load()];
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    {
      absl::MutexLock lock(&watch_mu_);
      if (waits_cancelled_) return false;
      watches_.push_back(&ctx);
    }
    absl::StatusOr<bool> deleted = Watch(e, ctx, key, from_revision);
    absl::MutexLock lock(&watch_mu_);
    watches_.erase(std::find(watches_.begin(), watches_.end(), &ctx));
    return deleted;
  }

  void CancelWaits() {
    absl::MutexLock lock(&watch_mu_);
    waits_cancelled_ = true;
    for (grpc::ClientContext* ctx : watches_) ctx->TryCancel();
  }

 private:
  // One watch of `key` from `from_revision` until a deletion, the deadline
  // or a cancel.
  absl::StatusOr<bool> Watch(Endpoint& e, grpc::ClientContext& ctx, const std::string& key, int64_t from_revision) {
    auto stream = e.watch->Watch(&ctx);
    etcdserverpb::WatchRequest request;
    request.mutable_create_request()->set_key(key);
    request.mutable_create_request()->set_start_revision(from_revision);
    bool deleted = false;
    std::string refused;  // why etcd cancelled the watch, other than a compaction
    etcdserverpb::WatchResponse response;
    if (stream->Write(request)) {
      while (!deleted && refused.empty() && stream->Read(&response)) {
        deleted = response.compact_revision() != 0;
        if (response.canceled() && !deleted) refused = absl::StrCat("etcd cancelled the watch: ", response.cancel_reason());
        for (const etcdserverpb::Event& event : response.events()) deleted |= event.type() == etcdserverpb::Event::DELETE;
      }
    }
    ctx.TryCancel();  // a finished watch's stream is cancelled: its status says nothing
    grpc::Status s = stream->Finish();
    if (deleted) return true;
    if (!refused.empty()) return absl::UnavailableError(absl::StrCat("etcd ", e.address, ": watching ", key, ": ", refused));
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || s.error_code() == grpc::StatusCode::CANCELLED) {
      return false;
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("etcd ", e.address, ": watching ", key, ": ", s.error_message(),
                                     ConnectionHint(https_, tls_, s.error_message())));
  }

  const absl::Duration timeout_;
  const bool https_;
  const EtcdTlsFiles tls_;  // for errors
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
  absl::Mutex watch_mu_;
  bool waits_cancelled_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::vector<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(watch_mu_);  // in progress
};

EtcdClient::EtcdClient(std::string endpoints, std::unique_ptr<Impl> impl)
    : endpoints_(std::move(endpoints)), impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const std::string& endpoints, const EtcdTlsFiles& tls,
                                                              absl::Duration call_timeout) {
  std::vector<std::string> addresses;
  std::optional<bool> https;  // the scheme of the first endpoint
  for (absl::string_view url : absl::StrSplit(endpoints, ',', absl::SkipWhitespace())) {
    auto parsed = ParseEndpoint(url);
    if (!parsed.ok()) return parsed.status();
    if (https.has_value() && *https != parsed->tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd ", endpoints, ": mixes http:// and https:// endpoints; give every member with the scheme it serves"));
    }
    https = parsed->tls;
    addresses.push_back(std::move(parsed->address));
  }
  if (addresses.empty()) return absl::InvalidArgumentError("--etcd: no endpoint given (http://HOST:PORT[,...])");
  auto credentials = ChannelCredentials(endpoints, *https, tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(endpoints, std::make_unique<Impl>(std::move(addresses), *credentials, *https, tls, call_timeout)));
}

absl::StatusOr<std::pair<int64_t, absl::Duration>> EtcdClient::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status s = impl_->Run("granting a lease", [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.lease->LeaseGrant(&ctx, request, &response);
  });
  if (!s.ok()) return s;
  if (!response.error().empty()) return absl::UnavailableError(absl::StrCat("etcd: granting a lease: ", response.error()));
  return std::make_pair(response.id(), absl::Seconds(response.ttl()));
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = impl_->Run("renewing a lease", [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    auto stream = e.lease->LeaseKeepAlive(&ctx);
    if (!stream->Write(request) || !stream->Read(&response)) return stream->Finish();
    ctx.TryCancel();  // one renewal per stream; the cancelled finish is expected
    stream->Finish();
    return grpc::Status::OK;
  });
  if (!s.ok()) return s;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd ", impl_->answered(), ": lease ", lease, " has expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return impl_->Run("revoking a lease", [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.lease->LeaseRevoke(&ctx, request, &response);
  });
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  absl::Status s = impl_->Run(absl::StrCat("reading ", key), [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.kv->Range(&ctx, request, &response);
  });
  if (!s.ok()) return s;
  if (response.kvs_size() == 0) return std::nullopt;
  const etcdserverpb::KeyValue& kv = response.kvs(0);
  return EtcdKeyValue{kv.value(), kv.create_revision(), kv.lease(), response.header().revision()};
}

absl::StatusOr<EtcdKeyValue> EtcdClient::CreateIfAbsent(const std::string& key, const std::string& value,
                                                        int64_t lease, bool* created) {
  etcdserverpb::TxnRequest request;
  *request.add_compare() = LeaderCompare(key, 0);  // create revision 0: the key does not exist
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  absl::Status s = impl_->Run(absl::StrCat("creating ", key), [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.kv->Txn(&ctx, request, &response);
  });
  if (!s.ok()) return s;
  *created = response.succeeded();
  // A transaction is one revision: the key created by it has that revision.
  const int64_t revision = response.header().revision();
  if (response.succeeded()) return EtcdKeyValue{value, revision, lease, revision};
  const auto& kvs = response.responses(0).response_range().kvs();
  if (kvs.empty()) return absl::UnavailableError(absl::StrCat("etcd: ", key, " vanished while being read; try again"));
  return EtcdKeyValue{kvs[0].value(), kvs[0].create_revision(), kvs[0].lease(), revision};
}

absl::Status EtcdClient::PutIfGuarded(const std::string& key, const std::string& value, const std::string& guard_key,
                                      int64_t guard_revision) {
  etcdserverpb::TxnRequest request;
  *request.add_compare() = LeaderCompare(guard_key, guard_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  etcdserverpb::TxnResponse response;
  absl::Status s = impl_->Run(absl::StrCat("writing ", key), [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.kv->Txn(&ctx, request, &response);
  });
  if (!s.ok()) return s;
  if (!response.succeeded()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd: refused to write ", key, ": ", guard_key,
                                                      " is no longer held at revision ", guard_revision));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EtcdClient::AwaitDeletion(const std::string& key, int64_t from_revision,
                                               absl::Duration timeout) {
  return impl_->AwaitDeletion(key, from_revision, timeout);
}

void EtcdClient::CancelWaits() { impl_->CancelWaits(); }

absl::Status EtcdClient::Put(const std::string& key, const std::string& value) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  etcdserverpb::PutResponse response;
  return impl_->Run(absl::StrCat("writing ", key), [&](Impl::Endpoint& e, grpc::ClientContext& ctx) {
    return e.kv->Put(&ctx, request, &response);
  });
}

}  // namespace shardps
