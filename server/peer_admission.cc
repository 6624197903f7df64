#include "server/peer_admission.h"

#include "absl/strings/str_cat.h"

namespace shardps {
namespace {

absl::string_view Key(const zmq::message_t& peer) {
  return absl::string_view(static_cast<const char*>(peer.data()), peer.size());
}

// An answer payload on its way out, and the peer count it is charged to.
struct Charged {
  zmq::message_t payload;
  std::shared_ptr<std::atomic<uint64_t>> count;
  // Released by the engine thread once filled in, acquired by ZeroMQ's I/O
  // thread that frees the answer: the hand-off through libzmq's own queues
  // is invisible to ThreadSanitizer (libzmq is not instrumented), this is
  // not, and it costs one uncontended atomic per answer.
  std::atomic<bool> filled{false};
};

}  // namespace

PeerAdmission::Verdict PeerAdmission::Admit(const zmq::message_t& peer, const std::string& who, absl::Status* error,
                                            bool* new_peer) {
  const auto now = std::chrono::steady_clock::now();
  auto it = peers_.find(Key(peer));
  if (it == peers_.end()) {
    if (peers_.size() >= max_peers_ && !EvictIdle()) {
      *error = absl::ResourceExhaustedError(absl::StrCat(
          "server is answering ", peers_.size(), " peers with answers still in flight (limits.max_connections_per_",
          "server ", max_peers_, "); refusing a request from a new peer (", who, ")"));
      return Verdict::kOverPeers;
    }
    it = peers_.emplace(std::string(Key(peer)), std::make_shared<Peer>()).first;
    if (new_peer != nullptr) *new_peer = true;
  }
  Peer& p = *it->second;
  p.last_seen = now;
  const uint64_t inflight = p.inflight.load(std::memory_order_relaxed);
  if (inflight >= max_inflight_) {
    *error = absl::ResourceExhaustedError(absl::StrCat(
        who, " has ", inflight, " bytes of answers it has not read yet (limits.max_inflight_bytes_per_worker ",
        max_inflight_, "); read the answers before sending more requests"));
    return Verdict::kOverInflight;
  }
  return Verdict::kAdmitted;
}

zmq::message_t PeerAdmission::Track(const zmq::message_t& peer, zmq::message_t payload) {
  auto it = peers_.find(Key(peer));
  if (it == peers_.end()) return payload;
  // The count lives as long as any answer charged to it (aliasing pointer).
  std::shared_ptr<std::atomic<uint64_t>> count(it->second, &it->second->inflight);
  const size_t bytes = payload.size();
  count->fetch_add(bytes, std::memory_order_relaxed);
  auto* charged = new Charged{std::move(payload), std::move(count)};
  charged->filled.store(true, std::memory_order_release);
  return zmq::message_t(
      charged->payload.data(), bytes,
      [](void*, void* hint) {
        auto* c = static_cast<Charged*>(hint);
        (void)c->filled.load(std::memory_order_acquire);
        c->count->fetch_sub(c->payload.size(), std::memory_order_relaxed);
        delete c;
      },
      charged);
}

bool PeerAdmission::EvictIdle() {
  auto oldest = peers_.end();
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->second->inflight.load(std::memory_order_relaxed) != 0) continue;
    if (oldest == peers_.end() || it->second->last_seen < oldest->second->last_seen) oldest = it;
  }
  if (oldest == peers_.end()) return false;
  peers_.erase(oldest);
  return true;
}

}  // namespace shardps
