#include "worker/data_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include <glog/logging.h>

#include "absl/algorithm/container.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_message.h"
#include "common/file_descriptors.h"
#include "common/names.h"
#include "common/protocol.h"
#include "common/security.h"

namespace shardps {
namespace {

// Longest a poller sleeps before looking again (a safety net; answers and
// wake-ups normally end the sleep at once).
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);
// How long a released handle's frame may stay with ZeroMQ before its
// connection is made again (see AwaitReleased): ZeroMQ lets a frame go
// microseconds after its last byte is written, unless its I/O thread waits
// for a core.
constexpr absl::Duration kReleaseGrace = absl::Milliseconds(100);

// The socket's ZMQ_EVENTS (which also processes its pending commands),
// retried when a signal interrupts it instead of throwing.
int SocketEvents(zmq::socket_t& socket) {
  for (;;) {
    try {
      return socket.get(zmq::sockopt::events);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataChannel>> DataChannel::Create(const std::vector<ServerEndpoint>& servers,
                                                                 uint32_t rank, const CurveKeyPair* curve_keys,
                                                                 ConnectionWatch watch) {
  // Every socket's connection is opened by ZeroMQ's I/O thread after the
  // socket is made, so each socket's check alone counted descriptors the
  // connections before it were about to take, and a connection that then
  // failed was retried unlogged until the requests timed out.
  // Three more: the context's own mailbox, wake_fd_ and watch_fd_; and each
  // socket's connection monitor.
  const int sockets = std::max<int>(static_cast<int>(servers.size()), 1);
  const int needed = 3 + kFirstSocketDescriptors + kSocketDescriptors * (sockets - 1) + kWatchDescriptors * sockets;
  if (absl::Status s = EnsureFreeDescriptors(needed, absl::StrCat("worker ", rank, ": sockets to ", servers.size(),
                                                                  " servers"));
      !s.ok()) {
    return s;
  }
  std::unique_ptr<DataChannel> channel(new DataChannel(zmq::context_t(1), rank, watch));
  channel->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  channel->watch_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (channel->wake_fd_ < 0 || channel->watch_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  {
    absl::MutexLock lock(&channel->io_mu_);
    if (curve_keys != nullptr) channel->seals_ = std::make_unique<PeerSeals>(*curve_keys, SealEnd::kConnecting);
    for (const ServerEndpoint& e : servers) {
      if (absl::Status s = channel->AddServer(e); !s.ok()) return s;
    }
  }
  DataChannel* raw = channel.get();
  channel->watcher_ = std::thread([raw] { raw->WatchLoop(); });
  return channel;
}

void DataChannel::WatchLoop() {
  for (;;) {
    std::vector<pollfd> fds;
    {
      absl::MutexLock lock(&mu_);  // a server that joins adds one
      fds.reserve(fds_.size() / 2 + 1);
      for (size_t i = 1; i < fds_.size(); i += 2) fds.push_back({fds_[i], POLLIN, 0});  // the monitors
    }
    fds.push_back({watch_fd_, POLLIN, 0});
    (void)poll(fds.data(), fds.size(), -1);
    if (fds.back().revents & POLLIN) {
      uint64_t count;
      (void)read(watch_fd_, &count, sizeof(count));
    }
    if (stop_watching_.load()) return;
    {
      absl::MutexLock io_lock(&io_mu_);
      // An exception would end the process that embeds the worker (a Python
      // interpreter): what failed is said, and the next event tries again.
      try {
        for (uint32_t s = 0; s < monitors_.size(); ++s) {
          WatchConnection(s);
          Flush(s);
        }
      } catch (const std::exception& e) {
        LOG(ERROR) << "worker " << rank_ << ": watching the data connections: " << e.what();
      }
    }
    // Reading a socket's events may consume its readiness signal: a poller
    // sleeping on answers that arrived meanwhile looks again.
    WakePoller();
  }
}

DataChannel::DataChannel(zmq::context_t context, uint32_t rank, ConnectionWatch watch)
    : context_(std::move(context)), rank_(rank), watch_(watch) {}

absl::StatusOr<PeerSeal*> DataChannel::Secure(zmq::socket_t& socket, size_t server, const ServerEndpoint& endpoint) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("server ", server, " at '", endpoint.address, "': ", why));
  };
  if (endpoint.curve_public_key.empty()) return nullptr;
  if (endpoint.sealed) {
    auto seal = SealFor(endpoint);
    if (!seal.ok()) return bad(seal.status().message());
    // A plain socket (unsetting the CURVE server flag drops any CURVE).
    socket.set(zmq::sockopt::curve_server, false);
    return *seal;
  }
  // Without this worker's own keys (security off), a fresh pair.
  if (absl::Status s = MakeCurveClient(socket, endpoint.curve_public_key, seals_ != nullptr ? &seals_->own() : nullptr);
      !s.ok()) {
    return bad(s.message());
  }
  return nullptr;
}

absl::StatusOr<DataChannel::ServerSocket> DataChannel::OpenSocket(size_t index, const ServerEndpoint& endpoint) {
  auto made = MakeSocket(context_, zmq::socket_type::dealer,
                         absl::StrCat("worker ", rank_, ": socket to server ", index, " at '", endpoint.address, "'"),
                         (servers_.empty() ? kFirstSocketDescriptors : kSocketDescriptors) + kWatchDescriptors);
  if (!made.ok()) return made.status();
  zmq::socket_t s = *std::move(made);
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.set(zmq::sockopt::linger, 0);
  // Messages only on a connection that completed its handshake, and what a
  // connection's queue holds goes when it breaks: ZeroMQ would otherwise
  // send it on the next connection by itself, ahead of the lost requests
  // before it, while nobody called into the channel (the server takes an
  // id below the last it applied for a retry: an update lost). Requests
  // wait in unsent_ instead, and are sent in order once connected.
  s.set(zmq::sockopt::immediate, 1);
  SetHeartbeats(s, static_cast<int>(absl::ToInt64Milliseconds(watch_.heartbeat_interval)),
                static_cast<int>(absl::ToInt64Milliseconds(watch_.heartbeat_timeout)),
                static_cast<int>(absl::ToInt64Milliseconds(watch_.silent_timeout)));
  absl::StatusOr<PeerSeal*> seal = Secure(s, index, endpoint);
  if (!seal.ok()) return seal.status();
  // inproc names are the channel's own: it has its own context.
  auto monitor = WatchConnections(context_, s, absl::StrCat("inproc://shardps-data-", sockets_opened_++),
                                  ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  if (!monitor.ok()) return absl::InternalError(absl::StrCat("server ", index, ": ", monitor.status().message()));
  try {
    s.connect(endpoint.address);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot connect to server ", index, " at '", endpoint.address, "': ", e.what()));
  }
  return ServerSocket{std::move(s), *std::move(monitor), *seal};
}

absl::Status DataChannel::AddServer(const ServerEndpoint& endpoint) {
  absl::StatusOr<ServerSocket> made = OpenSocket(servers_.size(), endpoint);
  if (!made.ok()) return made.status();
  const int fd = made->socket.get(zmq::sockopt::fd);
  const int monitor_fd = made->monitor.get(zmq::sockopt::fd);
  servers_.push_back(std::move(made->socket));
  monitors_.push_back(std::move(made->monitor));
  reconnecting_.push_back(false);
  connected_.push_back(false);
  unsent_.emplace_back();
  seal_of_server_.push_back(made->seal);
  absl::MutexLock lock(&mu_);
  addresses_.push_back(endpoint.address);
  server_keys_.push_back(endpoint.curve_public_key);
  failed_.push_back(removed_);  // a removed worker refuses the new server's requests too
  fds_.push_back(fd);
  fds_.push_back(monitor_fd);
  WakeWatcher();  // it polls the new monitor too
  return absl::OkStatus();
}

void DataChannel::WakeWatcher() {
  if (watch_fd_ < 0) return;
  const uint64_t one = 1;
  (void)write(watch_fd_, &one, sizeof(one));
}

size_t DataChannel::servers() const {
  absl::MutexLock lock(&mu_);
  return addresses_.size();
}

void DataChannel::FailServer(uint32_t server, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (server >= failed_.size() || !failed_[server].ok()) return;
    failed_[server] = status;
    std::vector<uint64_t> doomed;
    for (const auto& [id, p] : pending_) {
      if (p.server == server) doomed.push_back(id);
    }
    for (uint64_t id : doomed) Complete(id, status);
  }
  WakePoller();
}

void DataChannel::DropQueued(uint32_t server) {
  absl::MutexLock io_lock(&io_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (server >= failed_.size() || !failed_[server].ok()) return;  // failed already: dropped then
  }
  unsent_[server].clear();
  (void)RemakeSocket(server);
}

void DataChannel::FailAll(const absl::Status& status) {
  size_t servers;
  {
    absl::MutexLock lock(&mu_);
    if (removed_.ok()) removed_ = status;
    servers = failed_.size();
  }
  for (uint32_t s = 0; s < servers; ++s) FailServer(s, status);
}

absl::Status DataChannel::Readdress(uint32_t server, const ServerEndpoint& endpoint) {
  const std::string& address = endpoint.address;
  absl::MutexLock io_lock(&io_mu_);
  if (server > servers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("server ", server, " at '", address, "': the data channel has ",
                                                   servers_.size(), " servers and adds them in index order"));
  }
  if (server == servers_.size()) return AddServer(endpoint);  // one more server joined the job
  {
    absl::MutexLock lock(&mu_);
    if (addresses_[server] == address && server_keys_[server] == endpoint.curve_public_key) {
      // A replacement at the dead server's address: the socket reconnects
      // by itself; only the refusal goes.
      failed_[server] = removed_;
      return absl::OkStatus();
    }
  }
  if (absl::Status s = ReplaceSocket(server, endpoint); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  addresses_[server] = address;
  server_keys_[server] = endpoint.curve_public_key;
  failed_[server] = removed_;
  return absl::OkStatus();
}

DataChannel::ServerEndpoint DataChannel::EndpointOf(uint32_t server) const {
  return {addresses_[server], server_keys_[server], seal_of_server_[server] != nullptr};
}

bool DataChannel::RemakeSocket(uint32_t server) {
  ServerEndpoint endpoint;
  {
    absl::MutexLock lock(&mu_);
    endpoint = EndpointOf(server);
  }
  // What the connection's queue holds goes with its socket (linger 0).
  if (absl::Status s = ReplaceSocket(server, endpoint); !s.ok()) {
    LOG(ERROR) << "worker " << rank_ << ": cannot connect to server " << server << " again: " << s;
    return false;
  }
  return true;
}

absl::Status DataChannel::ReplaceSocket(uint32_t server, const ServerEndpoint& endpoint) {
  // What can fail comes before the old socket goes.
  absl::StatusOr<ServerSocket> made = OpenSocket(server, endpoint);
  if (!made.ok()) return made.status();
  const int fd = made->socket.get(zmq::sockopt::fd);
  const int monitor_fd = made->monitor.get(zmq::sockopt::fd);
  // The old socket's monitor stops first: ZeroMQ's I/O thread reports its
  // connections' ends to it with a blocking send, which with the reader
  // closed never returned and stalled every socket of the channel.
  (void)zmq_socket_monitor(servers_[server].handle(), nullptr, 0);
  servers_[server] = std::move(made->socket);  // closes the old one; linger 0 drops its queue
  monitors_[server] = std::move(made->monitor);
  seal_of_server_[server] = made->seal;
  connected_[server] = false;
  reconnecting_[server] = false;
  absl::MutexLock lock(&mu_);
  // Pollers that copied the old descriptors find them closed and copy again.
  fds_[2 * server] = fd;
  fds_[2 * server + 1] = monitor_fd;
  WakeWatcher();
  return absl::OkStatus();
}

DataChannel::~DataChannel() {
  if (watcher_.joinable()) {
    stop_watching_ = true;
    WakeWatcher();
    watcher_.join();
  }
  if (watch_fd_ >= 0) close(watch_fd_);
  {
    absl::MutexLock lock(&io_mu_);
    servers_.clear();
    monitors_.clear();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

uint64_t DataChannel::Submit(std::vector<Request> requests, std::string what) {
  uint64_t handle;
  int drained;
  bool held = false;
  BorrowedFrames* borrowed = nullptr;  // the handle's: it cannot be waited on before Submit returns
  {
    // Ids are taken and sent under io_mu_, so they reach each server in
    // increasing order whatever the number of calling threads (servers take
    // an older id from the same worker for a retry).
    absl::MutexLock io_lock(&io_mu_);
    // A broken connection seen first: nothing is sent ahead of the requests
    // it lost.
    for (uint32_t s = 0; s < monitors_.size(); ++s) WatchConnection(s);
    std::vector<uint64_t> ids(requests.size());
    std::vector<size_t> refused;  // requests to servers declared dead: never sent
    {
      absl::MutexLock lock(&mu_);
      handle = next_handle_++;
      HandleState& h = handles_[handle];
      h.what = std::move(what);
      h.remaining = requests.size();
      if (absl::c_any_of(requests, [](const Request& r) { return r.payload != nullptr; })) {
        h.borrowed.reset(new BorrowedFrames);
        borrowed = h.borrowed.get();
      }
      for (size_t i = 0; i < requests.size(); ++i) {
        ids[i] = next_request_id_++;
        Request& r = requests[i];
        r.header.set_request_id(ids[i]);
        r.header.set_worker_rank(rank_);
        Pending& p = pending_[ids[i]];
        p = Pending{handle, r.server, r.header.partition_id(), r.header.num_elements(), r.out,
                    std::move(r.on_answer), r.header, r.payload, zmq::message_t()};
        if (r.encoded.size() > 0) p.encoded.copy(r.encoded);  // shares the frame, no copy of the bytes
        h.request_ids.push_back(ids[i]);
        if (r.server >= failed_.size() || !failed_[r.server].ok()) refused.push_back(i);
      }
      for (size_t i : refused) {
        const uint32_t server = requests[i].server;
        // Past the channel's servers: one that joined the job whose
        // connection failed (the worker logged why) still has routes.
        Complete(ids[i], server < failed_.size()
                             ? failed_[server]
                             : absl::FailedPreconditionError(absl::StrCat(
                                   "this worker reaches ", failed_.size(), " servers, not server ", server,
                                   " (see its log for why it could not connect)")));
      }
    }
    for (size_t i = 0, next_refused = 0; i < requests.size(); ++i) {
      if (next_refused < refused.size() && refused[next_refused] == i) {
        ++next_refused;
        continue;
      }
      Request& r = requests[i];
      // Behind what waits for the server, or without a connection: held.
      if (!unsent_[r.server].empty() || !connected_[r.server] ||
          !SendRequest(r.server, r.header, r.payload, r.encoded.size() > 0 ? &r.encoded : nullptr, borrowed)) {
        Hold(r.server, ids[i]);
        held = true;
      }
    }
    if (held) {
      for (uint32_t s = 0; s < servers_.size(); ++s) Flush(s);
    }
    // Sending may consume the sockets' readiness signal: answers that became
    // readable meanwhile are handled here, or a poller could sleep on them.
    drained = DrainReady();
  }
  requests_sent_.fetch_add(requests.size(), std::memory_order_relaxed);
  if (drained > 0) WakePoller();
  return handle;
}

absl::StatusOr<PeerSeal*> DataChannel::SealFor(const ServerEndpoint& endpoint) {
  if (seals_ == nullptr) {
    return absl::FailedPreconditionError(
        "the server seals its data plane (security on) but this worker has no keys (its security config is off)");
  }
  return seals_->For(endpoint.curve_public_key);
}

zmq::message_t DataChannel::Borrow(BorrowedFrames* borrowed, uint32_t server, const float* payload, size_t bytes) {
  {
    absl::MutexLock lock(&borrowed->mu);
    ++borrowed->held;
    const std::pair<uint32_t, void*> socket(server, servers_[server].handle());
    if (!absl::c_linear_search(borrowed->sockets, socket)) borrowed->sockets.push_back(socket);
  }
  // Release, paired with ReleaseFrame's acquire: ZeroMQ's queue orders the
  // two already, but a thread sanitizer cannot see inside it.
  borrowed->refs.fetch_add(1, std::memory_order_release);
  try {
    return zmq::message_t(const_cast<float*>(payload), bytes, &DataChannel::ReleaseFrame, borrowed);
  } catch (...) {
    ReleaseFrame(nullptr, borrowed);  // ZeroMQ took nothing
    throw;
  }
}

void DataChannel::ReleaseFrame(void* /*data: the caller's*/, void* hint) {
  auto* borrowed = static_cast<BorrowedFrames*>(hint);
  (void)borrowed->refs.load(std::memory_order_acquire);  // see Borrow
  {
    absl::MutexLock lock(&borrowed->mu);
    --borrowed->held;
  }
  BorrowedFramesUnref()(borrowed);
}

void DataChannel::AwaitReleased(BorrowedFramesPtr borrowed) {
  if (borrowed == nullptr) return;
  auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(borrowed->mu) { return borrowed->held == 0; };
  absl::InlinedVector<std::pair<uint32_t, void*>, 2> sockets;
  std::string what;
  {
    absl::MutexLock lock(&borrowed->mu);
    if (borrowed->mu.AwaitWithTimeout(absl::Condition(&released), kReleaseGrace)) return;
    sockets = borrowed->sockets;
    what = borrowed->what;
  }
  {
    absl::MutexLock io_lock(&io_mu_);
    for (const auto& [server, socket] : sockets) {
      if (servers_[server].handle() != socket) continue;  // made anew since: what it held goes with the old one
      if (!RemakeSocket(server)) continue;
      absl::MutexLock lock(&mu_);
      const size_t waiting = HoldWaiting(server);
      requests_resent_.fetch_add(waiting, std::memory_order_relaxed);
      LOG(WARNING) << "worker " << rank_ << ": the connection to server " << server << " (" << addresses_[server]
                   << ") was still sending " << what
                   << " from its caller's buffer when its wait ended; it is made again, and what waited for "
                      "the server ("
                   << Counted(waiting, "request", "requests") << ") is sent again on the new one";
    }
  }
  // ZeroMQ lets the frames go as it closes the old connections.
  absl::MutexLock lock(&borrowed->mu);
  while (!borrowed->mu.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(5))) {
    LOG(WARNING) << "worker " << rank_ << ": " << what << ": ZeroMQ still holds " << borrowed->held
                 << " frames sent from the caller's buffer, 5 s after their connections were closed; the wait goes on";
  }
}

size_t DataChannel::HoldWaiting(uint32_t server) {
  size_t waiting = 0;
  for (const auto& [id, p] : pending_) {
    if (p.server != server) continue;
    Hold(server, id);
    ++waiting;
  }
  return waiting;
}

bool DataChannel::SendRequest(uint32_t server, DataHeader& header, const float* payload, zmq::message_t* encoded,
                              BorrowedFrames* borrowed) {
  const bool has_payload = payload != nullptr || encoded != nullptr;
  zmq::socket_t& socket = servers_[server];
  zmq::message_t head, frame;
  if (PeerSeal* seal = seal_of_server_[server]; seal != nullptr) {
    const void* bytes = encoded != nullptr ? encoded->data() : payload;
    const size_t size = encoded != nullptr ? encoded->size() : header.num_elements() * sizeof(float);
    if (absl::Status s = SealMessage(*seal, header, has_payload, bytes, size, &head, &frame);
        !s.ok()) {
      LOG(ERROR) << "worker " << rank_ << ": server " << server << ": " << s;
      return true;  // the request times out naming the server
    }
  } else {
    head = HeaderFrame(header);
    if (has_payload) {
      frame = encoded != nullptr ? std::move(*encoded)
                                 : Borrow(borrowed, server, payload, header.num_elements() * sizeof(float));
    }
  }
  // Without a connection (immediate) the socket refuses at once; a payload
  // refused after its header takes the header back with it.
  if (!SendRetrying(socket, head,
                    (has_payload ? zmq::send_flags::sndmore : zmq::send_flags::none) | zmq::send_flags::dontwait)) {
    return false;
  }
  if (!has_payload) return true;
  const size_t bytes = frame.size();
  if (!SendRetrying(socket, frame, zmq::send_flags::dontwait)) return false;
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

int DataChannel::Reroute(const absl::flat_hash_map<uint64_t, uint32_t>& primary_of, uint64_t epoch,
                         absl::Span<const uint32_t> replaced) {
  absl::MutexLock io_lock(&io_mu_);
  // A broken connection seen first (as in Submit).
  for (uint32_t s = 0; s < monitors_.size(); ++s) WatchConnection(s);
  int resent = 0;
  {
    absl::MutexLock lock(&mu_);
    // Each request once, in request-id order, as first sent: the new primary
    // takes a push whose id is not above the last it applied from this
    // worker for a retry.
    for (auto& [id, p] : pending_) {
      uint32_t server = p.server;
      if (auto it = primary_of.find(p.partition); it != primary_of.end() && it->second != p.server) {
        server = it->second;
      } else if (!absl::c_linear_search(replaced, p.server)) {
        continue;
      }
      if (server >= servers_.size()) continue;
      p.server = server;
      p.header.set_epoch(epoch);
      Hold(server, id);
      ++resent;
    }
  }
  for (uint32_t s = 0; s < servers_.size(); ++s) Flush(s);
  return resent;
}

int DataChannel::Flush(uint32_t server) {
  absl::btree_set<uint64_t>& ids = unsent_[server];
  if (ids.empty() || !connected_[server]) return 0;
  // Reading the events also takes in the socket's new connection.
  if (!(SocketEvents(servers_[server]) & ZMQ_POLLOUT)) return 0;
  int sent = 0;
  // Under mu_: a waiting request's payload is borrowed from its caller until
  // its handle is released, which takes mu_.
  absl::MutexLock lock(&mu_);
  for (auto it = ids.begin(); it != ids.end(); it = ids.erase(it)) {
    auto p = pending_.find(*it);
    if (p == pending_.end() || p->second.server != server) continue;  // answered, timed out, or moved
    Pending& request = p->second;
    // A copy of a borrowed payload, made while the handle is outstanding: an
    // earlier copy of the request (the old primary's, before a re-route) can
    // be answered while this one is still being sent, and its caller may
    // then reuse the buffer.
    const bool has_payload = request.encoded.size() > 0 || request.payload != nullptr;
    zmq::message_t frame;
    if (request.encoded.size() > 0) {
      frame.copy(request.encoded);
    } else if (request.payload != nullptr) {
      frame.rebuild(request.payload, request.num_elements * sizeof(float));
    }
    if (!SendRequest(server, request.header, nullptr, has_payload ? &frame : nullptr, nullptr)) break;
    ++sent;
  }
  return sent;
}

void DataChannel::WatchConnection(uint32_t server) {
  for (uint16_t what : TakeConnectionEvents(monitors_[server])) {
    absl::MutexLock lock(&mu_);
    const std::string& address = addresses_[server];
    if (what == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      // ZeroMQ handed the socket the new connection, and took the broken
      // one away, before it said so: reading the events takes both in now.
      // A send alone takes them in only if the socket has not done so in
      // the last millisecond, and could still write to the broken one.
      (void)SocketEvents(servers_[server]);
      connected_[server] = true;
      if (reconnecting_[server]) {
        reconnecting_[server] = false;
        LOG(INFO) << "worker " << rank_ << ": connected to server " << server << " (" << address << ") again";
      }
      continue;
    }
    // ZMQ_EVENT_DISCONNECTED. One that ended in its handshake carried
    // nothing (immediate: no queue before it): ZeroMQ makes it again by
    // itself, reconnect_ivl apart.
    if (!connected_[server]) continue;
    connected_[server] = false;
    reconnecting_[server] = true;
    // The broken connection lost what was in flight on it, and ZeroMQ
    // dropped what its queue held; ZeroMQ connects again by itself. Every
    // request waiting for the server is sent again on the next connection,
    // in request-id order. Nothing is sent before that: this event comes
    // before ZeroMQ takes the broken connection's queue away, and a request
    // written there meanwhile would be lost with it.
    const size_t waiting = HoldWaiting(server);
    connection_breaks_.fetch_add(1, std::memory_order_relaxed);
    requests_resent_.fetch_add(waiting, std::memory_order_relaxed);
    LOG_IF(WARNING, waiting > 0)
        << "worker " << rank_ << ": the connection to server " << server << " (" << address
        << ") broke (closed, nothing acknowledged within " << absl::FormatDuration(watch_.heartbeat_timeout)
        << ", or no message within " << absl::FormatDuration(watch_.silent_timeout)
        << "); what waited for it (" << Counted(waiting, "request", "requests") << ") is sent again on the next one";
  }
}

int DataChannel::DrainReady() {
  int handled = 0;
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    WatchConnection(s);
    Flush(s);
    while (SocketEvents(servers_[s]) & ZMQ_POLLIN) {
      Receive(s);
      ++handled;
    }
  }
  return handled;
}

void DataChannel::Receive(size_t server) {
  zmq::message_t head, payload;
  if (!servers_[server].recv(head, zmq::recv_flags::dontwait)) return;
  bool has_payload = false;
  bool more = head.more();
  if (more) {
    (void)servers_[server].recv(payload);
    has_payload = true;
    more = payload.more();
  }
  while (more) {
    zmq::message_t extra;
    (void)servers_[server].recv(extra);
    more = extra.more();
  }
  response_.Clear();
  PeerSeal* seal = seal_of_server_[server];
  absl::Status s = seal != nullptr ? OpenMessage(*seal, head, has_payload ? &payload : nullptr, &response_)
                                   : ParseDataHeaderInto(head.data(), head.size(), &response_);
  if (!s.ok()) {
    LOG(WARNING) << "worker " << rank_ << ": dropped a bad answer from server " << server << ": " << s;
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(response_.request_id());
  if (it == pending_.end()) return;  // its handle timed out; nothing waits for it
  const Pending& p = it->second;
  s = ResponseStatus(response_);
  if (has_payload) bytes_received_.fetch_add(payload.size(), std::memory_order_relaxed);
  // A sum-only or weight-delta answer of a round no worker pushed a gradient
  // to carries no aggregate or delta (DataHeader.no_gradient): the weights
  // stay as they are.
  const bool answered = has_payload || (response_.no_gradient() && p.on_answer);
  if (s.ok() && p.on_answer) {
    s = answered ? p.on_answer(response_, payload)
                 : absl::DataLossError(absl::StrCat("answer for partition ", p.partition, " has no payload"));
  } else if (s.ok() && p.out != nullptr) {
    const size_t bytes = p.num_elements * sizeof(float);
    if (!has_payload || !response_.codec().empty() || response_.num_elements() != p.num_elements ||
        payload.size() != bytes) {
      s = absl::DataLossError(absl::StrCat("answer for partition ", p.partition, " carries ",
                                           has_payload ? payload.size() : 0, " bytes, expected ", bytes));
    } else {
      std::memcpy(p.out, payload.data(), bytes);
    }
  }
  // A round this worker took no gradient to (SkipRound) leaves the weights it
  // holds as they are: they are of the round after it, and its next gradient
  // computed on them is no staler for the rounds no gradient moved.
  std::optional<uint64_t> version;
  if (answered) {
    version = response_.completed_rounds();
  } else if (p.header.no_gradient()) {
    version = p.header.round() + 1;
  }
  Complete(response_.request_id(), s, version);
}

void DataChannel::Complete(uint64_t request_id, const absl::Status& status, std::optional<uint64_t> version) {
  auto it = pending_.find(request_id);
  const Pending p = std::move(it->second);
  pending_.erase(it);
  if (status.ok() && (p.header.op() == PUSH || p.header.op() == PUSH_PULL)) {
    AckedPushes& acked = acked_pushes_[p.partition];
    ++acked.count;
    acked.digest += PushDigest(request_id);
  }
  HandleState& h = handles_[p.handle];
  if (!status.ok() && h.status.ok()) {
    h.status = absl::Status(status.code(), absl::StrCat(h.what, ": server ", p.server, " (",
                                                        p.server < addresses_.size() ? addresses_[p.server]
                                                                                     : "not connected",
                                                        "), partition ", p.partition, ": ", status.message()));
  }
  if (status.ok() && version) h.versions.emplace_back(p.partition, *version);
  --h.remaining;
}

void DataChannel::PollFds(absl::Duration timeout) {
  std::vector<pollfd> fds;
  {
    absl::MutexLock lock(&mu_);  // a server that joins adds one
    fds.reserve(fds_.size() + 1);
    for (int fd : fds_) fds.push_back({fd, POLLIN, 0});
  }
  fds.push_back({wake_fd_, POLLIN, 0});
  (void)poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(timeout)) + 1);
  uint64_t count;
  if (fds.back().revents & POLLIN) (void)read(wake_fd_, &count, sizeof(count));
}

void DataChannel::WakePoller() {
  {
    absl::MutexLock lock(&mu_);
    if (!poller_active_) return;
  }
  const uint64_t one = 1;
  (void)write(wake_fd_, &one, sizeof(one));
}

std::string DataChannel::Outstanding(const HandleState& h) const {
  std::vector<std::string> parts;
  for (uint64_t id : h.request_ids) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    parts.push_back(absl::StrCat("server ", it->second.server, " (", addresses_[it->second.server], ") partition ",
                                 it->second.partition));
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status DataChannel::Wait(uint64_t handle, absl::Duration timeout) {
  absl::Status status;
  absl::StatusOr<size_t> done = WaitAny(absl::MakeConstSpan(&handle, 1), timeout, &status);
  if (!done.ok() && (absl::IsInvalidArgument(done.status()) || absl::IsAborted(done.status()))) {
    return done.status();  // refused: nothing of it was ours
  }
  if (done.ok()) return status;
  // Wait's contract: a handle that timed out is released, naming who owes it.
  absl::Status result;
  BorrowedFramesPtr borrowed;
  {
    absl::MutexLock lock(&mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return done.status();
    if (it->second.waited) return done.status();  // another thread waits on it now and releases it
    result = it->second.status;  // answered since WaitAny gave up
    if (it->second.remaining > 0) {
      result = absl::DeadlineExceededError(absl::StrCat(
          it->second.what, ": no answer within ", absl::FormatDuration(timeout), " from ", Outstanding(it->second)));
      for (uint64_t id : it->second.request_ids) pending_.erase(id);
    }
    borrowed = HandBack(it, result);
  }
  AwaitReleased(std::move(borrowed));
  return result;
}

DataChannel::BorrowedFramesPtr DataChannel::HandBack(
    absl::node_hash_map<uint64_t, HandleState>::iterator it, const absl::Status& status) {
  if (status.ok()) {
    for (const auto& [partition, version] : it->second.versions) versions_[partition] = version;
  }
  BorrowedFramesPtr borrowed = std::move(it->second.borrowed);
  if (borrowed != nullptr) {
    absl::MutexLock lock(&borrowed->mu);
    if (borrowed->held > 0) borrowed->what = std::move(it->second.what);  // AwaitReleased says it
  }
  handles_.erase(it);
  return borrowed;
}

absl::StatusOr<size_t> DataChannel::WaitAny(absl::Span<const uint64_t> handles, absl::Duration timeout,
                                            absl::Status* status) {
  const absl::Time deadline = absl::Now() + timeout;
  mu_.Lock();
  // Stable: only a Wait(Any) of the handle erases it, and one at a time
  // holds it (`waited`). Inline: Wait passes one.
  absl::InlinedVector<HandleState*, 4> states;
  for (uint64_t handle : handles) {
    auto it = handles_.find(handle);
    absl::Status refused;
    if (it == handles_.end()) {
      refused = absl::InvalidArgumentError(absl::StrCat("unknown handle ", handle, " (already waited on?)"));
    } else if (it->second.waited) {
      refused = absl::AbortedError(
          absl::StrCat("handle ", handle, " (", it->second.what, ") is being waited on by another thread"));
    }
    if (!refused.ok()) {
      mu_.Unlock();
      return refused;
    }
    states.push_back(&it->second);
  }
  for (HandleState* state : states) state->waited = true;
  auto first_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t i = 0;
    while (i < states.size() && states[i]->remaining > 0) ++i;
    return i;
  };
  const size_t none = states.size();
  bool polling = false, drained_once = false;
  // At least one drain, so a zero timeout polls.
  while (first_done() == none && (!drained_once || absl::Now() < deadline)) {
    if (!polling && poller_active_) {
      if (absl::Now() >= deadline) break;
      // Another thread polls; sleep until one of ours is done or the role frees.
      auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return first_done() < none || !poller_active_; };
      mu_.AwaitWithDeadline(absl::Condition(&wake), deadline);
      drained_once = true;  // the poller drained meanwhile
      continue;
    }
    poller_active_ = polling = true;
    mu_.Unlock();
    int drained;
    {
      absl::MutexLock lock(&io_mu_);
      drained = DrainReady();
    }
    mu_.Lock();
    drained_once = true;
    if (drained > 0 || first_done() < none || absl::Now() >= deadline) continue;
    mu_.Unlock();
    PollFds(std::min(kPollSlice, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    mu_.Lock();
  }
  if (polling) poller_active_ = false;  // waking a sleeper to take over (Await re-checks)
  for (HandleState* state : states) state->waited = false;
  const size_t i = first_done();
  if (i == none) {
    mu_.Unlock();
    return absl::DeadlineExceededError(absl::StrCat("none of ", none, " requests answered within ",
                                                    absl::FormatDuration(timeout)));
  }
  *status = states[i]->status;
  BorrowedFramesPtr borrowed = HandBack(handles_.find(handles[i]), *status);
  mu_.Unlock();
  AwaitReleased(std::move(borrowed));
  return i;
}

}  // namespace shardps
