// The worker's data plane: one DEALER socket per server and the table of
// requests waiting for answers. There is no I/O thread: a caller of Submit()
// sends on the socket itself (payloads zero-copy from its buffer), and a
// caller of Wait() drains answers itself, so a request and its answer cross
// no thread hand-off. With several waiting threads one of them polls (the
// "poller") and the others sleep until their handle is done or the poller
// role is free. Answers are matched by request id and copied straight into
// the caller's output buffer (or handed to its AnswerHandler). One thread of
// its own watches the connections: a request waits for a connection that
// completed its handshake, and goes out, in request-id order, once there is
// one (see WatchConnection).
//
// Thread-safe. Lock order: io_mu_ (the sockets) before mu_ (the tables).
#ifndef SHARDPS_WORKER_DATA_CHANNEL_H_
#define SHARDPS_WORKER_DATA_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/peer_seal.h"
#include "common/security.h"
#include "proto/data.pb.h"

namespace shardps {

// How the channel watches its connections (SetHeartbeats). TCP alone notices
// a peer that went silent only when its retransmissions give up, and after a
// cut heals it sends again only at its next backed-off retransmission (a
// minute after a 30 s cut): a connection whose bytes (PINGs every
// `heartbeat_interval`, or a frame) stay unacknowledged for
// `heartbeat_timeout`, or that carries no whole message for `silent_timeout`,
// ends; the socket connects again, and what waited for the server is sent
// again on the new connection.
struct ConnectionWatch {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration silent_timeout = absl::Seconds(30);
};

class DataChannel {
 public:
  // One data request: where it goes and, for answers with weights, where the
  // weights land. `payload` (may be null) is borrowed until the handle is done.
  // Handles an answer's payload (on the I/O thread); the status fails the request.
  using AnswerHandler = std::function<absl::Status(const DataHeader& answer, const zmq::message_t& payload)>;

  struct Request {
    uint32_t server = 0;
    DataHeader header;  // op, partition, round, epoch, num_elements set by the caller
    // The payload: raw fp32 borrowed from the caller (num_elements floats), or
    // an owned encoded frame when `encoded` is non-empty.
    const float* payload = nullptr;
    zmq::message_t encoded;
    // The answer: raw fp32 copied to `out` (num_elements floats), or passed to
    // `on_answer` when set (decoding, optimizer steps).
    float* out = nullptr;
    AnswerHandler on_answer;
  };

  // Where a server is reached: its ZeroMQ endpoint and, when its socket is a
  // CURVE server, its Z85 public key (the channel then encrypts with it).
  struct ServerEndpoint {
    std::string address;
    std::string curve_public_key;  // empty: plain
    // With a key: messages are sealed with AES-256-GCM (common/peer_seal.h)
    // on a plain socket instead of CURVE.
    bool sealed = false;
  };

  // Connects to `servers` (index = server index). CURVE servers are reached
  // with `curve_keys` (this worker's registered pair; null: a fresh pair).
  static absl::StatusOr<std::unique_ptr<DataChannel>> Create(const std::vector<ServerEndpoint>& servers,
                                                             uint32_t worker_rank,
                                                             const CurveKeyPair* curve_keys = nullptr,
                                                             ConnectionWatch watch = {});
  ~DataChannel();

  // Sends all `requests` as one handle. `what` names the operation in errors
  // (e.g. "PushPull of 'fc1.weight' round 3"). One to a server declared dead,
  // or past those the channel reaches, fails at once.
  uint64_t Submit(std::vector<Request> requests, std::string what);

  // Waits until every request of `handle` is answered; releases the handle
  // (also on timeout: the error names the servers still owing an answer).
  // A released handle's payloads are no longer read: a connection still
  // sending one from its caller's buffer (a slow link after a hand-off or
  // at a timeout) is made again first, which adds a moment to the wait.
  absl::Status Wait(uint64_t handle, absl::Duration timeout);
  // Waits until one of `handles` is answered in full and returns its index;
  // that handle is released and its result stored in *status. The others
  // stay outstanding. DEADLINE_EXCEEDED when none is done within `timeout`
  // (zero: answers already queued are taken, then it returns at once), and
  // then no handle is released; INVALID_ARGUMENT for an unknown handle. As
  // with Wait, the released handle's payloads are no longer read.
  absl::StatusOr<size_t> WaitAny(absl::Span<const uint64_t> handles, absl::Duration timeout, absl::Status* status);

