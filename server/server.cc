#include "server/server.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/cgroup_memory.h"
#include "common/data_message.h"
#include "common/config.h"
#include "common/endpoint.h"
#include "common/file_descriptors.h"
#include "common/heartbeat_log.h"
#include "common/protocol.h"
#include "common/scheduler_refusal.h"
#include "common/scheduler_client.h"
#include "common/peer_seal.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "server/accepted_connections.h"
#include "server/curve_authenticator.h"
#include "server/peer_admission.h"
#include "server/sender_roles.h"
#include "server/server_metrics.h"

namespace shardps {
namespace {

// Bytes this process can give partitions, told to the scheduler (which
// refuses a model that would give a server more): the machine's physical
// memory, or if less what its memory cgroup leaves (a container's limit, a
// systemd unit's MemoryMax, a Slurm job's --mem), or under an address-space
// limit (RLIMIT_AS: `prlimit --as`, `ulimit -v`) what it leaves above what
// the process maps now. Before 2026-11-26 only the physical memory: a
// server under such a limit accepted a model it could not hold and died of
// std::bad_alloc installing the map (chaos17), or was killed by the kernel
// (a cgroup). 0: unknown (not checked).
uint64_t MemoryBytesForPartitions() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (page <= 0) return 0;
  uint64_t bytes = pages > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  if (std::optional<uint64_t> cgroup = CgroupMemoryLeft(); cgroup && (bytes == 0 || *cgroup < bytes)) {
    bytes = std::max<uint64_t>(*cgroup, 1);
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return bytes;
  uint64_t mapped_pages = 0;
  std::ifstream("/proc/self/statm") >> mapped_pages;
  const uint64_t mapped = mapped_pages * static_cast<uint64_t>(page);
  const uint64_t left = limit.rlim_cur > mapped ? limit.rlim_cur - mapped : 1;
  return bytes == 0 ? left : std::min(bytes, left);
}

// Descriptors a server of `config` needs besides those it holds when it
// starts: its context and socket (kFirstSocketDescriptors) and the monitor
// of its connections (kWatchDescriptors), a connection from each worker,
// and per other server a connection from it and a DEALER to it (mailbox and
// connection, and its connection's monitor); a few for checkpoint files and
// the scheduler's channel.
int ServerDescriptors(const ClusterConfig& config) {
  const int others = std::max<int>(static_cast<int>(config.num_servers()) - 1, 0);
  return kFirstSocketDescriptors + kWatchDescriptors + static_cast<int>(config.num_workers()) +
         (1 + kSocketDescriptors + kWatchDescriptors) * others + 4;
}

// Also the heartbeats of its connections (SetHeartbeats): a worker's or
// primary's connection a cut left half-open is closed here too, so nothing
// it held is delivered after its sender sent it again on a new one.
void SetSocketLimits(zmq::socket_t& socket, const ClusterConfig& config) {
  SetHeartbeats(socket, static_cast<int>(config.heartbeat_interval_ms()), static_cast<int>(config.heartbeat_timeout_ms()),
                SilentConnectionMs(config));
  socket.set(zmq::sockopt::sndhwm, static_cast<int>(config.limits().socket_send_hwm()));
  socket.set(zmq::sockopt::rcvhwm, static_cast<int>(config.limits().socket_receive_hwm()));
  socket.set(zmq::sockopt::maxmsgsize, PartitionEngine::MaxFrameBytes(config));
}

// What the data port lets connections no node has shown itself on hold
// (server/accepted_connections.h).
AcceptedConnections::Limits ConnectionLimits(const ClusterConfig& config) {
  return {config.limits().max_connections_per_address(), std::chrono::milliseconds(SilentConnectionMs(config)),
          config.limits().max_idle_connections()};
}

bool SocketLimitsSet(zmq::socket_t& socket, const ClusterConfig& config) {
  return socket.get(zmq::sockopt::heartbeat_ivl) == std::max(1, static_cast<int>(config.heartbeat_interval_ms())) &&
         socket.get(zmq::sockopt::heartbeat_timeout) == std::max(1, SilentConnectionMs(config)) &&
         socket.get(zmq::sockopt::tcp_maxrt) == std::max(1, static_cast<int>(config.heartbeat_timeout_ms())) &&
         socket.get(zmq::sockopt::sndhwm) == static_cast<int>(config.limits().socket_send_hwm()) &&
         socket.get(zmq::sockopt::rcvhwm) == static_cast<int>(config.limits().socket_receive_hwm()) &&
         socket.get(zmq::sockopt::maxmsgsize) == PartitionEngine::MaxFrameBytes(config);
}

class ParameterServerImpl : public ParameterServer {
 public:
  ParameterServerImpl(std::shared_ptr<SchedulerClient> scheduler, zmq::context_t context,
                      std::unique_ptr<CurveAuthenticator> authenticator, zmq::socket_t socket,
                      std::unique_ptr<AcceptedConnections> connections, std::string data_address,
                      CurveKeyPair curve_keys, bool seal_data)
      : scheduler_(std::move(scheduler)),
        context_(std::move(context)),
        authenticator_(std::move(authenticator)),
        socket_(std::move(socket)),
        connections_(std::move(connections)),
        data_address_(std::move(data_address)),
        curve_keys_(std::move(curve_keys)) {
    if (curve_keys_.public_key.empty()) return;
    if (seal_data) sender_seals_ = std::make_unique<PeerSeals>(curve_keys_, SealEnd::kBinding);
    peer_seals_ = std::make_unique<PeerSeals>(curve_keys_, SealEnd::kConnecting);
  }

