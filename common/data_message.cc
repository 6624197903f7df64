#include "common/data_message.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_descriptors.h"
#include "common/protocol.h"

namespace shardps {

void SetHeartbeats(zmq::socket_t& socket, int interval_ms, int timeout_ms, int silent_ms) {
  interval_ms = std::max(1, interval_ms);
  timeout_ms = std::max(1, timeout_ms);
  socket.set(zmq::sockopt::heartbeat_ivl, interval_ms);
  socket.set(zmq::sockopt::heartbeat_timeout, std::max(1, silent_ms));
  // A handshake is given at least 10 s, whatever the timeout: a loaded host
  // may take seconds over a CURVE handshake and its authentication.
  socket.set(zmq::sockopt::handshake_ivl, std::max(timeout_ms, 10000));
  // A connection attempt at least 1 s: a dropped SYN is sent again after 1 s.
  socket.set(zmq::sockopt::connect_timeout, std::max(interval_ms, 1000));
  // ZeroMQ sends a PING only after the frame in progress: a connection cut
  // while a frame larger than the TCP buffers is being sent never times out
  // by heartbeats. TCP's bound on unacknowledged data (TCP_USER_TIMEOUT)
  // ends it instead.
  socket.set(zmq::sockopt::tcp_maxrt, timeout_ms);
}

absl::StatusOr<zmq::socket_t> WatchConnections(zmq::context_t& context, zmq::socket_t& socket,
                                               const std::string& endpoint, int events) {
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) {
    return absl::InternalError(absl::StrCat("cannot watch a socket's connections: ", zmq_strerror(errno)));
  }
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  try {
    monitor.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("cannot watch a socket's connections: ", e.what()));
  }
  return monitor;
}

std::vector<ConnectionEvent> TakeConnectionEventValues(zmq::socket_t& monitor) {
  std::vector<ConnectionEvent> events;
  zmq::message_t frame;
  // Each event: [uint16 event, uint32 value][endpoint].
  while (RecvRetrying(monitor, frame, zmq::recv_flags::dontwait)) {
    ConnectionEvent e;
    if (frame.size() >= sizeof(e.event)) std::memcpy(&e.event, frame.data(), sizeof(e.event));
    if (frame.size() >= sizeof(e.event) + sizeof(e.value)) {
      std::memcpy(&e.value, static_cast<const char*>(frame.data()) + sizeof(e.event), sizeof(e.value));
    }
    events.push_back(e);
    while (frame.more()) (void)RecvRetrying(monitor, frame);
  }
  return events;
}

std::vector<uint16_t> TakeConnectionEvents(zmq::socket_t& monitor) {
  std::vector<uint16_t> events;
  for (const ConnectionEvent& e : TakeConnectionEventValues(monitor)) events.push_back(e.event);
  return events;
}

absl::Status ParseDataHeaderInto(const void* data, size_t size, DataHeader* header) {
  if (size == 0) return absl::InvalidArgumentError("empty header frame");
  if (size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header frame of ", size, " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  if (!header->ParseFromArray(data, static_cast<int>(size))) {
    return absl::InvalidArgumentError(absl::StrCat("malformed header frame (", size, " bytes)"));
  }
  if (header->protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("protocol version ", header->protocol_version(),
                                                      " is not supported (this node speaks ",
                                                      kProtocolVersion, ")"));
  }
  if (header->op() == OP_UNSPECIFIED || !Op_IsValid(header->op())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown op ", static_cast<int>(header->op())));
  }
  return absl::OkStatus();
}

absl::StatusOr<DataHeader> ParseDataHeader(const zmq::message_t& frame) {
  DataHeader header;
  absl::Status s = ParseDataHeaderInto(frame.data(), frame.size(), &header);
  if (!s.ok()) return s;
  return header;
}

zmq::message_t HeaderFrame(DataHeader& header) {
  header.set_protocol_version(kProtocolVersion);
  zmq::message_t frame(header.ByteSizeLong());
  header.SerializeWithCachedSizesToArray(static_cast<uint8_t*>(frame.data()));
  return frame;
}

int PollOrInterrupted(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

zmq::send_result_t SendRetrying(zmq::socket_t& socket, zmq::message_t& message, zmq::send_flags flags) {
  for (;;) {
    try {
      return socket.send(message, flags);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

zmq::recv_result_t RecvRetrying(zmq::socket_t& socket, zmq::message_t& message, zmq::recv_flags flags) {
  for (;;) {
    try {
      return socket.recv(message, flags);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

absl::StatusOr<zmq::socket_t> MakeSocket(zmq::context_t& context, zmq::socket_type type, absl::string_view who,
                                         int descriptors) {
  if (absl::Status s = EnsureFreeDescriptors(descriptors, who); !s.ok()) return s;
  try {
    return zmq::socket_t(context, type);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat(who, ": cannot make a ZeroMQ socket: ", e.what()));
  }
}

absl::Status ResponseStatus(const DataHeader& header) {
  if (header.status_code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(header.status_code()), header.error());
}

void SetResponseStatus(const absl::Status& status, DataHeader* header) {
  header->set_status_code(static_cast<int32_t>(status.code()));
  header->set_error(std::string(status.message()));
}

}  // namespace shardps