  // Drops what is queued for `server` and not written to its connection yet
  // (the scheduler declared it dead), once, before its requests are re-sent
  // elsewhere: held for a reconnection, they would, should a replacement
  // listen at the same address, go to it after their re-sent copies were
  // answered. The socket is made anew, and what its connection held goes.
  void DropQueued(uint32_t server);

  // Fails every request to `server`, waiting or submitted later, with
  // `status` (the scheduler declared the server dead): no caller waits out
  // its timeout for an answer that cannot come. The first status sticks.
  void FailServer(uint32_t server, const absl::Status& status);
  // FailServer for every server, for good (this worker was removed from the
  // job): Readdress never undoes it.
  void FailAll(const absl::Status& status);

  // Sends every waiting request for a partition in `primary_of` (partition id
  // -> server index) that now lives on another server there, with the same
  // request id (the new primary recognises a retry) and shard-map `epoch`;
  // and every other one routed to a server in `replaced` to it again: another
  // process took its place (its queue dropped with DropQueued), which never
  // got them. Each request is sent once, in request-id order (one moved to a
  // replaced server is not sent there twice), at once or, to a server not
  // connected yet, once it is. Returns how many are re-sent.
  int Reroute(const absl::flat_hash_map<uint64_t, uint32_t>& primary_of, uint64_t epoch,
              absl::Span<const uint32_t> replaced = {});

  // Server index `server` is live at `endpoint` (e.g. a server took a dead
  // one's place, at another address or the same): requests to it are sent
  // again, and a new socket connects there, with the new CURVE key if it has
  // one, unless address and key are the ones it has. The index one past the
  // last is a server that joined the job: the channel connects to it.
  absl::Status Readdress(uint32_t server, const ServerEndpoint& endpoint);
  // How many servers the channel reaches (index = server index).
  size_t servers() const;

  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  uint64_t requests_sent() const { return requests_sent_.load(std::memory_order_relaxed); }
  // Connections that broke after their handshake, and the requests that
  // waited on them and were sent again on the next (see WatchConnection).
  uint64_t connection_breaks() const { return connection_breaks_.load(std::memory_order_relaxed); }
  uint64_t requests_resent() const { return requests_resent_.load(std::memory_order_relaxed); }
  // The completed rounds of the weights last handed back for `partition`: by
  // the Wait or WaitAny that returned their handle, not when they arrived (0
  // before any). A caller that keeps several steps in flight computes on
  // what it has waited for, and an answer that arrived meanwhile is not that.
  uint64_t weights_version(uint64_t partition) const {
    absl::MutexLock lock(&mu_);
    auto it = versions_.find(partition);
    return it == versions_.end() ? 0 : it->second;
  }
  // Per partition id, the pushes (PUSH, PUSH_PULL) answered OK: how many,
  // and the PushDigest of their request ids summed.
  struct AckedPushes {
    uint64_t count = 0;
    uint64_t digest = 0;
  };
  absl::flat_hash_map<uint64_t, AckedPushes> acked_pushes() const {
    absl::MutexLock lock(&mu_);
    return acked_pushes_;
  }