  ~ParameterServerImpl() override {
    RequestStop();
    watch_.reset();
    {
      absl::MutexLock lock(&mu_);
      heartbeat_stop_ = true;
    }
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  absl::Status Start(const ServerOptions& options) {
    drain_on_stop_ = options.drain_on_stop;
    RegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_role(SERVER);
    request.set_data_address(data_address_);
    request.set_host(options.advertise_host);
    request.set_memory_bytes(options.memory_bytes != 0 ? options.memory_bytes : MemoryBytesForPartitions());
    request.set_curve_public_key(curve_keys_.public_key);
    request.set_sealed_data(sender_seals_ != nullptr);
    auto registered = scheduler_->Register(request, options.register_timeout);
    if (!registered.ok()) return registered.status();
    node_id_ = registered->node_id();
    index_ = registered->server_index();
    config_ = registered->config();
    if (absl::Status s = ApplySocketLimits(); !s.ok()) return s;
    admission_ = std::make_unique<PeerAdmission>(config_.limits().max_inflight_bytes_per_worker(),
                                                 config_.limits().max_connections_per_server());
    connections_->SetLimits(ConnectionLimits(config_), absl::StrCat("server ", index_));
    auto engine = PartitionEngine::Create(
        config_, [this](const zmq::message_t& peer, DataHeader& h, zmq::message_t* payload) { Send(peer, h, payload); },
        [this](uint32_t server, DataHeader& h, zmq::message_t& payload) { SendToPeer(server, h, payload); });
    if (!engine.ok()) return engine.status();
    engine_ = *std::move(engine);
    if (registered->joins_running_job()) {
      engine_->JoinRunningJob();
      LOG(WARNING) << "server " << index_ << " at " << data_address_
                   << " joins a running job (in a dead server's place or as one more): its copies arrive as "
                   << "snapshots";
    }
    if (options.metrics != nullptr) metrics_ = std::make_unique<ServerMetrics>(*options.metrics, index_, options.metrics_max_partitions);
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    watch_ = scheduler_->WatchShardMap(
        node_id_,
        [this](const ShardMap& map) {
          absl::MutexLock lock(&mu_);
          pending_map_ = map;
        },
        [this](const absl::Status& s) {
          // Training does not pass through the scheduler: keep serving.
          LOG_EVERY_N(WARNING, 20) << "server " << index_ << ": " << s << " (serving on; reconnecting)";
        });
    LOG(INFO) << "server " << index_ << " serving on " << data_address_;
    return absl::OkStatus();
  }

  absl::Status Run() override {
    absl::Status result;
    std::vector<zmq::pollitem_t> items;
    for (;;) {
      if (stop_.load(std::memory_order_relaxed) && !DrainsBeforeStopping()) break;
      InstallPendingMap();
      if (const Ending e = Ended(); !e.watch_error.ok() || !e.declared_dead.ok()) {
        if (!e.watch_error.ok()) {
          result = e.watch_error;
        } else if (!stop_.load(std::memory_order_relaxed)) {
          result = e.declared_dead;  // asked to stop meanwhile: a stop
        }
        break;
      }
      items.assign(1, {socket_.handle(), 0, ZMQ_POLLIN, 0});
      items.push_back({connections_->monitor().handle(), 0, ZMQ_POLLIN, 0});
      for (auto& peer : peers_) {
        if (peer) items.push_back({peer->handle(), 0, ZMQ_POLLIN, 0});
      }
      PollOrInterrupted(items.data(), items.size(), std::chrono::milliseconds(20));
      WatchPeers();
      // Confirmations first (they release answers workers wait for), then
      // drain what is queued before polling again.
      ReceivePeerAnswers();
      // Async pushes drained in one go coalesce (PartitionEngine::BeginBatch).
      engine_->BeginBatch();
      for (int i = 0; i < 1024 && ReceiveOne(); ++i) {
        if ((i & 15) == 15) ReceivePeerAnswers();
      }
      engine_->EndBatch();
      ReceivePeerAnswers();
      LimitConnections();
      CheckSnapshots();
      // A hand-off drains as its backups confirm: say so without waiting.
      if (engine_->copies_generation() != copies_generation_) PublishSyncedCopies();
      if (metrics_) metrics_->MaybePublish(*engine_);
      PublishCounters();
    }
    // Drain: finish what already arrived, refuse what cannot complete.
    engine_->BeginBatch();
    while (ReceiveOne()) {
    }
    engine_->EndBatch();
    // Once the scheduler has failed this server over, workers re-send what it
    // held to the new primaries (or fail it naming this server, where no copy
    // is left): answering it with an error instead would end their jobs.
    if (!Leave()) {
      engine_->FailWaiting(absl::UnavailableError(absl::StrCat("server ", index_, " is shutting down")));
    }
    socket_.set(zmq::sockopt::linger, 2000);
    connections_->Stop();
    socket_.close();
    for (uint32_t s = 0; s < peers_.size(); ++s) ClosePeer(s);
    if (metrics_) metrics_->MaybePublish(*engine_, /*force=*/true);
    const EngineStats& s = engine_->stats();
    LOG(INFO) << "server " << index_ << " stopped: " << s.requests << " requests, " << s.errors << " errors, "
              << s.updates << " updates, " << s.bytes_in << " bytes in, " << s.bytes_out << " bytes out, "
              << s.replicated_bytes << " bytes to backups";
    return result;
  }

  void RequestStop() override { stop_.store(true); }
  std::string data_address() const override { return data_address_; }
  std::vector<PartitionUpdates> UpdateCounts() const override { return engine_->UpdateCounts(); }
  std::vector<PartitionUpdates> BackupUpdateCounts() const override { return engine_->BackupUpdateCounts(); }
  EngineStats Stats() const override { return engine_->stats(); }
  uint32_t index() const override { return index_; }

 private:
  // Receives and handles one message without blocking; false if none queued.
  bool ReceiveOne() {
    zmq::message_t peer;
    if (!RecvRetrying(socket_, peer, zmq::recv_flags::dontwait)) return false;
    zmq::message_t header_frame, payload;
    int frames = 1;
    bool more = peer.more();
    if (more) {
      (void)RecvRetrying(socket_, header_frame);
      ++frames;
      more = header_frame.more();
    }
    if (more) {
      (void)RecvRetrying(socket_, payload);
      ++frames;
      more = payload.more();
    }
    while (more) {  // discard frames beyond the protocol's three
      zmq::message_t extra;
      (void)RecvRetrying(socket_, extra);
      ++frames;
      more = extra.more();
    }
    Process(peer, header_frame, payload, frames, /*held_since=*/std::nullopt);
    return true;
  }

  // Handles one received message. Sealed by a key this server's map does
  // not list yet, it is held (`held_since`: when it first arrived, for one
  // held already) and tried again once a new map is installed.
  void Process(zmq::message_t& peer, zmq::message_t& header_frame, zmq::message_t& payload, int frames,
               std::optional<std::chrono::steady_clock::time_point> held_since) {
    header_.Clear();
    absl::Status s;
    absl::string_view sealed_by;  // sealed: the sender's raw key, within header_frame
    if (sender_seals_) {
      // Sealed: a message no admitted node sealed gets no answer at all.
      bool unknown_sender = false;
      s = OpenFromSender(peer, header_frame, frames == 3 ? &payload : nullptr, &sealed_by, &unknown_sender);
      if (!s.ok()) {
        if (!unknown_sender || !Hold(peer, header_frame, payload, frames, held_since)) RefuseUnsealed(header_frame, s);
        return;
      }
      // Sealed by a node of the map: a header it cannot read is answered
      // and logged as in the clear. Before, it went unanswered, counted and
      // logged as a message "not sealed by a node of the cluster".
      s = ParseDataHeaderInto(opened_header_.data(), opened_header_.size(), &header_);
    } else {
      s = ParseDataHeaderInto(header_frame.data(), header_frame.size(), &header_);
    }
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 1000) << "server " << index_ << ": refused a data message from " << PeerAddress(header_frame)
                                 << " whose header it cannot read"
                                 << (sealed_by.empty() ? "" : " (sealed by a node of its map)") << ": " << s << " ["
                                 << google::COUNTER << " so far]";
    }
    if (s.ok() && frames > 3) s = absl::InvalidArgumentError(absl::StrCat("message has ", frames - 1, " frames (at most 2)"));
    if (s.ok()) s = Admit(peer, header_frame);
    if (s.ok() && (sender_seals_ || authenticator_)) s = CheckSenderRole(header_frame, sealed_by);
    if (!s.ok()) {
      DataHeader reply;
      reply.set_op(RESPONSE);
      reply.set_request_id(header_.request_id());
      SetResponseStatus(s, &reply);
      Send(peer, reply, nullptr);
      return;
    }
    const auto start = metrics_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    engine_->Handle(peer, header_, frames == 3 ? &payload : nullptr);
    completed_round_.store(engine_->completed_round(), std::memory_order_relaxed);
    if (engine_->copies_generation() != copies_generation_) PublishSyncedCopies();
    if (metrics_) metrics_->ObserveHandling(std::chrono::steady_clock::now() - start);
  }

