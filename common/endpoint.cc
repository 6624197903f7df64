#include "common/endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": '", text, "' ", why));
}

bool IsWildcard(absl::string_view host) { return host == "*" || host == "0.0.0.0" || host == "::"; }

bool ValidHostChars(absl::string_view host) {
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_' && c != ':' &&
        c != '*') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<Endpoint> ParseHostPort(absl::string_view text, absl::string_view what, EndpointRules rules) {
  if (const size_t scheme = text.find("://"); scheme != absl::string_view::npos) {
    return Bad(what, text, absl::StrCat("is not host:port (no scheme: write ", text.substr(scheme + 3), ")"));
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return Bad(what, text, "is not host:port");
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  } else if (absl::StrContains(host, ':')) {
    return Bad(what, text, "has an IPv6 host without brackets (write [host]:port)");
  }
  if (host.empty()) return Bad(what, text, "has no host");
  if (!ValidHostChars(host)) return Bad(what, text, "has a host with characters no host name or IP holds");
  if (IsWildcard(host) && !rules.allow_wildcard) {
    return Bad(what, text, "names every interface, not a host others can reach");
  }
  uint32_t number = 0;
  if (port.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(port[0])) || !absl::SimpleAtoi(port, &number) ||
      number > 65535) {
    return Bad(what, text, "has no valid port (an integer in [1, 65535])");
  }
  if (number == 0 && !rules.allow_port_zero) return Bad(what, text, "has port 0, which no one can connect to");
  return Endpoint{std::string(host), static_cast<uint16_t>(number)};
}

absl::StatusOr<Endpoint> ParseTcpEndpoint(absl::string_view text, absl::string_view what, EndpointRules rules) {
  if (!absl::StartsWith(text, "tcp://")) return Bad(what, text, "is not tcp://host:port");
  return ParseHostPort(text.substr(6), what, rules);
}

absl::Status CheckResolvable(const std::string& host, absl::string_view what) {
  if (IsWildcard(host)) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  return absl::OkStatus();
}

absl::Status CheckReachable(const Endpoint& e, absl::Duration timeout, absl::string_view what) {
  const std::string where = absl::StrCat(e.host, ":", e.port);
  auto fail = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat(what, " ", where, " is not reachable: ", why));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &found); rc != 0) {
    return fail(gai_strerror(rc));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int error = errno;
    freeaddrinfo(found);
    // This process's shortage, not the address's.
    if (error == EMFILE || error == ENFILE) {
      return absl::ResourceExhaustedError(absl::StrCat(what, " ", where, " cannot be checked: no file descriptor left here (",
                                                       strerror(error), ")"));
    }
    return fail(strerror(error));
  }
  int rc = connect(fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  int error = rc == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    socklen_t len = sizeof(error);
    if (rc == 0) {
      error = ETIMEDOUT;
    } else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
      error = errno;
    }
  }
  close(fd);
  if (error != 0) {
    return fail(error == ETIMEDOUT ? absl::StrCat("no connection within ", absl::FormatDuration(timeout))
                                   : std::string(strerror(error)));
  }
  return absl::OkStatus();
}

std::string LocalHostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace shardps