 private:
  struct Pending {
    uint64_t handle;
    uint32_t server;
    uint64_t partition;
    uint64_t num_elements;
    float* out;
    AnswerHandler on_answer;
    // What a failover re-sends: the header and the payload (borrowed raw
    // floats, or a reference to the encoded frame).
    DataHeader header;
    const float* payload = nullptr;
    zmq::message_t encoded;
  };
  // The seal toward a sealed server; an error when this worker has no keys.
  absl::StatusOr<PeerSeal*> SealFor(const ServerEndpoint& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Sets `socket` up to reach `endpoint` (server index `server`, for
  // errors): a CURVE client with its key, or plain where it is sealed or
  // plain. Returns the seal toward a sealed server, else null.
  absl::StatusOr<PeerSeal*> Secure(zmq::socket_t& socket, size_t server, const ServerEndpoint& endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // A server's socket, its connection monitor (the PAIR socket its
  // connection events arrive on) and the seal toward it (null: CURVE or
  // plain).
  struct ServerSocket {
    zmq::socket_t socket, monitor;
    PeerSeal* seal = nullptr;
  };
  // Opens a socket to `endpoint` (server index `index`, for errors) with its
  // options, security and monitor, and connects it.
  absl::StatusOr<ServerSocket> OpenSocket(size_t index, const ServerEndpoint& endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Opens the socket of server index servers() (one more server).
  absl::Status AddServer(const ServerEndpoint& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Replaces `server`'s socket (and what its connection holds) by a new one
  // connected to `endpoint`. Not the old socket disconnected and connected
  // again: the old connection could report its handshake after that, which
  // was taken for the new one's, and what was sent then went to the closing
  // connection and was lost (review20).
  absl::Status ReplaceSocket(uint32_t server, const ServerEndpoint& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // ReplaceSocket to where `server` is reached now (what its connection
  // held goes); false, logged, where no new socket could be made.
  bool RemakeSocket(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the connection watcher poll the monitors again (or stop).
  void WakeWatcher();
  // Handles what `server`'s connection monitor reports. A connection that
  // broke after its handshake lost the bytes in flight on it (ZeroMQ drops
  // what its queue held with it: ZMQ_IMMEDIATE), so every request waiting
  // for the server is held to be sent again, with its request id (the
  // server takes one it has for a retry), once a connection is made again.
  void WatchConnection(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Holds request `id` for `server` until Flush sends it.
  void Hold(uint32_t server, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) { unsent_[server].insert(id); }
  // Sends what is held for `server`, in request-id order, while it has a
  // connection that completed its handshake; returns how many were sent.
  int Flush(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // The payload frames of one handle that ZeroMQ still holds, sent from the
  // caller's buffer without a copy: the handle is released only once there
  // are none (AwaitReleased). ZeroMQ lets a frame go once its last byte is
  // written, which is before its answer can come unless the frame was sent
  // twice (a re-route) or the wait ended first (a timeout, a failure).
  // Reference-counted: by its handle, then by AwaitReleased, and by each
  // frame (ZeroMQ's free function runs on its I/O thread, and may still be
  // unlocking `mu` as the last wait for it ends).
  struct BorrowedFrames {
    absl::Mutex mu;
    int held ABSL_GUARDED_BY(mu) = 0;
    // The sockets they went out on (server index, socket).
    absl::InlinedVector<std::pair<uint32_t, void*>, 2> sockets ABSL_GUARDED_BY(mu);
    std::string what ABSL_GUARDED_BY(mu);  // the handle's, once released
    std::atomic<int> refs{1};
  };
  struct BorrowedFramesUnref {
    void operator()(BorrowedFrames* b) const {
      if (b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
    }
  };
  using BorrowedFramesPtr = std::unique_ptr<BorrowedFrames, BorrowedFramesUnref>;
  // A frame of `bytes` from `payload`, counted in `borrowed` until ZeroMQ
  // lets it go (ReleaseFrame, whose hint is `borrowed` itself: ZeroMQ hands
  // it over through its own queue, which a thread sanitizer cannot see, so
  // nothing but the atomic count and the mutex is read before the lock).
  zmq::message_t Borrow(BorrowedFrames* borrowed, uint32_t server, const float* payload, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  static void ReleaseFrame(void* data, void* hint);
  // Returns once ZeroMQ holds none of `borrowed`'s frames: at once as a
  // rule; else, after a moment, the connections still sending them are made
  // again (what they held goes) and what waited for those servers is sent
  // again on the new ones. Takes io_mu_: called with no lock held.
  void AwaitReleased(BorrowedFramesPtr borrowed);
  // Holds every request waiting for `server`, to be sent again in request-id
  // order on its next connection; returns how many.
  size_t HoldWaiting(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_, mu_);
  // Where `server` is reached now.
  ServerEndpoint EndpointOf(uint32_t server) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_, mu_);
  // Sends one request (header, then its payload if any) on `server`'s
  // socket; false when the socket has no connection to take it. A raw
  // `payload` goes without a copy, counted in `borrowed`.
  bool SendRequest(uint32_t server, DataHeader& header, const float* payload, zmq::message_t* encoded,
                   BorrowedFrames* borrowed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  struct HandleState {
    std::string what;
    size_t remaining = 0;
    absl::Status status;
    std::vector<uint64_t> request_ids;
    // (partition, completed rounds) of each answer with weights, made the
    // partitions' weights_version once the handle is handed back.
    absl::InlinedVector<std::pair<uint64_t, uint64_t>, 2> versions;
    // A WaitAny holds it: another thread's wait is refused, since the one
    // that completes it erases this state under the other's feet.
    bool waited = false;
    BorrowedFramesPtr borrowed;  // null: nothing sent from the caller's buffer
  };

  DataChannel(zmq::context_t context, uint32_t rank, ConnectionWatch watch);
  // The connection watcher's loop (see watcher_).
  void WatchLoop();
  // Receives and handles every answer already queued; returns how many.
  int DrainReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  void Receive(size_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Ends request `request_id` with `status`; `version`: the completed rounds
  // of the weights its answer carried, if any.
  void Complete(uint64_t request_id, const absl::Status& status, std::optional<uint64_t> version = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases handle `it`, handed back to the caller with `status`: its answers'
  // versions become the partitions' weights_version when it succeeded.
  // Returns its borrowed frames, for AwaitReleased once mu_ is let go.
  [[nodiscard]] BorrowedFramesPtr HandBack(absl::node_hash_map<uint64_t, HandleState>::iterator it,
                                           const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the sockets' file descriptors (and the wake-up eventfd) for at most
  // `timeout`, without holding io_mu_.
  void PollFds(absl::Duration timeout);
  void WakePoller();
  std::string Outstanding(const HandleState& h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  zmq::context_t context_;
  // By server index; grown (with the vectors below) by AddServer only.
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> server_keys_ ABSL_GUARDED_BY(mu_);  // CURVE public keys; empty: plain
  const uint32_t rank_;
  const ConnectionWatch watch_;

  absl::Mutex io_mu_;
  std::vector<zmq::socket_t> servers_ ABSL_GUARDED_BY(io_mu_);
  // Per server: the PAIR socket its connection events arrive on, and whether
  // its connection broke and is not back yet (see WatchConnection).
  std::vector<zmq::socket_t> monitors_ ABSL_GUARDED_BY(io_mu_);
  std::vector<bool> reconnecting_ ABSL_GUARDED_BY(io_mu_);
  // Per server: whether it has a connection that completed its handshake
  // (and no break was reported since). Only then is anything sent to it.
  std::vector<bool> connected_ ABSL_GUARDED_BY(io_mu_);
  // Per server: the ids of requests waiting to be sent to it, in order (no
  // connection yet, or the one they went out on broke). An id no longer
  // waiting, or moved to another server, is skipped.
  std::vector<absl::btree_set<uint64_t>> unsent_ ABSL_GUARDED_BY(io_mu_);
  // Sealed servers: this worker's seals (null without own keys) and each
  // server's (null: CURVE or plain).
  std::unique_ptr<PeerSeals> seals_ ABSL_GUARDED_BY(io_mu_);
  std::vector<PeerSeal*> seal_of_server_ ABSL_GUARDED_BY(io_mu_);
  DataHeader response_ ABSL_GUARDED_BY(io_mu_);
  // Per server, its socket's ZMQ_FD then its monitor's.
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  int wake_fd_ = -1;      // eventfd: a sender drained answers a poller may wait for
  // The connection watcher: a thread that handles the monitors' events as
  // they come (WatchConnection, then Flush), so that requests held for a
  // connection go out once it is made, whether or not anyone calls into the
  // channel. It takes io_mu_ only on an event.
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  int watch_fd_ = -1;  // eventfd: stop, or a monitor joined or changed (poll it too)
  uint64_t sockets_opened_ ABSL_GUARDED_BY(io_mu_) = 0;  // names each monitor's inproc endpoint

  mutable absl::Mutex mu_;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // node_hash_map: a waiter keeps a reference across unlocks while others insert.
  absl::node_hash_map<uint64_t, HandleState> handles_ ABSL_GUARDED_BY(mu_);
  bool poller_active_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> failed_ ABSL_GUARDED_BY(mu_);  // per server; ok = serving
  absl::Status removed_ ABSL_GUARDED_BY(mu_);  // FailAll's status: sticks
  absl::flat_hash_map<uint64_t, AckedPushes> acked_pushes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> versions_ ABSL_GUARDED_BY(mu_);  // see weights_version

  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, requests_sent_{0};
  std::atomic<uint64_t> connection_breaks_{0}, requests_resent_{0};
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_DATA_CHANNEL_H_
