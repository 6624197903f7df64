// Sealed data-plane messages (security.data_cipher AES_256_GCM, the default
// of a secured cluster): the ZeroMQ socket is plain, and every message between
// two nodes is encrypted and authenticated with AES-256-GCM under keys only
// those two nodes can compute. Each node's identity is its Curve25519 key pair
// (the one CURVE would use): public keys travel through the TLS-protected
// control plane (the shard map), and a pair's keys come from X25519 of one
// node's secret and the other's public key, hashed with both public keys
// (SHA-512), one key per direction.
//
// Wire form of a sealed message, replacing [header][payload?]:
//   envelope: [sender public key 32][counter 8, LE][payload tag 16]
//             [header ciphertext][header tag 16]
//   payload:  [payload ciphertext] (as long as the plaintext)
// The header's nonce is (0, counter) and its additional data the envelope's
// first 56 bytes, so the payload's tag, the counter and the sender are bound
// to it; the payload's nonce is (1, counter). A receiver takes each counter
// once: above the highest it accepted from that sender, or up to
// kReplayWindow below it and not yet seen (a sender's messages reach a
// server on one connection in order, but a reconnect can leave older ones
// queued on the old pipe), so a replayed message is refused. Keys are fresh
// per process and a sender's counter never restarts under a key (PeerSeals
// never forgets a peer), so no nonce is used twice; a process that forks
// must not send from the child with the parent's seals.
//
// Not thread-safe: a PeerSeal and a PeerSeals belong to the thread (or the
// lock) that owns the socket they serve.
#ifndef SHARDPS_COMMON_PEER_SEAL_H_
#define SHARDPS_COMMON_PEER_SEAL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security.h"
#include "proto/data.pb.h"

namespace shardps {

// Which end of the ZeroMQ connection a node is: the two ends derive the same
// pair of keys with send and receive swapped.
enum class SealEnd { kConnecting, kBinding };

// Bytes a sealed envelope adds to the serialised header.
inline constexpr size_t kSealedEnvelopeOverhead = 32 + 8 + 16 + 16;
// How far below the highest accepted counter a message may still open once.
inline constexpr uint64_t kReplayWindow = 1024;

// The sender's raw 32-byte public key of a sealed envelope, so a receiver can
// pick the PeerSeal; InvalidArgument when the frame is too short to be one.
absl::StatusOr<absl::string_view> SealedSender(const zmq::message_t& envelope);

// Raw 32 bytes of a Z85 (40-character) key; InvalidArgument otherwise.
absl::StatusOr<std::string> DecodeZ85Key(absl::string_view z85);

// The keys and counters between this node and one peer.
class PeerSeal {
 public:
  // `own`: this node's key pair (Z85); `peer_public`: the peer's (Z85).
  static absl::StatusOr<std::unique_ptr<PeerSeal>> Create(const CurveKeyPair& own, absl::string_view peer_public,
                                                          SealEnd end);
  ~PeerSeal();
  PeerSeal(const PeerSeal&) = delete;
  PeerSeal& operator=(const PeerSeal&) = delete;

  // Seals the serialised `header` and `payload_bytes` bytes at `payload`
  // (none: null/0) into *envelope and, with a payload, *sealed_payload.
  absl::Status Seal(absl::string_view header, const void* payload, size_t payload_bytes, zmq::message_t* envelope,
                    zmq::message_t* sealed_payload);

  // Checks `envelope` (and `payload`, decrypted in place; null: none) and
  // puts the header's bytes in *header. PermissionDenied for a message not
  // sealed by this peer for this node, tampered with, or with a header over
  // kMaxHeaderBytes (refused before any work); AlreadyExists for a replayed
  // one or one older than the window. On error nothing is accepted: the
  // counters stay, and *payload's bytes are garbage the caller must drop.
  absl::Status Open(const zmq::message_t& envelope, zmq::message_t* payload, std::string* header);

  // Messages refused by Open so far.
  uint64_t refused() const { return refused_; }

 private:
  struct Cipher;
  PeerSeal(std::string own_public_raw, std::unique_ptr<Cipher> sealer, std::unique_ptr<Cipher> opener);

  const std::string own_public_raw_;  // first bytes of every envelope
  std::unique_ptr<Cipher> sealer_, opener_;
  // Whether `counter` may still be accepted (neither seen nor too old).
  bool Fresh(uint64_t counter) const;
  // Records `counter` as accepted.
  void Accept(uint64_t counter);

  uint64_t next_counter_ = 1;   // the next message sealed
  uint64_t last_opened_ = 0;    // the highest counter accepted
  // Bit i: counter last_opened_ - i was accepted (i < kReplayWindow).
  std::array<uint64_t, kReplayWindow / 64> seen_{};
  uint64_t refused_ = 0;
  std::string opened_header_;  // Open's scratch
};

// A data message through `seal`: `header` (its protocol version stamped, as
// HeaderFrame does) and, when `has_payload`, the `payload_bytes` bytes at
// `payload` (which may be empty) into the envelope frame and the sealed
// payload frame.
absl::Status SealMessage(PeerSeal& seal, DataHeader& header, bool has_payload, const void* payload,
                         size_t payload_bytes, zmq::message_t* envelope, zmq::message_t* sealed_payload);
// Opens a sealed message (PeerSeal::Open) and parses its header into *header
// (ParseDataHeaderInto's checks). On error *payload is garbage.
absl::Status OpenMessage(PeerSeal& seal, const zmq::message_t& envelope, zmq::message_t* payload,
                         DataHeader* header);

// Every peer one socket (or a node's set of sockets) talks to, by public key,
// with the admitted set: a node that leaves the shard map is refused, and one
// that comes back gets its old PeerSeal again, counters included.
class PeerSeals {
 public:
  PeerSeals(CurveKeyPair own, SealEnd end) : own_(std::move(own)), end_(end) {}

  // The PeerSeal for the peer with Z85 public key `peer_public` (made on
  // first use); an error for a malformed key.
  absl::StatusOr<PeerSeal*> For(absl::string_view peer_public);
  // Replaces the admitted set with these Z85 keys (others are skipped).
  void Admit(const std::vector<std::string>& z85_keys);
  // The PeerSeal of an admitted sender (raw 32-byte key); null if it is not.
  PeerSeal* Admitted(absl::string_view sender_raw);
  // This node's key pair.
  const CurveKeyPair& own() const { return own_; }

 private:
  const CurveKeyPair own_;
  const SealEnd end_;
  absl::flat_hash_map<std::string, std::unique_ptr<PeerSeal>> by_raw_key_;
  absl::flat_hash_set<std::string> admitted_;  // raw keys
};

}  // namespace shardps

#endif  // SHARDPS_COMMON_PEER_SEAL_H_
