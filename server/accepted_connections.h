// The TCP connections a server's data socket accepted, as its socket monitor
// reports them (libzmq's ACCEPTED and DISCONNECTED events carry each one's
// descriptor), and two bounds on what connections no node has shown itself
// on can make the server hold. libzmq can neither cap a ROUTER's connections
// nor close one by routing id, and a ZeroMQ client that completes its
// handshake and sends nothing answers the heartbeats: before these bounds
// each stayed, about 35 KB of the server and a descriptor, until
// RLIMIT_NOFILE refused the workers' and servers' own connections.
//
// - Per remote address (IP): at most Limits::max_per_address connections at
//   a time; one more is closed as soon as its event is taken in.
// - A connection on which no valid message arrived (Proven: sealed by a
//   node of the map, under CURVE from a key the map admits, plain: a header
//   that parses) within Limits::proof_deadline of being taken in is closed
//   while the server holds more than Limits::max_idle such connections,
//   oldest first. The allowance keeps the job's own nodes that have nothing
//   to send this server (a worker whose partitions are all on other
//   servers, a server that just joined): a job has few of them, and before
//   the allowance each was closed at every deadline (its socket connected
//   again, a warning here and a connection break on the worker). One closed
//   under pressure loses nothing: its socket connects again by itself.
//
// Closing is shutdown(2) of the descriptor, which libzmq's I/O thread owns:
// its next read finds the end, and libzmq drops the connection, its pipe and
// buffers, and closes the descriptor itself. A descriptor is only shut down
// while its DISCONNECTED event has not been taken in and its peer is still
// the address it was accepted from, so one libzmq closed and reused is not
// touched.
//
// Engine thread only; owns the monitor's PAIR socket, borrows the context
// and the watched socket, which must outlive it (Stop before closing the
// socket). Nothing here runs per message: Proven is called once per
// connection, at its first admitted request (PeerAdmission::Admit).
#ifndef SHARDPS_SERVER_ACCEPTED_CONNECTIONS_H_
#define SHARDPS_SERVER_ACCEPTED_CONNECTIONS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace shardps {

class AcceptedConnections {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    // Open connections from one IP address (limits.max_connections_per_address).
    uint32_t max_per_address = 64;
    // Time a connection gets to carry its first valid message
    // (SilentConnectionMs: the longer of heartbeat_timeout_ms and
    // request_timeout_ms, after which a connection that carries nothing is
    // taken for broken anyway).
    std::chrono::milliseconds proof_deadline{30000};
    // Connections with no valid message yet left open past the deadline
    // (limits.max_idle_connections).
    uint32_t max_idle = 64;
  };

  // Connections closed by one Update, by reason.
  struct Closed {
    uint64_t over_address_limit = 0;
    uint64_t no_message_in_time = 0;
  };

  // Starts watching `socket`'s connections; call before it binds, so that
  // no connection goes unseen. `name` (e.g. "server at tcp://*:0") starts
  // its log lines until SetLimits names the server.
  static absl::StatusOr<std::unique_ptr<AcceptedConnections>> Create(zmq::context_t& context, zmq::socket_t& socket,
                                                                     Limits limits, std::string name);
  ~AcceptedConnections();

  // The limits of the config the server registered with, and its name.
  void SetLimits(Limits limits, std::string name);

  // The monitor's socket, to poll with the data socket: its events wake the
  // engine thread.
  zmq::socket_t& monitor() { return monitor_; }

  // Takes the monitor's queued events in, closing connections over the
  // per-address limit, then those past their deadline; returns how many
  // were closed, by reason (logged at most once a second per reason, naming
  // the address and why).
  Closed Update(Clock::time_point now);

  // The connection that `frame` (a frame of a received message) came on
  // carried a valid message: no deadline applies to it any more.
  void Proven(const zmq::message_t& frame);

  // Stops the monitor. REQUIRES: before the watched socket is closed
  // (libzmq's I/O thread reports to the monitor with a blocking send).
  void Stop();

 private:
  struct Connection {
    std::string address;  // the peer's IP, as getpeername(2) gave it at accept
    uint16_t port = 0;
    Clock::time_point taken_in;
    bool counted = false;  // in per_address_ (once the events queued with its accept are in)
    bool proven = false;
    bool closing = false;  // shut down, its DISCONNECTED event not yet taken in
  };
  // One rate-limited log line's state.
  struct Said {
    uint64_t count = 0;
    Clock::time_point next{};
  };

  AcceptedConnections(zmq::socket_t monitor, void* watched, Limits limits, std::string name)
      : monitor_(std::move(monitor)), watched_(watched), limits_(limits), name_(std::move(name)) {}

  // Takes the queued events in, closing connections over the address limit.
  void TakeEvents(Clock::time_point now);
  void Disconnected(int fd);
  // `c` stops being idle (proven, closing or gone).
  void NoLongerIdle(Connection& c);
  // shutdown(2) of `fd` if its peer is still `c`'s; marks it closing.
  void Close(int fd, Connection& c);
  void Say(Said& said, const std::string& address, const std::string& why, Clock::time_point now);

  zmq::socket_t monitor_;
  void* watched_;  // the data socket's handle; null once Stop()ped
  Limits limits_;
  std::string name_;
  absl::flat_hash_map<int, Connection> connections_;  // by descriptor
  absl::flat_hash_map<std::string, uint32_t> per_address_;
  uint32_t idle_ = 0;  // counted, not proven, not closing
  // Not proven when taken in, in the order taken in (so by deadline): a
  // descriptor, and when it was taken in (an entry whose connection has
  // gone, or was replaced on a reused descriptor, is skipped).
  std::deque<std::pair<int, Clock::time_point>> deadlines_;
  Said over_address_, no_message_;
  Closed closed_;  // since the last Update
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_ACCEPTED_CONNECTIONS_H_