  // A message sealed by a key the map does not list may come from a node
  // newer than this server's map: a server that just joined gets its first
  // snapshots from primaries that learned of it before its own first map
  // reached it (dropped, such a snapshot was never sent again, and the
  // partition stalled until it was lost). Held for one heartbeat timeout, at
  // most kMaxHeldMessages and as many bytes as two of the largest frames;
  // past that, or past the timeout, dropped as before (unanswered; a
  // snapshot so lost is probed and sent again, CheckSnapshots). Replayed
  // in arrival order after each map install, and opened again then, so a
  // forged one gains nothing by waiting.
  static constexpr size_t kMaxHeldMessages = 256;
  struct HeldMessage {
    zmq::message_t peer, header_frame, payload;
    int frames;
    std::chrono::steady_clock::time_point since;
  };

  // Whether the message was held (taken from the arguments).
  bool Hold(zmq::message_t& peer, zmq::message_t& header_frame, zmq::message_t& payload, int frames,
            std::optional<std::chrono::steady_clock::time_point> held_since) {
    const auto now = std::chrono::steady_clock::now();
    const auto since = held_since.value_or(now);
    if (now - since > std::chrono::milliseconds(config_.heartbeat_timeout_ms())) return false;
    const size_t bytes = header_frame.size() + payload.size();
    const size_t max_bytes = 2 * static_cast<size_t>(PartitionEngine::MaxFrameBytes(config_));
    if (held_.size() >= kMaxHeldMessages || held_bytes_ + bytes > max_bytes) return false;
    held_bytes_ += bytes;
    held_.push_back(HeldMessage{std::move(peer), std::move(header_frame), std::move(payload), frames, since});
    return true;
  }

  // Every heartbeat timeout: a snapshot not confirmed since the last check
  // is probed, and sent again if it was lost on its way (Hold)
  // (PartitionEngine::ProbeUnconfirmedSnapshots); a backup that confirmed
  // nothing meanwhile is said, naming both servers (ReportReplicationStalls).
  void CheckSnapshots() {
    const absl::Time now = absl::Now();
    if (now < next_snapshot_check_) return;
    next_snapshot_check_ = now + absl::Milliseconds(config_.heartbeat_timeout_ms());
    engine_->ProbeUnconfirmedSnapshots();
    ReportReplicationStalls();
    ReportRoundStalls();
  }

  // Before 2026-11-25 a worker cut off from one server only (`tools/chaos.sh
  // wsrv`) stalled the sync job with no word from any node until its
  // request timeout, which names the server from the worker's side only.
  void ReportRoundStalls() {
    for (const PartitionEngine::RoundStall& s : engine_->CheckRoundStalls()) {
      if (s.resumed) {
        LOG(WARNING) << "server " << index_ << " (" << data_address_ << "): worker " << s.worker
                     << "'s pushes reach it again";
        continue;
      }
      LOG(WARNING) << "server " << index_ << " (" << data_address_ << "): round " << s.round << " of partition(s) "
                   << absl::StrJoin(s.partitions, ", ") << " has waited a heartbeat timeout ("
                   << config_.heartbeat_timeout_ms() << " ms) for worker " << s.worker
                   << "'s push, the other workers' are in: every round waits for it. If the scheduler does not "
                      "declare it dead, it still reaches the scheduler; is the link between it and this server down?";
    }
  }

  // Before 2026-11-25 a primary cut off from its backup only (every other
  // link up, so neither is declared dead) stalled its partitions' rounds,
  // and with them the sync job, with no word from any node
  // (`tools/chaos.sh repl`).
  void ReportReplicationStalls() {
    for (const PartitionEngine::ReplicationStall& s : engine_->CheckReplicationStalls()) {
      if (s.resumed) {
        LOG(WARNING) << "server " << index_ << " (" << data_address_ << "): backup server " << s.backup << " ("
                     << s.address << ") confirms its updates again";
        continue;
      }
      LOG(WARNING) << "server " << index_ << " (" << data_address_ << "): backup server " << s.backup << " ("
                   << s.address << ") has confirmed no update of partition(s) " << absl::StrJoin(s.partitions, ", ")
                   << " for a heartbeat timeout (" << config_.heartbeat_timeout_ms()
                   << " ms): every round of them waits for it. Both servers still reach the scheduler, so neither is "
                      "declared dead; is the link between these two down?";
    }
  }

  // A sealed message (`frame`, as received) dropped unanswered: counted,
  // logged now and then.
  void RefuseUnsealed(const zmq::message_t& frame, const absl::Status& s) {
    ++refused_unsealed_;
    if (metrics_) metrics_->CountUnsealed();
    LOG_EVERY_N(WARNING, 1000) << "server " << index_ << ": dropped a data message from " << PeerAddress(frame)
                               << " that is not sealed by a node of the cluster: " << s << " [" << google::COUNTER
                               << " so far]";
  }

  // Where a received frame came from, as ZeroMQ saw it, for log lines: the
  // envelope names a key, which says nothing of who sent a refused message.
  static std::string PeerAddress(const zmq::message_t& frame) {
    const char* address = zmq_msg_gets(frame.handle(), "Peer-Address");
    return address != nullptr ? address : "an unknown address";
  }

  // After a map install: the held messages, in arrival order, once more.
  void ReplayHeld() {
    std::vector<HeldMessage> held = std::move(held_);
    held_.clear();
    held_bytes_ = 0;
    engine_->BeginBatch();
    for (HeldMessage& m : held) Process(m.peer, m.header_frame, m.payload, m.frames, m.since);
    engine_->EndBatch();
  }

  // Opens a sealed request from the sender named in its envelope, its
  // header's bytes into opened_header_, and remembers which seal answers
  // that connection. `sender`:
  // the sender's raw key (a view into `envelope`); `*unknown_sender` set
  // when the map lists no such key.
  absl::Status OpenFromSender(const zmq::message_t& peer, const zmq::message_t& envelope, zmq::message_t* payload,
                              absl::string_view* sender, bool* unknown_sender) {
    absl::Status s;
    PeerSeal* seal = nullptr;
    if (auto named = SealedSender(envelope); !named.ok()) {
      s = named.status();
    } else if (*sender = *named, seal = sender_seals_->Admitted(*named); seal == nullptr) {
      s = absl::PermissionDeniedError("the sender's key is not in the shard map");
      *unknown_sender = true;
    } else {
      s = seal->Open(envelope, payload, &opened_header_);
    }
    if (!s.ok()) return s;
    const absl::string_view id(static_cast<const char*>(peer.data()), peer.size());
    if (!seal_of_connection_.contains(id) && seal_of_connection_.size() >= 2 * size_t{config_.limits().max_connections_per_server()}) {
      // Connections come and go (reconnects, restarted workers): keep those
      // the admission still tracks.
      absl::erase_if(seal_of_connection_, [this](const auto& entry) { return !admission_->Tracks(entry.first); });
    }
    seal_of_connection_[id] = seal;
    return absl::OkStatus();
  }

