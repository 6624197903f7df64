#include "common/security.h"

#include <zmq.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/durable_file.h"

namespace shardps {
namespace {

// The content of the PEM file `field` names; required or empty if unnamed.
absl::StatusOr<std::string> ReadNamed(const std::string& path, absl::string_view field, bool required) {
  if (path.empty()) {
    if (!required) return std::string();
    return absl::InvalidArgumentError(absl::StrCat("security.", field, " is required when security is enabled"));
  }
  auto data = ReadWholeFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat("security.", field, ": ", data.status().message()));
  }
  if (data->empty()) return absl::InvalidArgumentError(absl::StrCat("security.", field, ": ", path, " is empty"));
  return *std::move(data);
}

// `token` checked: it travels as a gRPC metadata value. `what` names it.
absl::Status CheckToken(const std::string& token, absl::string_view what) {
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("security: ", what, " has ", token.size(), " characters; at least 16 are required"));
  }
  for (char c : token) {
    if (c < 0x20 || c > 0x7e) return absl::InvalidArgumentError(absl::StrCat("security: ", what, " must be printable ASCII"));
  }
  return absl::OkStatus();
}

// The content of token file `path` (field `field`), trailing white space dropped.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view field) {
  auto data = ReadNamed(path, field, true);
  if (!data.ok()) return data.status();
  return std::string(absl::StripTrailingAsciiWhitespace(*data));
}

absl::StatusOr<std::string> LoadToken(const SecurityConfig& config) {
  if (config.has_token() && config.has_token_file()) {
    return absl::InvalidArgumentError("security: set token or token_file, not both");
  }
  std::string token = config.token();
  if (config.has_token_file()) {
    auto data = ReadTokenFile(config.token_file(), "token_file");
    if (!data.ok()) return data.status();
    token = *std::move(data);
  }
  if (absl::Status s = CheckToken(token, "the cluster token"); !s.ok()) return s;
  return token;
}

absl::StatusOr<std::vector<std::string>> LoadAcceptedTokens(const SecurityConfig& config) {
  std::vector<std::string> tokens(config.accepted_tokens().begin(), config.accepted_tokens().end());
  for (const std::string& path : config.accepted_token_files()) {
    auto data = ReadTokenFile(path, "accepted_token_files");
    if (!data.ok()) return data.status();
    tokens.push_back(*std::move(data));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (absl::Status s = CheckToken(tokens[i], absl::StrCat("accepted token ", i + 1)); !s.ok()) return s;
  }
  return tokens;
}

}  // namespace

absl::StatusOr<SecurityCredentials> LoadSecurityCredentials(const SecurityConfig& config, bool for_scheduler) {
  SecurityCredentials creds;
  if (!config.enabled()) return creds;
  creds.enabled = true;
  auto token = LoadToken(config);
  if (!token.ok()) return token.status();
  creds.token = *std::move(token);
  if (for_scheduler) {
    // Only the scheduler checks tokens: a node sharing its config file need
    // not have the files of a rotation under way.
    auto accepted = LoadAcceptedTokens(config);
    if (!accepted.ok()) return accepted.status();
    creds.accepted_tokens = *std::move(accepted);
  }
  const bool own_cert = for_scheduler || config.require_client_cert();
  auto ca = ReadNamed(config.tls_ca_file(), "tls_ca_file", true);
  auto cert = ReadNamed(config.tls_cert_file(), "tls_cert_file", own_cert);
  auto key = ReadNamed(config.tls_key_file(), "tls_key_file", own_cert);
  for (const auto* r : {&ca, &cert, &key}) {
    if (!r->ok()) return r->status();
  }
  if (cert->empty() != key->empty()) {
    return absl::InvalidArgumentError("security: tls_cert_file and tls_key_file go together");
  }
  creds.ca_pem = *std::move(ca);
  creds.ca_file = config.tls_ca_file();
  creds.cert_pem = *std::move(cert);
  creds.key_pem = *std::move(key);
  creds.require_client_cert = config.require_client_cert();
  creds.server_name = config.tls_server_name();
  if (config.data_cipher() == DATA_CIPHER_UNSPECIFIED) {
    return absl::InvalidArgumentError("security.data_cipher: say AES_256_GCM or CURVE");
  }
  creds.seal_data = config.data_cipher() == AES_256_GCM;
  return creds;
}

absl::StatusOr<SecurityCredentials> LoadSecurityCredentialsFile(const std::string& path, bool for_scheduler) {
  if (path.empty()) return SecurityCredentials();
  auto config = LoadConfigFile(path);
  if (!config.ok()) return config.status();
  auto creds = LoadSecurityCredentials(config->security(), for_scheduler);
  if (!creds.ok()) return absl::Status(creds.status().code(), absl::StrCat(path, ": ", creds.status().message()));
  return creds;
}

bool CurveAvailable() { return zmq_has("curve") != 0; }

absl::StatusOr<CurveKeyPair> NewCurveKeyPair() {
  if (!CurveAvailable()) {
    return absl::FailedPreconditionError("this libzmq has no CURVE support (it must be built with libsodium)");
  }
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_keypair: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{std::string(pub, 40), std::string(sec, 40)};
}

void MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys) {
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
}

absl::Status MakeCurveClient(zmq::socket_t& socket, const std::string& server_public_key, const CurveKeyPair* own) {
  if (server_public_key.size() != 40) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE server key has ", server_public_key.size(), " characters (Z85: 40)"));
  }
  CurveKeyPair keys;
  if (own != nullptr) {
    keys = *own;
  } else {
    auto fresh = NewCurveKeyPair();
    if (!fresh.ok()) return fresh.status();
    keys = *std::move(fresh);
  }
  try {
    socket.set(zmq::sockopt::curve_serverkey, server_public_key);
    socket.set(zmq::sockopt::curve_publickey, keys.public_key);
    socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(absl::StrCat("CURVE server key '", server_public_key, "': ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace shardps
