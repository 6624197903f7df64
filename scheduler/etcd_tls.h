// TLS to etcd (`shardps scheduler --etcd https://... --etcd-ca ...`): the PEM
// files named, read and checked once when the client is made, so a missing
// file, a PEM that does not parse or a key that is not its certificate's is
// reported at start naming the flag and the file, not later as a failed
// handshake. No gRPC here: scheduler/etcd_client.cc turns the PEMs into
// channel credentials. Plain values and a free function: thread-safe.
#ifndef SHARDPS_SCHEDULER_ETCD_TLS_H_
#define SHARDPS_SCHEDULER_ETCD_TLS_H_

#include <string>

#include "absl/status/statusor.h"

namespace shardps {

// Paths of PEM files; a relative path is taken from the working directory.
struct EtcdTlsFiles {
  // The CA that signed etcd's server certificate (--etcd-ca). Required with
  // https:// endpoints, refused with http:// ones. Default: none.
  std::string ca_file{};
  // This scheduler's client certificate chain and its key (--etcd-cert,
  // --etcd-key), for an etcd started with --client-cert-auth. Both or
  // neither. Default: none (etcd then sees a client without a certificate).
  std::string cert_file{};
  std::string key_file{};

  bool empty() const { return ca_file.empty() && cert_file.empty() && key_file.empty(); }
};

// The files' contents, checked.
struct EtcdTlsPem {
  std::string ca;    // one or more certificates
  std::string cert;  // empty: no client certificate
  std::string key;   // empty exactly when `cert` is
};

// Reads `files` and checks that the CA holds a certificate, that the client
// certificate parses and that the key is its certificate's. REQUIRES:
// files.ca_file is set. Errors name the flag and the file.
absl::StatusOr<EtcdTlsPem> LoadEtcdTls(const EtcdTlsFiles& files);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_ETCD_TLS_H_
