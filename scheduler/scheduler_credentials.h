// The scheduler's gRPC server credentials: TLS with its certificate and, when
// security is on, a check of every call (the cluster token; with mutual TLS,
// the node's certificate against the cluster CA). A refused call is answered
// UNAUTHENTICATED and logged with the peer (its certificate's name and
// address, as far as known) and the reason. Included only by
// scheduler_service.cc: it carries gRPC headers.
#ifndef SHARDPS_SCHEDULER_SCHEDULER_CREDENTIALS_H_
#define SHARDPS_SCHEDULER_SCHEDULER_CREDENTIALS_H_

#include <memory>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "common/security.h"

namespace shardps {

// Insecure credentials when `security` is off. Fails naming what is wrong
// with the CA or certificate. Secured, it also routes gRPC's log lines
// through glog for the whole process, its failed TLS handshakes rate-limited.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> SchedulerCredentials(const SecurityCredentials& security);

}  // namespace shardps

#endif  // SHARDPS_SCHEDULER_SCHEDULER_CREDENTIALS_H_
