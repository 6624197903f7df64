// What a server lets one peer (a worker's or another server's connection,
// told apart by its ZeroMQ routing id) make it hold: the bytes of answers
// handed to the socket and not yet written to the peer's TCP connection
// (a reader that never reads would otherwise pin a copy of the weights per
// answer), and how many peers it tracks at all.
//
// Admit() is called per request before the engine sees it and costs one hash
// lookup; Track() wraps an answer's payload so that ZeroMQ's I/O thread
// releases its bytes from the peer's count once sent. Admit/Track run on
// the engine thread only; the counts are atomics shared with the I/O thread.
#ifndef SHARDPS_SERVER_PEER_ADMISSION_H_
#define SHARDPS_SERVER_PEER_ADMISSION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardps {

class PeerAdmission {
 public:
  // max_inflight_bytes: per peer; max_peers: peers tracked at once (an idle
  // peer with nothing in flight is forgotten to make room for a new one).
  PeerAdmission(uint64_t max_inflight_bytes, uint32_t max_peers)
      : max_inflight_(max_inflight_bytes), max_peers_(max_peers) {}

  enum class Verdict { kAdmitted, kOverInflight, kOverPeers };
  // Whether a request from `peer` may be handled; `error` then says why not,
  // naming `who` (e.g. "worker 3"). `*new_peer` (if given) is set when
  // `peer` was not tracked before this request: the first admitted request
  // of a connection (or of one forgotten as idle), which the server's
  // AcceptedConnections takes as the connection's proof.
  Verdict Admit(const zmq::message_t& peer, const std::string& who, absl::Status* error, bool* new_peer = nullptr);

  // Returns a message with `payload`'s bytes that counts against `peer`
  // until ZeroMQ has sent it. REQUIRES: Admit(peer) was called.
  zmq::message_t Track(const zmq::message_t& peer, zmq::message_t payload);

  size_t peers() const { return peers_.size(); }
  // Whether `peer` (a routing id) is among the peers tracked now.
  bool Tracks(absl::string_view peer) const { return peers_.contains(peer); }

 private:
  struct Peer {
    std::atomic<uint64_t> inflight{0};
    std::chrono::steady_clock::time_point last_seen;
  };
  // Forgets the least recently seen peer with nothing in flight; false if none.
  bool EvictIdle();

  const uint64_t max_inflight_;
  const uint32_t max_peers_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_PEER_ADMISSION_H_