  void Send(const zmq::message_t& peer, DataHeader& header, zmq::message_t* payload) {
    zmq::message_t id(peer.data(), peer.size());
    zmq::message_t head, sealed_payload;
    if (sender_seals_) {
      auto it = seal_of_connection_.find(absl::string_view(static_cast<const char*>(peer.data()), peer.size()));
      if (it == seal_of_connection_.end()) return;  // never opened a message from it: nothing to answer
      if (absl::Status s = SealMessage(*it->second, header, payload != nullptr, payload ? payload->data() : nullptr,
                                       payload ? payload->size() : 0, &head, &sealed_payload);
          !s.ok()) {
        LOG(ERROR) << "server " << index_ << ": " << s;
        return;
      }
      if (payload != nullptr) payload = &sealed_payload;
    } else {
      head = HeaderFrame(header);
    }
    // A vanished peer is not an error for the server: its answer is dropped,
    // and so is one to a peer whose queue is at the high-water mark.
    (void)SendRetrying(socket_, id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)SendRetrying(socket_, head, payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (payload != nullptr) {
      zmq::message_t charged = admission_->Track(peer, std::move(*payload));
      (void)SendRetrying(socket_, charged, zmq::send_flags::none);
    }
  }

  // Hands the engine's counts to the heartbeats, at most every tenth of a
  // heartbeat interval (a poll-loop pass may handle a single request).
  void PublishCounters() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_counters_) return;
    next_counters_ = now + std::chrono::milliseconds(config_.heartbeat_interval_ms()) / 10;
    const EngineStats& s = engine_->stats();
    NodeCounters c;
    c.set_rounds_completed(engine_->completed_round());
    c.set_updates_applied(s.updates);
    c.set_bytes_in(s.bytes_in);
    c.set_bytes_out(s.bytes_out);
    c.set_requests(s.requests);
    c.set_requests_refused(s.non_finite + s.bad_request_ids + refused_by_limits_ + refused_unsealed_ + refused_roles_);
    absl::MutexLock lock(&counters_mu_);
    counters_ = c;
  }

