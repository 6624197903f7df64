#include "server/accepted_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/data_message.h"

namespace shardps {
namespace {

constexpr char kEndpoint[] = "inproc://shardps-data-connections";

// The IP address and port of `fd`'s peer; false if it has none (closed).
bool PeerOf(int fd, std::string* address, uint16_t* port) {
  sockaddr_storage peer{};
  socklen_t size = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&peer);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    *port = ntohs(in->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&peer);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *address = text;
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AcceptedConnections>> AcceptedConnections::Create(zmq::context_t& context,
                                                                                 zmq::socket_t& socket, Limits limits,
                                                                                 std::string name) {
  auto failed = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat(name, ": cannot watch the data socket's connections: ", why));
  };
  if (zmq_socket_monitor(socket.handle(), kEndpoint, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return failed(zmq_strerror(errno));
  }
  auto made = MakeSocket(context, zmq::socket_type::pair, name, kWatchDescriptors);
  if (!made.ok()) {
    (void)zmq_socket_monitor(socket.handle(), nullptr, 0);
    return made.status();
  }
  zmq::socket_t monitor = *std::move(made);
  try {
    // No high-water mark: with one, libzmq's I/O thread would block on its
    // report of a connection (every connection of the server stalled) until
    // the engine thread took the events in.
    monitor.set(zmq::sockopt::rcvhwm, 0);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(kEndpoint);
  } catch (const zmq::error_t& e) {
    (void)zmq_socket_monitor(socket.handle(), nullptr, 0);
    return failed(e.what());
  }
  return std::unique_ptr<AcceptedConnections>(
      new AcceptedConnections(std::move(monitor), socket.handle(), limits, std::move(name)));
}

AcceptedConnections::~AcceptedConnections() { Stop(); }

void AcceptedConnections::SetLimits(Limits limits, std::string name) {
  limits_ = limits;
  name_ = std::move(name);
}

void AcceptedConnections::Stop() {
  if (watched_ == nullptr) return;
  (void)zmq_socket_monitor(watched_, nullptr, 0);
  watched_ = nullptr;
}

AcceptedConnections::Closed AcceptedConnections::Update(Clock::time_point now) {
  TakeEvents(now);
  while (!deadlines_.empty() && idle_ > limits_.max_idle && now - deadlines_.front().second >= limits_.proof_deadline) {
    const auto [fd, taken_in] = deadlines_.front();
    deadlines_.pop_front();
    auto it = connections_.find(fd);
    if (it == connections_.end() || it->second.taken_in != taken_in) continue;  // gone, or another one
    Connection& c = it->second;
    if (c.proven || c.closing) continue;
    Close(fd, c);
    ++closed_.no_message_in_time;
    Say(no_message_, c.address,
        absl::StrCat("it carried no valid message within ", limits_.proof_deadline.count(),
                     " ms of being accepted (the longer of heartbeat_timeout_ms and request_timeout_ms), and more "
                     "than limits.max_idle_connections (", limits_.max_idle, ") such connections are open"),
        now);
  }
  Closed closed = closed_;
  closed_ = Closed();
  return closed;
}

void AcceptedConnections::TakeEvents(Clock::time_point now) {
  std::vector<int> accepted;
  for (const auto [event, fd] : TakeConnectionEventValues(monitor_)) {
    // An ACCEPTED on a descriptor still listed replaces the entry (its
    // DISCONNECTED never came).
    if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_ACCEPTED) Disconnected(fd);
    if (event != ZMQ_EVENT_ACCEPTED || fd < 0) continue;
    Connection c;
    c.taken_in = now;
    // Gone already (its DISCONNECTED event is queued): nothing to count.
    if (!PeerOf(fd, &c.address, &c.port)) continue;
    connections_[fd] = std::move(c);
    accepted.push_back(fd);
  }
  // Counted and capped only once every queued event is in: libzmq reports a
  // connection's end before it closes the descriptor, so a descriptor
  // closed and reused meanwhile has its DISCONNECTED taken in by now and
  // is not shut down under its new owner.
  for (int fd : accepted) {
    auto it = connections_.find(fd);
    if (it == connections_.end() || it->second.counted) continue;
    Connection& c = it->second;
    c.counted = true;
    if (!c.proven) ++idle_;
    const uint32_t from_address = ++per_address_[c.address];
    if (from_address > limits_.max_per_address) {
      Close(fd, c);
      ++closed_.over_address_limit;
      Say(over_address_, c.address,
          absl::StrCat("that address has ", from_address - 1, " open already (limits.max_connections_per_address ",
                       limits_.max_per_address, ")"),
          now);
      continue;
    }
    deadlines_.emplace_back(fd, now);
  }
}

void AcceptedConnections::Disconnected(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  NoLongerIdle(it->second);
  if (it->second.counted) {
    auto count = per_address_.find(it->second.address);
    if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  }
  connections_.erase(it);
}

void AcceptedConnections::Proven(const zmq::message_t& frame) {
  const int fd = zmq_msg_get(frame.handle(), ZMQ_SRCFD);
  if (fd < 0) return;
  auto it = connections_.find(fd);
  if (it == connections_.end()) {
    // Its ACCEPTED event may still be queued: libzmq sends it before the
    // connection's handshake, so before any of its messages.
    TakeEvents(Clock::now());
    it = connections_.find(fd);
    if (it == connections_.end()) return;
  }
  NoLongerIdle(it->second);
  it->second.proven = true;
}

void AcceptedConnections::NoLongerIdle(Connection& c) {
  if (c.counted && !c.proven && !c.closing && idle_ > 0) --idle_;
}

void AcceptedConnections::Close(int fd, Connection& c) {
  NoLongerIdle(c);
  c.closing = true;
  std::string address;
  uint16_t port = 0;
  // The descriptor is still this connection's (libzmq has not closed it and
  // reused the number since): its peer is the one it was accepted from.
  if (!PeerOf(fd, &address, &port) || address != c.address || port != c.port) return;
  (void)shutdown(fd, SHUT_RDWR);
}

void AcceptedConnections::Say(Said& said, const std::string& address, const std::string& why, Clock::time_point now) {
  ++said.count;
  if (now < said.next) return;
  said.next = now + std::chrono::seconds(1);
  LOG(WARNING) << name_ << ": closed a data connection from " << address << ": " << why << " [" << said.count
               << " closed for this reason so far]";
}

}  // namespace shardps
