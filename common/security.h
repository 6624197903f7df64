// What a node needs to take part in a secured cluster (README "Security"):
// the control plane's TLS material and cluster token, loaded once from the
// `security` block of the node's config file, and the data plane's CURVE
// keys. No gRPC here: common/scheduler_client.cc and the scheduler's service
// turn these into gRPC credentials.
//
// Thread-safe: plain values and free functions.
#ifndef SHARDPS_COMMON_SECURITY_H_
#define SHARDPS_COMMON_SECURITY_H_

#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace shardps {

// The security block read and its files loaded. Default: off (plain gRPC, no
// token, plain ZeroMQ), what a laptop uses.
struct SecurityCredentials {
  bool enabled = false;
  std::string token;                // sent (nodes) or required (scheduler) on every call
  std::vector<std::string> accepted_tokens;  // scheduler: also accepted (a rotation under way); read by it alone
  std::string ca_pem;               // the cluster CA
  std::string ca_file;              // where ca_pem was read, for messages; empty: given in memory
  std::string cert_pem, key_pem;    // this node's certificate chain and key; empty on plain nodes
  bool require_client_cert = false; // mutual TLS
  std::string server_name;          // expected in the scheduler's certificate; empty: its host
  // Servers: seal data messages with AES-256-GCM (common/peer_seal.h) rather
  // than CURVE.
  bool seal_data = true;
};

// Loads the files `config` names. `for_scheduler`: a certificate and key are
// required. Errors name the field and the file. Disabled: returns {}.
absl::StatusOr<SecurityCredentials> LoadSecurityCredentials(const SecurityConfig& config, bool for_scheduler);
// The `security` block of the cluster config file at `path` (a file may hold
// only that block); empty path: security off.
absl::StatusOr<SecurityCredentials> LoadSecurityCredentialsFile(const std::string& path, bool for_scheduler);

// True when this libzmq can do CURVE (built with libsodium, as on Debian).
bool CurveAvailable();

// A CURVE key pair, both keys Z85-encoded (40 characters).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};
// A fresh key pair. FailedPrecondition when libzmq has no CURVE.
absl::StatusOr<CurveKeyPair> NewCurveKeyPair();

// Makes `socket` (not yet bound) a CURVE server with `keys`: it then speaks
// only to clients that know keys.public_key, encrypted.
void MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys);
// Makes `socket` (not yet connected) a CURVE client of the server whose
// public key is `server_public_key`, with the key pair `own` (null: a fresh
// one; servers admit only registered keys, so real clients pass theirs).
// InvalidArgument when the key is not 40 Z85 characters.
absl::Status MakeCurveClient(zmq::socket_t& socket, const std::string& server_public_key,
                             const CurveKeyPair* own = nullptr);

}  // namespace shardps

#endif  // SHARDPS_COMMON_SECURITY_H_
