// Credentials for a test cluster (`shardps certs`, `shardps local --secure`):
// a CA, the scheduler's TLS certificate for the given hosts, one node
// certificate for mutual TLS, a random cluster token, and two config files
// holding the matching `security { }` block, one for the scheduler and one
// for every other node. Keys and token are written 0600, in a directory made
// 0700. Not thread-safe with another call on the same directory.
#ifndef SHARDPS_TOOLS_CLUSTER_CREDENTIALS_H_
#define SHARDPS_TOOLS_CLUSTER_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace shardps {

struct ClusterCredentialFiles {
  std::string scheduler_config;  // `shardps scheduler --config` (merge into the cluster config)
  std::string node_config;       // `--security-config` of servers, workers, status
};

// Writes into `dir` (created): ca.pem, ca.key, scheduler.pem, scheduler.key,
// node.pem, node.key, token, scheduler.conf, node.conf. `hosts` (DNS names or
// IP addresses) go into the scheduler's certificate besides localhost and
// 127.0.0.1. `mutual`: both configs ask for client certificates.
absl::StatusOr<ClusterCredentialFiles> WriteClusterCredentials(const std::string& dir,
                                                               const std::vector<std::string>& hosts, bool mutual);

// Rewrites `node_config` (written above) so that servers protect their data
// sockets with `cipher` (security.data_cipher).
absl::Status SetDataCipher(const std::string& node_config, DataCipher cipher);

}  // namespace shardps

#endif  // SHARDPS_TOOLS_CLUSTER_CREDENTIALS_H_
