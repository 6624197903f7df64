// Framing of data-plane messages: [header frame][payload frame?].
// The header is a DataHeader protobuf of at most kMaxHeaderBytes; the payload
// is raw little-endian fp32. Parsing validates before anything is trusted.
#ifndef SHARDPS_COMMON_DATA_MESSAGE_H_
#define SHARDPS_COMMON_DATA_MESSAGE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/data.pb.h"

namespace shardps {

// Parses and checks a header frame: size bound, protobuf well-formed,
// protocol version, known op. Errors say which check failed.
absl::StatusOr<DataHeader> ParseDataHeader(const zmq::message_t& frame);
absl::Status ParseDataHeaderInto(const void* data, size_t size, DataHeader* header);

// Serialises `header` (stamping the protocol version) into a frame.
zmq::message_t HeaderFrame(DataHeader& header);

// zmq::poll that treats a signal's interruption (EINTR) as "nothing ready"
// instead of throwing; daemons poll while SIGTERM may arrive.
int PollOrInterrupted(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout);

// socket.send / socket.recv that retry when a signal interrupts them (EINTR)
// instead of throwing: daemons send and receive while SIGTERM may arrive.
// Return what cppzmq returns (nullopt: would block, with dontwait).
zmq::send_result_t SendRetrying(zmq::socket_t& socket, zmq::message_t& message, zmq::send_flags flags);
zmq::recv_result_t RecvRetrying(zmq::socket_t& socket, zmq::message_t& message,
                                zmq::recv_flags flags = zmq::recv_flags::none);

// Heartbeats on `socket`'s connections: ZeroMQ PINGs every `interval_ms`,
// so a connection always has bytes in flight, and one whose bytes TCP leaves
// unacknowledged for `timeout_ms` ends (TCP_USER_TIMEOUT: a cut link, also
// while a frame larger than the TCP buffers is being sent, before which no
// PING goes). A connection that carries no whole message for `silent_ms`
// ends too (ZeroMQ's heartbeat timeout: a peer whose host acknowledges but
// whose process answers nothing). That one is long: a peer's answer to a
// PING waits behind the frame it is sending, so a frame that takes longer
// than it to cross the link breaks a healthy connection. A connecting socket
// makes a connection that ended again, each attempt given `interval_ms` (at
// least 1 s) and each handshake `timeout_ms` (at least 10 s). TCP alone
// notices a silent peer only when its retransmissions give up, and after a
// cut heals sends again only at its next backed-off retransmission (a
// minute after a 30 s cut). Set before connecting or binding: connections
// copy them when made.
void SetHeartbeats(zmq::socket_t& socket, int interval_ms, int timeout_ms, int silent_ms);
// Starts reporting `events` (ZMQ_EVENT_*) of `socket`'s connections on a
// PAIR socket of `context` connected at `endpoint` (inproc://, unique).
absl::StatusOr<zmq::socket_t> WatchConnections(zmq::context_t& context, zmq::socket_t& socket,
                                               const std::string& endpoint, int events);
// The events `monitor` (from WatchConnections, or any zmq_socket_monitor
// PAIR) has queued, in order, with each one's value (ZMQ_EVENT_ACCEPTED and
// ZMQ_EVENT_DISCONNECTED: the connection's descriptor).
struct ConnectionEvent {
  uint16_t event = 0;
  int32_t value = -1;
};
std::vector<ConnectionEvent> TakeConnectionEventValues(zmq::socket_t& monitor);
// The same, the events alone.
std::vector<uint16_t> TakeConnectionEvents(zmq::socket_t& monitor);

// Descriptors a socket needs as it is made: its mailbox and a connection;
// a context's first socket also starts the context's reaper and I/O threads,
// whose epoll and mailbox descriptors libzmq asserts on (an abort, "Too many
// open files (src/epoll.cpp:65)").
inline constexpr int kSocketDescriptors = 2;
inline constexpr int kFirstSocketDescriptors = kSocketDescriptors + 4;
// What WatchConnections adds: the mailboxes of the monitor's two PAIR sockets.
inline constexpr int kWatchDescriptors = 2;

// A socket of `type` on `context`. RESOURCE_EXHAUSTED, naming `who`, when
// fewer than `descriptors` are free (EnsureFreeDescriptors); UNAVAILABLE with
// ZeroMQ's reason when it cannot make the socket all the same (before
// 2026-11-26 cppzmq's exception ended the process: chaos17).
absl::StatusOr<zmq::socket_t> MakeSocket(zmq::context_t& context, zmq::socket_type type, absl::string_view who,
                                         int descriptors = kSocketDescriptors);

// The status carried by a response header.
absl::Status ResponseStatus(const DataHeader& header);
// Fills the status fields of a response header.
void SetResponseStatus(const absl::Status& status, DataHeader* header);

}  // namespace shardps

#endif  // SHARDPS_COMMON_DATA_MESSAGE_H_
