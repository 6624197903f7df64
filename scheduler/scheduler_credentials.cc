#include "scheduler/scheduler_credentials.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include <glog/logging.h>
#include <grpc/support/log.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardps {
namespace {

// Marks a connection whose client certificate was verified, so later calls
// on it skip the check (the auth context is per connection).
constexpr char kVerifiedProperty[] = "shardps_certificate_verified";

// A trust store holding every certificate of the CA file.
class TrustStore {
 public:
  static absl::StatusOr<std::unique_ptr<TrustStore>> Create(const std::string& ca_pem) {
    auto store = std::unique_ptr<TrustStore>(new TrustStore());
    BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    int added = 0;
    while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
      if (X509_STORE_add_cert(store->store_, cert) == 1) ++added;
      X509_free(cert);
    }
    BIO_free(bio);
    if (added == 0) return absl::InvalidArgumentError("security.tls_ca_file holds no PEM certificate");
    return store;
  }
  ~TrustStore() { X509_STORE_free(store_); }

  // Empty when `cert_pem` is a valid certificate of the CA; else why not.
  std::string Verify(const std::string& cert_pem) const {
    BIO* bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (cert == nullptr) return "its certificate does not parse";
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    std::string error;
    if (X509_STORE_CTX_init(ctx, store_, cert, nullptr) != 1) {
      error = "cannot set up certificate verification";
    } else if (X509_verify_cert(ctx) != 1) {
      error = absl::StrCat("its certificate is not one of the cluster CA (",
                           X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)), ")");
    }
    X509_STORE_CTX_free(ctx);
    X509_free(cert);
    return error;
  }

 private:
  TrustStore() : store_(X509_STORE_new()) {}
  X509_STORE* store_;
};

// Checks every call: the token, and with mutual TLS the client certificate
// (gRPC is told to request it without verifying, so that a wrong one reaches
// this check and is logged naming the peer instead of failing the TLS
// handshake silently; the handshake still proves the peer holds its key).
class CallAuthenticator : public grpc::AuthMetadataProcessor {
 public:
  // `tokens`: the cluster token, then those accepted while it is rotated.
  CallAuthenticator(const std::vector<std::string>& tokens, std::unique_ptr<TrustStore> trust)
      : trust_(std::move(trust)) {
    for (const std::string& t : tokens) expected_.push_back("Bearer " + t);
  }

  bool IsBlocking() const override { return false; }  // no I/O: run inline

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata* consumed,
                       OutputMetadata*) override {
    if (trust_ != nullptr && context->FindPropertyValues(kVerifiedProperty).empty()) {
      auto certs = context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
      std::string error = certs.empty() ? "it showed no client certificate"
                                        : trust_->Verify(std::string(certs[0].data(), certs[0].size()));
      if (!error.empty()) return Refuse(*context, error);
      context->AddProperty(kVerifiedProperty, "1");
    }
    auto token = metadata.find("authorization");
    if (token == metadata.end()) return Refuse(*context, "the call carries no cluster token");
    const std::string given(token->second.data(), token->second.size());
    // Every token compared, in time independent of where they differ.
    bool known = false;
    for (const std::string& expected : expected_) {
      known |= given.size() == expected.size() && CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0;
    }
    if (!known) return Refuse(*context, "the call carries a wrong cluster token");
    consumed->insert({"authorization", given});
    return grpc::Status::OK;
  }

 private:
  static std::string Peer(const grpc::AuthContext& context) {
    std::vector<std::string> parts;
    for (const char* name : {GRPC_PEER_IP_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
      for (const auto& v : context.FindPropertyValues(name)) {
        parts.push_back(absl::StrCat(name == std::string(GRPC_PEER_IP_PROPERTY_NAME) ? "address " : "certificate CN ",
                                     std::string(v.data(), v.size())));
      }
    }
    return parts.empty() ? "peer (no certificate, address unknown)" : absl::StrCat("peer ", absl::StrJoin(parts, ", "));
  }

  grpc::Status Refuse(const grpc::AuthContext& context, const std::string& why) {
    const std::string line = absl::StrCat(Peer(context), " refused: ", why);
    // A client retrying with bad credentials must not flood the log.
    const uint64_t n = refused_.fetch_add(1, std::memory_order_relaxed);
    if (n < 20 || n % 1000 == 0) LOG(WARNING) << "scheduler: " << line << " (" << n + 1 << " refused calls)";
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, absl::StrCat("scheduler refused the call: ", why));
  }

  std::vector<std::string> expected_;  // "Bearer " + each accepted token
  const std::unique_ptr<TrustStore> trust_;  // null: no client certificates
  std::atomic<uint64_t> refused_{0};
};

// gRPC writes a line at ERROR for each TLS handshake that fails (a port
// scan, plain HTTP, a client without a certificate of the CA), one per
// connection whatever the rate: anyone who reaches the port wrote the
// scheduler's log as fast as it opened connections (3,000 connections,
// 3,000 lines). Its lines go through glog instead, and of those the first
// 20 and every 1000th, as CallAuthenticator's refusals; the rest unchanged
// (ERROR as ERROR, INFO and DEBUG, which GRPC_VERBOSITY asks for, as INFO).
void LogGrpcLine(gpr_log_func_args* args) {
  static std::atomic<uint64_t> failed_handshakes{0};
  const bool handshake = std::strstr(args->message, "Handshake failed") != nullptr;
  uint64_t n = 0;
  if (handshake) {
    n = failed_handshakes.fetch_add(1, std::memory_order_relaxed);
    if (n >= 20 && n % 1000 != 0) return;
  }
  google::LogMessage line(args->file, args->line,
                          args->severity == GPR_LOG_SEVERITY_ERROR ? google::GLOG_ERROR : google::GLOG_INFO);
  line.stream() << args->message;
  if (handshake) line.stream() << " [" << n + 1 << " failed TLS handshakes so far]";
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> SchedulerCredentials(const SecurityCredentials& security) {
  if (!security.enabled) return grpc::InsecureServerCredentials();
  static std::once_flag log_through_glog;
  std::call_once(log_through_glog, [] { gpr_set_log_function(&LogGrpcLine); });
  std::unique_ptr<TrustStore> trust;
  grpc::SslServerCredentialsOptions tls(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (security.require_client_cert) {
    auto store = TrustStore::Create(security.ca_pem);
    if (!store.ok()) return store.status();
    trust = *std::move(store);
    // Requested, not required: a client without one completes the handshake
    // and CallAuthenticator refuses each of its calls, logged as a refusal
    // and telling the node why. Required, the handshake failed: gRPC logged
    // one more failed handshake, and the node, taking it for a scheduler not
    // up yet, waited out its deadline.
    tls.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY;
  }
  tls.pem_key_cert_pairs.push_back({security.key_pem, security.cert_pem});
  auto creds = grpc::SslServerCredentials(tls);
  if (creds == nullptr) return absl::InvalidArgumentError("security: the scheduler's TLS certificate or key is invalid");
  std::vector<std::string> tokens = {security.token};
  tokens.insert(tokens.end(), security.accepted_tokens.begin(), security.accepted_tokens.end());
  if (tokens.size() > 1) {
    LOG(WARNING) << "scheduler: accepting " << tokens.size() << " cluster tokens (security.token and "
                 << tokens.size() - 1 << " in accepted_tokens / accepted_token_files): a token rotation is under way";
  }
  creds->SetAuthMetadataProcessor(std::make_shared<CallAuthenticator>(tokens, std::move(trust)));
  return creds;
}

}  // namespace shardps