  // Whether the key that sealed header_frame (`sealed_by`) or, under CURVE,
  // that its connection authenticated with may send header_ (SenderRoles).
  absl::Status CheckSenderRole(zmq::message_t& header_frame, absl::string_view sealed_by) {
    absl::Status s;
    if (sender_seals_) {
      s = sender_roles_.Check(sealed_by, header_);
    } else {
      // CurveAuthenticator names the client's key (Z85) as the connection's
      // user id; decoded on the stack, as this runs per request.
      const char* user = zmq_msg_gets(header_frame.handle(), "User-Id");
      uint8_t raw[32];
      s = user != nullptr && std::strlen(user) == 40 && zmq_z85_decode(raw, user) != nullptr
              ? sender_roles_.Check(absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)), header_)
              : absl::PermissionDeniedError("the connection names no CURVE key");
    }
    if (!s.ok()) {
      ++refused_roles_;
      if (metrics_) metrics_->CountWrongSender();
      LOG_EVERY_N(WARNING, 1000) << "server " << index_ << ": refused a data message from " << PeerAddress(header_frame)
                                 << ": " << s << " [" << google::COUNTER << " so far]";
    }
    return s;
  }

  // Whether the sender of header_ may be served now (PeerAdmission). The
  // first request admitted from a connection (`header_frame`, as received)
  // proves it (AcceptedConnections): checked only then, not per request.
  absl::Status Admit(const zmq::message_t& peer, const zmq::message_t& header_frame) {
    const std::string who = header_.op() == REPLICATE ? std::string("a primary server")
                                                      : absl::StrCat("worker ", header_.worker_rank());
    absl::Status error;
    bool new_peer = false;
    switch (admission_->Admit(peer, who, &error, &new_peer)) {
      case PeerAdmission::Verdict::kAdmitted:
        if (new_peer) connections_->Proven(header_frame);
        return absl::OkStatus();
      case PeerAdmission::Verdict::kOverInflight:
        ++refused_by_limits_;
        if (metrics_) metrics_->CountOverInflight();
        break;
      case PeerAdmission::Verdict::kOverPeers:
        ++refused_by_limits_;
        if (metrics_) metrics_->CountOverConnections();
        break;
    }
    LOG_EVERY_N(WARNING, 1000) << "server " << index_ << ": " << error << " [" << google::COUNTER
                               << " refused so far]";
    return error;
  }

  // Connections over the per-address limit, and those that carried no
  // valid message in time, closed (AcceptedConnections); once per pass of
  // the loop, after what was queued was handled.
  void LimitConnections() {
    const AcceptedConnections::Closed closed = connections_->Update(std::chrono::steady_clock::now());
    if (metrics_) metrics_->CountClosedConnections(closed.over_address_limit, closed.no_message_in_time);
  }

  // The config's high-water marks and largest frame (limits), set on the
  // data socket. A listener copies a socket's options when it binds, so the
  // socket binds its port again to apply them, unless they are those it was
  // bound with (the config of the scheduler's status, ParameterServer::Create):
  // a server that joins a running job is reached by primaries and workers as
  // soon as it registered, and a rebind drops what reached it before.
  absl::Status ApplySocketLimits() {
    if (SocketLimitsSet(socket_, config_)) return absl::OkStatus();
    const std::string endpoint = socket_.get(zmq::sockopt::last_endpoint);
    try {
      SetSocketLimits(socket_, config_);
      socket_.unbind(endpoint);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat("server cannot unbind ", endpoint, ": ", e.what()));
    }
    // ZeroMQ's I/O thread closes the old listener asynchronously: until it
    // has, the port is still in use.
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (true) {
      try {
        socket_.bind(endpoint);
        return absl::OkStatus();
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE || absl::Now() > deadline) {
          return absl::UnavailableError(
              absl::StrCat("server cannot bind ", endpoint, " again with its socket limits: ", e.what()));
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  // REPLICATE to a backup, on a DEALER connected on first use.
  void SendToPeer(uint32_t server, DataHeader& header, zmq::message_t& payload) {
    if (server >= peer_addresses_.size() || peer_addresses_[server].empty()) {
      LOG(ERROR) << "server " << index_ << ": no address for backup server " << server;
      return;
    }
    if (peers_.size() <= server) peers_.resize(server + 1);
    if (!peers_[server]) {
      // Not made: the update waits for the backup's confirmation (as when
      // sealing fails below) and the log says why.
      auto made = MakeSocket(context_, zmq::socket_type::dealer,
                             absl::StrCat("server ", index_, ": socket to backup server ", server),
                             kSocketDescriptors + kWatchDescriptors);
      if (!made.ok()) {
        LOG_EVERY_N(ERROR, 100) << made.status().message();
        return;
      }
      auto socket = std::make_unique<zmq::socket_t>(*std::move(made));
      socket->set(zmq::sockopt::sndhwm, 0);
      socket->set(zmq::sockopt::rcvhwm, 0);
      socket->set(zmq::sockopt::linger, 0);
      if (const std::string& key = peer_keys_[server]; !key.empty() && !peer_sealed_[server]) {
        if (absl::Status s = MakeCurveClient(*socket, key, &curve_keys_); !s.ok()) {
          LOG(ERROR) << "server " << index_ << ": backup server " << server << ": " << s;
          return;
        }
      }
      std::unique_ptr<zmq::socket_t> monitor = WatchedPeerSocket(*socket, server);
      socket->connect(peer_addresses_[server]);
      peers_[server] = std::move(socket);
      if (peer_monitors_.size() <= server) peer_monitors_.resize(server + 1);
      peer_monitors_[server] = std::move(monitor);
      if (peer_handshaken_.size() <= server) peer_handshaken_.resize(server + 1);
      peer_handshaken_[server] = false;
    }
    zmq::message_t head, sealed_payload;
    auto sealed = PeerSealOf(server);
    if (!sealed.ok()) {
      // Never in the clear to a backup that seals: the update waits for
      // its confirmation, and the failure shows in the log.
      LOG_EVERY_N(ERROR, 100) << "server " << index_ << ": backup server " << server << ": " << sealed.status();
      return;
    }
    PeerSeal* seal = *sealed;
    if (seal != nullptr) {
      if (absl::Status s = SealMessage(*seal, header, true, payload.data(), payload.size(), &head, &sealed_payload); !s.ok()) {
        LOG(ERROR) << "server " << index_ << ": backup server " << server << ": " << s;
        return;
      }
    } else {
      head = HeaderFrame(header);
    }
    (void)SendRetrying(*peers_[server], head, zmq::send_flags::sndmore);
    (void)SendRetrying(*peers_[server], seal != nullptr ? sealed_payload : payload, zmq::send_flags::none);
  }

  // The seal toward backup `server` when its socket takes sealed messages,
  // null when it does not (CURVE or plain); an error when it does and this
  // server cannot seal for it.
  absl::StatusOr<PeerSeal*> PeerSealOf(uint32_t server) {
    if (server >= peer_sealed_.size() || !peer_sealed_[server]) return nullptr;
    if (!peer_seals_) {
      return absl::FailedPreconditionError("it seals its data plane but this server has no keys (security off)");
    }
    return peer_seals_->For(peer_keys_[server]);
  }

  // Closes the socket to backup `server` and its monitor, if any. The
  // monitor stops first: ZeroMQ's I/O thread reports a connection's end to
  // it with a blocking send, which with the reader closed before the socket
  // is gone never returns, and stalls every socket of the context (review20,
  // seen in the worker's DataChannel).
  void ClosePeer(uint32_t server) {
    if (server < peers_.size() && peers_[server]) {
      (void)zmq_socket_monitor(peers_[server]->handle(), nullptr, 0);
      peers_[server].reset();
    }
    if (server < peer_monitors_.size()) peer_monitors_[server].reset();
  }

  // Heartbeats on a connection to a backup (as a worker's DataChannel does:
  // TCP alone sends again only at its next backed-off retransmission, so a
  // 30 s cut between two servers stalled their partitions' rounds 53-55 s)
  // and the PAIR socket its monitor reports a broken connection on (null
  // if it cannot be watched: the heartbeats still end a dead connection,
  // and the snapshot probes and refusals still recover what it lost).
  std::unique_ptr<zmq::socket_t> WatchedPeerSocket(zmq::socket_t& socket, uint32_t server) {
    SetHeartbeats(socket, config_.heartbeat_interval_ms(), config_.heartbeat_timeout_ms(), SilentConnectionMs(config_));
    auto monitor = WatchConnections(
        context_, socket, absl::StrCat("inproc://shardps-peer-", index_, "-", server, "-", ++peer_monitors_made_),
        ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    if (!monitor.ok()) {
      LOG(ERROR) << "server " << index_ << ": backup server " << server << ": " << monitor.status();
      return nullptr;
    }
    return std::make_unique<zmq::socket_t>(*std::move(monitor));
  }

  // A connection to a backup that broke (closed, or no answer to a
  // heartbeat) lost what was in flight on it: its socket goes, and its queue
  // with it (what follows the lost bytes), and every partition with updates
  // that backup has not confirmed sends it a snapshot
  // (PartitionEngine::ConnectionToBackupBroke) on a socket made anew
  // (SendToPeer). Not the socket disconnected and connected again: the old
  // connection could report its handshake after that, taken for the new
  // one's, as review20 found in the worker's DataChannel.
  void WatchPeers() {
    for (uint32_t s = 0; s < peer_monitors_.size(); ++s) {
      if (!peer_monitors_[s] || s >= peers_.size() || !peers_[s]) continue;
      bool broke = false;
      for (uint16_t what : TakeConnectionEvents(*peer_monitors_[s])) {
        if (what == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
          peer_handshaken_[s] = true;
        } else if (peer_handshaken_[s]) {  // ZMQ_EVENT_DISCONNECTED
          peer_handshaken_[s] = false;
          broke = true;
        }
      }
      // One that ended in its handshake (refused, or the port's owner closed
      // it) carried nothing: ZeroMQ makes it again by itself, its queue
      // intact and reconnect_ivl apart. Made again here, with snapshots, a
      // backup refusing the handshake was hammered every turn of the loop.
      if (!broke) continue;
      ClosePeer(s);
      // Said where it cost something: a backup that stops at the end of the
      // job closes its connection too.
      std::vector<uint64_t> resent = engine_->ConnectionToBackupBroke(s);
      LOG_IF(WARNING, !resent.empty()) << "server " << index_ << ": the connection to backup server " << s << " ("
                                       << peer_addresses_[s] << ") broke (closed, nothing acknowledged within "
                                       << config_.heartbeat_timeout_ms() << " ms, or no message within "
                                       << SilentConnectionMs(config_)
                                       << " ms); connecting again, and re-creating its copies of partition(s) "
                                       << absl::StrJoin(resent, ", ") << ", whose updates in flight on it are lost";
    }
  }

  // Backups' confirmations of REPLICATE requests.
  void ReceivePeerAnswers() {
    for (uint32_t s = 0; s < peers_.size(); ++s) {
      if (!peers_[s]) continue;
      zmq::message_t head;
      while (RecvRetrying(*peers_[s], head, zmq::recv_flags::dontwait)) {
        bool more = head.more();
        while (more) {
          zmq::message_t extra;
          (void)RecvRetrying(*peers_[s], extra);
          more = extra.more();
        }
        DataHeader answer;
        auto seal = PeerSealOf(s);
        absl::Status opened = !seal.ok()             ? seal.status()
                              : *seal != nullptr ? OpenMessage(**seal, head, nullptr, &answer)
                                                 : ParseDataHeaderInto(head.data(), head.size(), &answer);
        if (opened.ok()) {
          engine_->HandleReplicaAck(s, answer);
        } else if (!seal.ok() || *seal != nullptr) {
          LOG_EVERY_N(WARNING, 100) << "server " << index_ << ": dropped an answer from backup server " << s << ": "
                                    << opened;
        }
      }
    }
  }

  void InstallPendingMap() {
    std::optional<ShardMap> map;
    {
      absl::MutexLock lock(&mu_);
      map.swap(pending_map_);
    }
    if (!map || map->epoch() <= engine_->epoch()) return;
    for (const ServerInfo& s : map->servers()) {
      if (peer_addresses_.size() <= s.index()) peer_addresses_.resize(s.index() + 1);
      if (peer_keys_.size() <= s.index()) peer_keys_.resize(s.index() + 1);
      if (peer_sealed_.size() <= s.index()) peer_sealed_.resize(s.index() + 1);
      if (s.index() == index_) continue;
      if (peer_addresses_[s.index()] == s.data_address() && peer_keys_[s.index()] == s.curve_public_key() &&
          peer_sealed_[s.index()] == s.sealed_data()) {
        continue;
      }
      // A server that joined in a dead one's place: connect to it afresh.
      ClosePeer(s.index());
      peer_addresses_[s.index()] = s.data_address();
      peer_keys_[s.index()] = s.curve_public_key();
      peer_sealed_[s.index()] = s.sealed_data();
    }
    if (authenticator_ || sender_seals_) {
      std::vector<std::string> allowed(map->worker_curve_keys().begin(), map->worker_curve_keys().end());
      for (const ServerInfo& s : map->servers()) allowed.push_back(s.curve_public_key());
      if (authenticator_) authenticator_->Allow(allowed);
      if (sender_seals_) sender_seals_->Admit(allowed);
      sender_roles_.Update(*map);
    }
    if (absl::Status s = engine_->InstallShardMap(*map, index_); !s.ok()) {
      LOG(ERROR) << "server " << index_ << ": cannot serve shard map epoch " << map->epoch() << ": " << s;
      absl::MutexLock lock(&mu_);
      watch_error_ = s;
      return;
    }
    LOG(INFO) << "server " << index_ << " serves shard map epoch " << map->epoch();
    job_over_ = map->left_workers_size() >= static_cast<int>(config_.num_workers());
    drain_ended_ = drain_epoch_ != 0 && map->epoch() >= drain_epoch_ && !MarkedDraining(*map, index_);
    if (Drained(*map)) {
      LOG(WARNING) << "server " << index_ << " drained: shard map epoch " << map->epoch()
                   << " lists no copy on it; it stops and leaves the job";
      drained_ = true;
      RequestStop();
    }
    copies_generation_ = engine_->copies_generation();
    if (!held_.empty()) ReplayHeld();
    std::vector<uint64_t> synced = engine_->SyncedCopies();
    std::vector<HandoffDone> handoffs = engine_->HandoffsDone();
    const std::optional<uint64_t> fewest = engine_->fewest_completed_round();
    absl::MutexLock lock(&mu_);
    applied_epoch_ = map->epoch();
    fewest_completed_round_ = fewest;
    synced_copies_ = std::move(synced);  // with the epoch they hold at
    handoffs_done_ = std::move(handoffs);
    checkpoint_failure_ = engine_->checkpoint_failure();
    heartbeat_now_ = true;
  }

  // Called once a stop is requested: whether to serve on while draining
  // (ServerOptions::drain_on_stop). It asks the scheduler for the drain
  // until it answers (AskForDrain), and serves on until drained or the
  // deadline.
  bool DrainsBeforeStopping() {
    if (drained_ || drain_on_stop_ <= absl::ZeroDuration()) return false;
    if (drain_deadline_ == absl::InfinitePast() && job_over_) {
      LOG(INFO) << "server " << index_ << ": every worker has left, so it stops without draining";
      drain_deadline_ = absl::InfiniteFuture();
      return false;
    }
    if (drain_deadline_ == absl::InfinitePast()) {
      drain_deadline_ = absl::Now() + drain_on_stop_;
      ask_deadline_ = std::min(drain_deadline_, absl::Now() + absl::Milliseconds(config_.heartbeat_timeout_ms()));
    }
    if (drain_deadline_ == absl::InfiniteFuture()) return false;
    const absl::Time now = absl::Now();
    if (now >= drain_deadline_) {
      LOG(WARNING) << "server " << index_ << " not drained within " << absl::FormatDuration(drain_on_stop_)
                   << (drain_epoch_ != 0 ? "" : " (the scheduler could not be asked for it)")
                   << ": it stops now, and the copies still on it fail over";
      drain_deadline_ = absl::InfiniteFuture();
      return false;
    }
    if (drain_epoch_ != 0 && (job_over_ || drain_ended_)) {
      // Nothing would move its copies any more: the servers stop with the
      // job, or the scheduler ended the drain (too few would be left) and
      // gives it copies again.
      LOG(WARNING) << "server " << index_ << " stops before it is drained: "
                   << (job_over_ ? "every worker has left the job" : "the scheduler ended its drain");
      drain_deadline_ = absl::InfiniteFuture();
      return false;
    }
    if (drain_epoch_ != 0 || now < next_drain_ask_) return true;
    return AskForDrain(now);
  }

  // Asks the scheduler to drain this server; whether to serve on. A refusal
  // (too few servers would be left, the job is over) stops it at once; a
  // scheduler it cannot reach (restarting, a standby taking over) is asked
  // again a second later, for as long as nodes wait for a scheduler
  // (heartbeat_timeout_ms, at most the drain's deadline): stopping without
  // the drain would fail its partitions over, or lose them without backups.
  // One that stays away (the whole job torn down) stops it then.
  bool AskForDrain(absl::Time now) {
    DrainRequest request;
    request.set_server(index_);
    // On the engine thread: one second at most per try, and a second of
    // serving before the next (counted from the try's end: a scheduler
    // that does not answer takes the whole second each time), so requests
    // wait no longer than that and training goes on between tries.
    auto asked = scheduler_->Drain(request, std::min(drain_deadline_ - now, absl::Seconds(1)));
    if (asked.ok()) {
      drain_epoch_ = asked->epoch();
      LOG(WARNING) << "server " << index_ << " drains before it stops (at most "
                   << absl::FormatDuration(drain_on_stop_) << "): its " << asked->copies()
                   << " copies move to the other servers from shard map epoch " << asked->epoch();
      return true;
    }
    const bool unreachable = absl::IsUnavailable(asked.status()) || absl::IsDeadlineExceeded(asked.status());
    if (unreachable && absl::Now() < ask_deadline_) {
      LOG_IF(WARNING, next_drain_ask_ == absl::InfinitePast())
          << "server " << index_ << " cannot ask for its drain yet (" << asked.status().message()
          << "): it serves on and asks again every second, for at most "
          << absl::FormatDuration(ask_deadline_ - now);
      next_drain_ask_ = absl::Now() + absl::Seconds(1);
      return true;
    }
    LOG(WARNING) << "server " << index_ << " stops without draining: " << asked.status().message();
    drain_deadline_ = absl::InfiniteFuture();  // refused: now it stops
    return false;
  }

  // Whether `map` marks this server draining and lists no copy on it, and
  // no move or hand-off from or to it.
  bool Drained(const ShardMap& map) const {
    if (!MarkedDraining(map, index_)) return false;
    for (const PartitionInfo& p : map.partitions()) {
      if (HoldsCopy(p, index_)) return false;
    }
    for (const CopyMove& m : map.moves()) {
      if (m.from() == index_ || m.to() == index_) return false;
    }
    return absl::c_none_of(map.handoffs(), [this](const Handoff& h) { return h.from() == index_ || h.to() == index_; });
  }

  // A copy's snapshot arrived: the next heartbeat says so (see
  // HeartbeatRequest.synced_copies). A drained hand-off is reported at once:
  // the partition's new work waits for the switch; so is a checkpoint this
  // server could not write (`shardps checkpoint` waits for the news).
  void PublishSyncedCopies() {
    copies_generation_ = engine_->copies_generation();
    std::vector<uint64_t> synced = engine_->SyncedCopies();
    std::vector<HandoffDone> handoffs = engine_->HandoffsDone();
    absl::MutexLock lock(&mu_);
    synced_copies_ = std::move(synced);
    auto same = [](const HandoffDone& a, const HandoffDone& b) {
      return a.partition() == b.partition() && a.epoch() == b.epoch();
    };
    if (!std::equal(handoffs.begin(), handoffs.end(), handoffs_done_.begin(), handoffs_done_.end(), same)) {
      heartbeat_now_ = true;
    }
    handoffs_done_ = std::move(handoffs);
    if (!google::protobuf::util::MessageDifferencer::Equals(engine_->checkpoint_failure(), checkpoint_failure_)) {
      checkpoint_failure_ = engine_->checkpoint_failure();
      heartbeat_now_ = true;
    }
  }

  // The last heartbeat, once its loop has stopped: the scheduler fails this
  // server over now instead of after heartbeat_timeout_ms, so a rolling
  // restart stalls no sync round for the timeout and a server started again
  // at this address takes its place at once. Bounded by one heartbeat
  // interval (SayLeaving). Returns whether the scheduler took it out of
  // the job (now, or earlier: declared dead).
  bool Leave() {
    {
      absl::MutexLock lock(&mu_);
      heartbeat_stop_ = true;
    }
    if (heartbeat_.joinable()) heartbeat_.join();
    {
      absl::MutexLock lock(&mu_);
      // Failed over already: nothing to tell, and what it holds is for the
      // workers to re-send by the map that declared it dead.
      if (!declared_dead_.ok()) return true;
    }
    absl::Status s = SayLeaving(*scheduler_, node_id_, config_);
    if (s.ok()) {
      LOG(INFO) << "server " << index_ << ": the scheduler took it out of the job; workers re-send what it held";
      return true;
    }
    LOG(WARNING) << "server " << index_ << ": could not tell the scheduler it stops (" << s
                 << "); it will be declared dead after heartbeat_timeout_ms " << config_.heartbeat_timeout_ms();
    return false;
  }

  // What ends Run, read under one lock each pass of its loop: a map watch
  // that failed for good, and why the scheduler took this server out of the
  // job (both OK while it serves).
  struct Ending {
    absl::Status watch_error;
    absl::Status declared_dead;
  };
  Ending Ended() {
    absl::MutexLock lock(&mu_);
    return {watch_error_, declared_dead_};
  }

  void HeartbeatLoop() {
    const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
    HeartbeatLog log(absl::StrCat("server ", index_), interval, absl::Milliseconds(config_.heartbeat_timeout_ms()));
    absl::MutexLock lock(&mu_);
    while (!heartbeat_stop_) {
      HeartbeatRequest request;
      request.set_node_id(node_id_);
      request.set_applied_epoch(applied_epoch_);
      request.set_completed_round(completed_round_.load(std::memory_order_relaxed));
      if (fewest_completed_round_) request.set_fewest_completed_round(*fewest_completed_round_);
      request.mutable_synced_copies()->Assign(synced_copies_.begin(), synced_copies_.end());
      for (const HandoffDone& d : handoffs_done_) *request.add_handoffs_done() = d;
      if (!checkpoint_failure_.dir().empty()) *request.mutable_checkpoint_failure() = checkpoint_failure_;
      heartbeat_now_ = false;
      mu_.Unlock();
      {
        absl::MutexLock counters_lock(&counters_mu_);
        *request.mutable_counters() = counters_;
      }
      if (auto late = log.Sending(absl::Now())) LOG(WARNING) << *late;
      auto r = scheduler_->Heartbeat(request, std::min(interval, absl::Milliseconds(config_.request_timeout_ms())));
      const std::optional<std::string> told = log.Answered(r.status(), absl::Now());
      if (absl::IsNotFound(r.status()) || absl::IsFailedPrecondition(r.status())) {
        LOG_EVERY_N(ERROR, 30) << "server " << index_ << ": " << r.status();
      } else if (told) {
        LOG(WARNING) << *told;
      }
      mu_.Lock();
      if (absl::IsFailedPrecondition(r.status()) && IsDeclaredDeadRefusal(r.status().message()) &&
          declared_dead_.ok()) {
        // Paused or cut off past the timeout: its partitions were failed over
        // and a later epoch fences whatever it still holds, so it stops rather
        // than linger unused, holding its address (a supervisor's restart
        // joins the job as a new server).
        declared_dead_ = absl::FailedPreconditionError(absl::StrCat(
            "server ", index_, " (", data_address_, ") stops: ", r.status().message(), " (silent for more than ",
            "heartbeat_timeout_ms ", config_.heartbeat_timeout_ms(), ": paused, or cut off from the scheduler); ",
            "the job failed its partitions over to the other servers; start it again to join the job as a new server"));
      }
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeat_now_ || heartbeat_stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), interval);
    }
  }

  std::shared_ptr<SchedulerClient> scheduler_;
  zmq::context_t context_;
  // Admits registered CURVE clients only; null: plain. Stopped (by its
  // destructor) before context_ goes.
  std::unique_ptr<CurveAuthenticator> authenticator_;
  zmq::socket_t socket_;
  // The data socket's connections; destroyed (its monitor stopped) before
  // socket_ closes.
  std::unique_ptr<AcceptedConnections> connections_;
  const std::string data_address_;
  const CurveKeyPair curve_keys_;  // Z85; empty: the data socket is plain
  // Engine thread only. Sealed data socket (AES-256-GCM): the admitted
  // senders, and which of them each connection (routing id) is; null: CURVE
  // or plain.
  std::unique_ptr<PeerSeals> sender_seals_;
  absl::flat_hash_map<std::string, PeerSeal*> seal_of_connection_;
  uint64_t refused_unsealed_ = 0;
  std::vector<HeldMessage> held_;  // from senders not in the map yet (Hold)
  std::string opened_header_;  // the last sealed header opened (OpenFromSender), reused
  absl::Time next_snapshot_check_ = absl::InfinitePast();  // CheckSnapshots
  size_t held_bytes_ = 0;
  // Engine thread only, secured data plane: what each node's key may send.
  SenderRoles sender_roles_;
  uint64_t refused_roles_ = 0;
  // Seals toward sealed backups; null when this server has no keys.
  std::unique_ptr<PeerSeals> peer_seals_;
  uint64_t node_id_ = 0;
  uint32_t index_ = 0;
  ClusterConfig config_;
  std::unique_ptr<PartitionEngine> engine_;
  std::unique_ptr<ServerMetrics> metrics_;  // null: metrics off
  std::unique_ptr<PeerAdmission> admission_;  // engine thread only
  // Engine thread only: DEALERs to the other servers (by index), for replication.
  std::vector<std::string> peer_addresses_;
  std::vector<std::string> peer_keys_;  // their CURVE public keys (empty: plain)
  std::vector<bool> peer_sealed_;       // their sockets take sealed messages, not CURVE
  std::vector<std::unique_ptr<zmq::socket_t>> peers_;
  // By server index: the monitor of peers_[i]'s connection (WatchPeers),
  // and how many were made (each binds its own inproc endpoint).
  std::vector<std::unique_ptr<zmq::socket_t>> peer_monitors_;
  uint64_t peer_monitors_made_ = 0;
  // By server index: whether peers_[i]'s connection completed its handshake
  // since it was last made (only one that did can have lost updates).
  std::vector<bool> peer_handshaken_;
  DataHeader header_;  // reused per request
  std::atomic<bool> stop_{false};
  // Engine thread: ServerOptions::drain_on_stop; whether the map showed this
  // server drained; the drain's deadline once a stop asked for it
  // (InfinitePast: no stop yet; InfiniteFuture: it stops now).
  absl::Duration drain_on_stop_ = absl::ZeroDuration();
  bool drained_ = false;
  bool job_over_ = false;  // the latest map lists every worker as left
  absl::Time drain_deadline_ = absl::InfinitePast();
  uint64_t drain_epoch_ = 0;  // the epoch that marked it draining (0: not accepted yet)
  bool drain_ended_ = false;  // a map since drain_epoch_ no longer marks it draining
  absl::Time next_drain_ask_ = absl::InfinitePast();  // after a scheduler it could not reach
  absl::Time ask_deadline_ = absl::InfinitePast();    // asking for the drain ends then
  std::atomic<uint64_t> completed_round_{0};  // engine thread -> heartbeats
  uint64_t refused_by_limits_ = 0;  // engine thread: in-flight bytes, connections
  std::chrono::steady_clock::time_point next_counters_{};  // engine thread: PublishCounters
  absl::Mutex counters_mu_;  // engine thread -> heartbeats
  NodeCounters counters_ ABSL_GUARDED_BY(counters_mu_);
  uint64_t copies_generation_ = 0;  // engine thread: the engine's, as last published

  absl::Mutex mu_;
  std::optional<ShardMap> pending_map_ ABSL_GUARDED_BY(mu_);
  absl::Status watch_error_ ABSL_GUARDED_BY(mu_);
  absl::Status declared_dead_ ABSL_GUARDED_BY(mu_);  // the scheduler's refusal of a heartbeat, once
  uint64_t applied_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // At applied_epoch_'s install (rounds completed since only raise it, and
  // a rejoin placed lower catches up: WorkerRejoin.catch_up).
  std::optional<uint64_t> fewest_completed_round_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> synced_copies_ ABSL_GUARDED_BY(mu_);  // at applied_epoch_
  CheckpointFailure checkpoint_failure_ ABSL_GUARDED_BY(mu_);  // the engine's last
  std::vector<HandoffDone> handoffs_done_ ABSL_GUARDED_BY(mu_);  // at applied_epoch_
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
  std::unique_ptr<SchedulerClient::Watch> watch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(const ServerOptions& options) {
  std::shared_ptr<SchedulerClient> scheduler = options.scheduler_client;
  if (scheduler == nullptr) {
    auto created = SchedulerClient::Create(options.scheduler_address, options.security);
    if (!created.ok()) return created.status();
    scheduler = *std::move(created);
  }
  if (auto e = ParseTcpEndpoint(options.bind_address, "server listen address",
                                {.allow_port_zero = true, .allow_wildcard = true});
      !e.ok()) {
    return e.status();
  }
  // Parsed with a port of 1 added, which the message must not show.
  if (!ParseHostPort(absl::StrCat(options.advertise_host, ":1"), "server advertise host").ok()) {
    return absl::InvalidArgumentError(absl::StrCat("server advertise host: '", options.advertise_host,
                                                   "' is not a host name or IP address"));
  }
  // The config's socket limits before binding, from the scheduler's status
  // (the config it will register this server with), so the port is bound
  // once: a rebind (ApplySocketLimits, kept for a scheduler that gives no
  // status) drops what reached the port before it, and primaries send a
  // server that takes a dead one's place its copies as soon as it registered.
  const absl::Time register_deadline = absl::Now() + options.register_timeout;
  auto served = scheduler->Status(options.register_timeout);
  const ClusterConfig config = served.ok() ? served->config() : ClusterConfig();
  // A server short of descriptors takes no connection from some peers (its
  // ZeroMQ accepts fail unlogged) and the job waits for it until requests
  // time out, blaming it with no reason: refused here, saying so.
  const std::string who = absl::StrCat("server at ", options.bind_address);
  if (absl::Status s = EnsureFreeDescriptors(ServerDescriptors(config), who); !s.ok()) return s;
  zmq::context_t context(1);
  auto made = MakeSocket(context, zmq::socket_type::router, who, kFirstSocketDescriptors);
  if (!made.ok()) return made.status();
  zmq::socket_t socket = *std::move(made);
  SetSocketLimits(socket, config);
  // Before it binds: no connection goes unseen.
  auto connections = AcceptedConnections::Create(context, socket, ConnectionLimits(config), who);
  if (!connections.ok()) return connections.status();
  CurveKeyPair keys;
  std::unique_ptr<CurveAuthenticator> authenticator;
  if (options.security.enabled) {
    auto made = NewCurveKeyPair();
    if (!made.ok()) return absl::Status(made.status().code(), absl::StrCat("server data socket: ", made.status().message()));
    keys = *std::move(made);
    if (!options.security.seal_data) {
      auto created = CurveAuthenticator::Create(context, "server at " + options.bind_address);
      if (!created.ok()) return created.status();
      authenticator = *std::move(created);
      MakeCurveServer(socket, keys);
    }
  }
  std::string bind = options.bind_address;
  if (bind.size() > 2 && bind.substr(bind.size() - 2) == ":0") bind = bind.substr(0, bind.size() - 1) + "*";
  try {
    socket.bind(bind);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("server cannot bind ", options.bind_address, ": ", e.what()));
  }
  std::string endpoint = socket.get(zmq::sockopt::last_endpoint);
  std::string port = endpoint.substr(endpoint.rfind(':') + 1);
  std::string address = absl::StrCat("tcp://", options.advertise_host, ":", port);
  auto server = std::make_unique<ParameterServerImpl>(
      std::move(scheduler), std::move(context), std::move(authenticator), std::move(socket), *std::move(connections),
      address, std::move(keys), options.security.seal_data);
  ServerOptions registering = options;  // within the deadline the status call began
  registering.register_timeout = std::max(register_deadline - absl::Now(), absl::Seconds(1));
  if (absl::Status s = server->Start(registering); !s.ok()) return s;
  return std::unique_ptr<ParameterServer>(std::move(server));
}

}  // namespace shardps
