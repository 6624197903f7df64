// Network addresses as users and nodes write them: `host:port` (gRPC, HTTP)
// and `tcp://host:port` (ZeroMQ), with IPv6 hosts in brackets. Parsing
// checks the syntax and the port's range, so `127.0.0.1:99999` is an error
// instead of a silently different port; resolving is a separate, optional
// step. Thread-safe (no state).
#ifndef SHARDPS_COMMON_ENDPOINT_H_
#define SHARDPS_COMMON_ENDPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardps {

struct Endpoint {
  std::string host;  // without brackets; "*" is any interface (bind only)
  uint16_t port = 0;
};

struct EndpointRules {
  bool allow_port_zero = false;  // a listener's "any free port"
  bool allow_wildcard = false;   // host "*", "0.0.0.0" or "::": a listener's "every interface"
};

// Parses `host:port`. `what` names the flag or field in errors.
absl::StatusOr<Endpoint> ParseHostPort(absl::string_view text, absl::string_view what, EndpointRules rules = {});
// Parses `tcp://host:port`.
absl::StatusOr<Endpoint> ParseTcpEndpoint(absl::string_view text, absl::string_view what, EndpointRules rules = {});
// Whether `host` resolves (numeric hosts without a lookup); the error names
// `what`, the host and the resolver's reason.
absl::Status CheckResolvable(const std::string& host, absl::string_view what);
// Whether a TCP connection to `e` opens within `timeout` (it is closed at
// once); the error names `what`, the address and why.
absl::Status CheckReachable(const Endpoint& e, absl::Duration timeout, absl::string_view what);
// This machine's host name (gethostname), or "localhost" when it has none.
std::string LocalHostName();

}  // namespace shardps

#endif  // SHARDPS_COMMON_ENDPOINT_H_
