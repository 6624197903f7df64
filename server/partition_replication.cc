// PartitionEngine, replication half: roles, REPLICATE requests and their
// confirmations, promotion of a backup, requests deferred for an epoch.
// See "Replication" in partition_engine.h for the protocol.
#include <algorithm>
#include <cstring>
#include <map>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/data_message.h"
#include "common/protocol.h"
#include "server/partition_engine.h"

namespace shardps {
namespace {

// A backup's refusal `s` of an update routed at epoch `routed_at` says only
// that it dropped its copy at a later map (`backup_epoch`): a copy moved to
// a server that joined, once synced there. Nothing differs; the map that
// dropped it takes it off the partition's backups.
bool MovedAway(const absl::Status& s, uint64_t routed_at, uint64_t backup_epoch) {
  return s.code() == absl::StatusCode::kNotFound && backup_epoch > routed_at;
}

// The end of a copy's refusal of a replica update whose sender is no longer
// its partition's primary (HandleReplica): the copy was promoted, or follows
// another primary. HandleReplicaAck tells the sender so by it.
constexpr absl::string_view kFromReplacedPrimary = "refusing a replica update from a replaced primary";

// Whether a backup at `backup_epoch` refused an update because this server,
// at `epoch`, was replaced as the partition's primary in a map it has not
// installed yet (it was paused, or cut off from the scheduler, and declared
// dead meanwhile).
bool Deposed(const absl::Status& s, uint64_t epoch, uint64_t backup_epoch) {
  return s.code() == absl::StatusCode::kFailedPrecondition && backup_epoch > epoch &&
         absl::StrContains(s.message(), kFromReplacedPrimary);
}

}  // namespace

uint64_t PartitionEngine::ConfirmedBy(const Partition& p) {
  uint64_t confirmed = p.sent;
  for (const Backup& b : p.backups) {
    if (b.confirmed < b.last_sent) confirmed = std::min(confirmed, b.confirmed);
  }
  return confirmed;
}

PartitionEngine::Backup* PartitionEngine::BackupOn(Partition& p, uint32_t server) {
  auto b = std::find_if(p.backups.begin(), p.backups.end(), [server](const Backup& b) { return b.server == server; });
  return b == p.backups.end() ? nullptr : &*b;
}

uint64_t PartitionEngine::ListedAt(const PartitionInfo& info, uint32_t server) {
  auto it = info.listed_at().find(server);
  return it != info.listed_at().end() ? it->second : 0;
}

void PartitionEngine::UpdateRole(Partition& p, const PartitionInfo& info, bool created, uint64_t since) {
  const bool primary = info.server() == server_index_;
  if (created || info.server() != p.primary_server) p.primary_since = since;
  p.primary_server = info.server();
  if (primary && !p.primary && !p.synced) {
    LOG(ERROR) << "server " << server_index_ << ": " << LostCopy(p).message();
  }
  if (primary && !p.primary) {
    // Promoted: take over with the last update applied here. Sync rounds
    // before it are done for everyone; the open round starts empty, and
    // every worker's retry of it (same request ids) counts once.
    LOG(WARNING) << "server " << server_index_ << ": now the primary of partition " << p.id << " ("
                 << p.completed << (RoundBased(config_) ? " rounds" : " updates") << " applied here)";
    if (RoundBased(config_)) {
      std::fill(p.next_round.begin(), p.next_round.end(), p.completed);
      // A worker that rejoins at a later round owes that one.
      for (size_t w = 0; w < join_round_.size(); ++w) p.next_round[w] = std::max(p.completed, join_round_[w]);
    }
    ++stats_.promotions;
    // SSP: paces are learned afresh from each worker's next push here.
    std::fill(p.clock.begin(), p.clock.end(), 0);
    p.handed_off_at = 0;
    p.arrivals = p.gradients = 0;
    p.first.rebuild();  // the open round's first gradient, if held
    p.round_staleness = 0;
    std::fill(p.contributed.begin(), p.contributed.end(), false);
    std::fill(p.no_gradient.begin(), p.no_gradient.end(), false);
    p.forwarding_round = false;
    p.counted_order.clear();
    p.open_pushes.clear();
    p.sent = 0;
  }
  p.primary = primary;
  // Before the backups are listed: a promoted copy has none yet (each gets
  // a snapshot below, which holds what this replays), so nothing it
  // replicates reaches a copy before its snapshot.
  if (primary) ReplayForwarded(p);
  std::vector<Backup> backups;
  std::vector<uint32_t> added;
  if (primary) {
    for (uint32_t server : info.backups()) {
      const std::string address = server < server_addresses_.size() ? server_addresses_[server] : "";
      const uint64_t listed_at = ListedAt(info, server);
      auto it = std::find_if(p.backups.begin(), p.backups.end(), [&](const Backup& b) {
        return b.server == server && b.address == address && b.listed_at >= listed_at;
      });
      // A copy that was listed keeps its confirmations; a new one starts
      // with what was sent so far and first gets the whole state.
      backups.push_back(it != p.backups.end() ? *it : Backup{server, address, listed_at, p.sent, p.sent});
      if (it == p.backups.end() && !created) added.push_back(server);
    }
  }
  p.backups = std::move(backups);
  // A new copy lacks the open round's pushes forwarded so far: this round
  // goes to the backups as its sum.
  if (!added.empty()) p.forwarding_round = false;
  // A copy promoted before it was complete passes nothing on (LostCopy).
  if (p.synced) {
    for (uint32_t b : added) SendSnapshot(p, b);
  }
  OnConfirmed(p);  // a backup that died holds nothing back any more
}

DataHeader PartitionEngine::ForwardedHeader(const DataHeader& h) {
  DataHeader f;
  f.set_replica_of(PUSH_PULL);
  f.set_round(h.round());
  f.set_worker_rank(h.worker_rank());
  f.set_replica_request_id(h.request_id());
  f.set_codec(h.codec());
  f.set_no_gradient(h.no_gradient());
  if (h.has_based_on()) f.set_based_on(h.based_on());
  return f;
}

void PartitionEngine::ForwardPush(Partition& p, const DataHeader& h, const zmq::message_t& payload) {
  Replicate(p, ForwardedHeader(h), payload.data(), payload.size());
}

absl::Status PartitionEngine::CheckForwarded(const Partition& p, const DataHeader& h, uint64_t completed) const {
  // Only a round-based primary forwards pushes (PushSync); a copy applied
  // on arrival would count one, once promoted, into a round it lacks.
  if (!RoundBased(config_)) return absl::InvalidArgumentError("forwarded push to a copy that is not round based");
  if (h.worker_rank() >= config_.num_workers()) return absl::InvalidArgumentError("forwarded push names a bad worker rank");
  // The primary forwards pushes of rounds at most max_ahead_ past its own,
  // and this copy is at most one round behind it: farther is a bad update
  // (and would be held here for ever).
  if (h.round() > completed + 1 + max_ahead_) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.id, ": forwarded push of round ", h.round(),
                                                   ", more than ", max_ahead_ + 1, " rounds past this copy's ",
                                                   completed));
  }
  if (!h.no_gradient() && h.codec() != PushCodec(p, h.round()).spec) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.id, ": forwarded push of round ", h.round(),
                                                   " in codec '", h.codec(), "', expected '",
                                                   PushCodec(p, h.round()).spec, "'"));
  }
  return absl::OkStatus();
}

bool PartitionEngine::ForwardedPushFits(const Partition& p, const DataHeader& h, size_t bytes) const {
  // What the worker sent (Validate's bounds): a raw push n floats, which
  // Accumulate reads; one with no gradient nothing.
  if (h.no_gradient()) return bytes == 0;
  if (PushCodec(p, h.round()).raw()) return bytes == p.n * sizeof(float);
  return bytes > 0 && bytes <= p.n * 8 + 64;
}

void PartitionEngine::HoldForwarded(Partition& p, const DataHeader& h, const void* data, size_t bytes) {
  // Ssp: a removed worker's push parked when it was removed counts on no
  // promoted copy (ApplyMembership).
  if (forwards_pushes_ && RemovedPush(p, h)) return;
  // Kept as the worker sent it, until its round is applied here.
  DataHeader push;
  push.set_op(PUSH_PULL);
  push.set_worker_rank(h.worker_rank());
  push.set_partition_id(p.id);
  push.set_round(h.round());
  push.set_request_id(h.replica_request_id());
  push.set_codec(h.codec());
  push.set_num_elements(p.n);
  push.set_dtype(FLOAT32);
  push.set_no_gradient(h.no_gradient());
  if (h.has_based_on()) push.set_based_on(h.based_on());
  ParkedPush forwarded{zmq::message_t(), push, zmq::message_t(data, bytes), true};
  if (ParkedPush* held = FindForwarded(p, h.worker_rank(), h.round())) {
    *held = std::move(forwarded);  // in place: a promoted copy replays them in order
  } else {
    p.forwarded.push_back(std::move(forwarded));
  }
}

void PartitionEngine::ForwardCounted(Partition& p, const DataHeader& h, const zmq::message_t& payload,
                                     size_t bytes) {
  if (p.arrivals == 0) {
    const uint64_t live = config_.num_workers() - num_excluded_;
    p.forwarding_round = !p.backups.empty() && PushCodec(p, h.round()).codec != nullptr &&
                         bytes * live < p.n * sizeof(float);
  }
  if (!p.forwarding_round) return;
  p.counted_order.push_back(h.worker_rank());
  ForwardPush(p, h, payload);
}

PartitionEngine::ParkedPush* PartitionEngine::FindForwarded(Partition& p, uint32_t w, uint64_t round) {
  for (ParkedPush& f : p.forwarded) {
    if (f.header.worker_rank() == w && f.header.round() == round) return &f;
  }
  return nullptr;
}

absl::Status PartitionEngine::SumForwarded(Partition& p, const DataHeader& h) {
  auto clear = [&p] {
    p.arrivals = p.gradients = 0;
    std::fill(p.contributed.begin(), p.contributed.end(), false);
    std::fill(p.no_gradient.begin(), p.no_gradient.end(), false);
  };
  clear();
  for (uint32_t w : h.summed_workers()) {
    ParkedPush* held = FindForwarded(p, w, h.round());
    if (held->header.no_gradient()) {
      p.no_gradient[w] = true;
    } else if (absl::Status s = Accumulate(p, w, h.round(), &held->payload); !s.ok()) {
      // The primary decoded the same bytes: a failure here means a buggy or
      // hostile primary. The update is refused; what was summed so far is
      // scratch (p.acc and the per-rank buffers are a backup's scratch).
      clear();
      return absl::InvalidArgumentError(absl::StrCat("partition ", p.id, ": round ", h.round(), " sums worker ", w,
                                                     "'s forwarded push, which does not decode: ", s.message()));
    } else {
      ++p.gradients;
    }
    p.contributed[w] = true;
    ++p.arrivals;
  }
  if (h.no_gradient() != (p.gradients == 0)) {
    // The primary skips a round exactly when none of its pushes carries a
    // gradient: else this copy would apply what its sum buffer still holds
    // (or skip gradients the primary applied).
    clear();
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.id, ": round ", h.round(), " sums ",
                                                   h.summed_workers_size(), " forwarded pushes, ", p.gradients,
                                                   " of them with a gradient, and says it ",
                                                   h.no_gradient() ? "carries none" : "carries some"));
  }
  SumRound(p);
  return absl::OkStatus();
}

void PartitionEngine::ReplayForwarded(Partition& p) {
  // In the order the old primary received them, so each worker's rounds
  // come in order; their answers went out already or come with the
  // workers' retries.
  std::vector<ParkedPush> pushes = std::move(p.forwarded);
  p.forwarded.clear();
  // Rounds in order, arrival order within a round: a re-created copy holds
  // its snapshot's pushes (the open rounds') before those forwarded since,
  // which may be of an earlier round than the snapshot's parked ones.
  std::stable_sort(pushes.begin(), pushes.end(),
                   [](const ParkedPush& a, const ParkedPush& b) { return a.header.round() < b.header.round(); });
  for (ParkedPush& push : pushes) {
    if (push.header.round() < p.completed) continue;
    PushSync(p, push.peer, push.header, &push.payload, /*answer=*/false);
  }
}

compression::ErrorFeedback* PartitionEngine::PullFeedback(const Partition& p) const {
  if (!sum_only_ || p.codecs.pull == nullptr) return nullptr;
  auto it = pull_feedback_.find(p.codecs.pull_spec);
  return it != pull_feedback_.end() ? it->second.get() : nullptr;
}

bool PartitionEngine::CarriesEncodedAnswer(const Partition& p) const {
  return RoundBased(config_) && p.codecs.pull != nullptr;
}

size_t PartitionEngine::SnapshotBytes(const Partition& p) const {
  const size_t floats = p.n + p.state.size() + (p.delta_pulls ? p.n : 0) + (sum_only_ ? p.n : 0) +
                        (PullFeedback(p) != nullptr ? p.n : 0);
  return floats * sizeof(float) + (4 * p.last_request.size() + 1) * sizeof(uint64_t) +
         (PullFeedback(p) != nullptr ? sizeof(uint64_t) : 0) + (CarriesEncodedAnswer(p) ? sizeof(uint64_t) : 0);
}

size_t PartitionEngine::SnapshotStateBytes(const Partition& p, const zmq::message_t& payload) const {
  const size_t fixed = SnapshotBytes(p);
  if (!CarriesEncodedAnswer(p) || payload.size() < fixed) return fixed;
  uint64_t encoded = 0;
  std::memcpy(&encoded, payload.data<char>() + fixed - sizeof(encoded), sizeof(encoded));
  return fixed + std::min<uint64_t>(encoded, payload.size());  // a wrong length cannot overflow
}

// Layout: weights, optimizer state, [mirror], [aggregate] as float32, then
// per worker last request id, pushes applied, their PushDigests summed and the registration of the
// rejoin those follow (0: none) as uint64, whether an INIT
// was applied as uint64 (0 or 1), then [the
// aggregates' error feedback: encodings made as uint64, residual as float32
// (zeros before the first)], then [the last round's encoded answer: its
// length as uint64 (0: none was encoded), its bytes], then the open rounds'
// pushes (ssp in rounds; else none): their count as uint64, then each as its
// forwarded header's length (uint64), header, payload length (uint64),
// payload; completed rounds in the header's round, the last round's contributors in its contributors. The
// servers' feedback has no momentum or warm-up: the residual and the count
// are its whole state.
void PartitionEngine::SendSnapshot(Partition& p, uint32_t server) {
  // An open async batch's request ids are taken at arrival: its gradient
  // goes in the snapshot too, or the copy would take the batch's update
  // for one it has.
  if (p.batch_count > 0) ApplyAsyncBatch(p);
  std::string bytes;
  bytes.reserve(SnapshotBytes(p));
  // n may be 0 with a null data() (SGD keeps no optimizer state).
  auto put = [&bytes](const void* data, size_t n) {
    if (n > 0) bytes.append(static_cast<const char*>(data), n);
  };
  put(p.weights->data(), p.n * sizeof(float));
  put(p.state.data(), p.state.size() * sizeof(float));
  if (p.delta_pulls) put(p.mirror.data(), p.n * sizeof(float));
  if (sum_only_) put(p.aggregate->data(), p.n * sizeof(float));
  put(p.last_request.data(), p.last_request.size() * sizeof(uint64_t));
  put(p.applied_by.data(), p.applied_by.size() * sizeof(uint64_t));
  put(p.applied_digest.data(), p.applied_digest.size() * sizeof(uint64_t));
  std::vector<uint64_t> joined(p.last_request.size(), 0);
  std::copy_n(join_incarnation_.begin(), std::min(joined.size(), join_incarnation_.size()), joined.begin());
  put(joined.data(), joined.size() * sizeof(uint64_t));
  // A copy made before the INIT must still take it when it comes.
  const uint64_t initialized = p.initialized ? 1 : 0;
  put(&initialized, sizeof(initialized));
  if (compression::ErrorFeedback* feedback = PullFeedback(p)) {
    compression::ErrorFeedback::KeyCopy copy = feedback->Save(p.id);
    const uint64_t calls = copy.calls;
    copy.residual.resize(p.n, 0.0f);
    put(&calls, sizeof(calls));
    put(copy.residual.data(), p.n * sizeof(float));
  }
  if (CarriesEncodedAnswer(p)) {
    const uint64_t encoded = p.encoded && p.encoded_round == static_cast<int64_t>(p.completed) ? p.encoded_bytes : 0;
    put(&encoded, sizeof(encoded));
    if (encoded > 0) put(p.encoded->byte_data(), encoded);
  }
  // SSP in rounds: the open rounds' pushes, counted then parked, some of
  // them answered already; the copy holds them from the moment it is synced
  // (a copy promoted without them would lose them).
  std::vector<const ParkedPush*> open;
  if (forwards_pushes_) {
    for (const ParkedPush& push : p.open_pushes) open.push_back(&push);
    for (const ParkedPush& push : p.ahead) open.push_back(&push);
  }
  const uint64_t count = open.size();
  put(&count, sizeof(count));
  for (const ParkedPush* push : open) {
    const std::string header = ForwardedHeader(push->header).SerializeAsString();
    const uint64_t header_bytes = header.size();
    const uint64_t payload_bytes = push->payload.size();
    put(&header_bytes, sizeof(header_bytes));
    put(header.data(), header.size());
    put(&payload_bytes, sizeof(payload_bytes));
    put(push->payload.data(), push->payload.size());
  }
  DataHeader h;
  h.set_replica_of(SNAPSHOT);
  h.set_round(p.completed);
  // Answers name the last round's contributors (a retry of it, once promoted).
  h.set_contributors(p.contributors);
  h.set_skipped_rounds(p.skipped);
  h.set_no_gradient(p.last_skipped);
  Replicate(p, h, bytes.data(), bytes.size(), server);  // this one only; the others have the state
  for (Backup& b : p.backups) {
    if (b.server != server) continue;
    b.snapshot_at = p.sent;
    b.snapshot_epoch = epoch_;
  }
  ++stats_.snapshots_sent;
  LOG(WARNING) << "server " << server_index_ << ": re-creating a copy of partition " << p.id << " on server "
               << server << " (" << bytes.size() << " bytes at update " << p.sent << ", round " << p.completed
               << (open.empty() ? "" : absl::StrCat(", with ", open.size(), " pushes of open rounds")) << ")";
}

absl::StatusOr<std::vector<PartitionEngine::SnapshotPush>> PartitionEngine::SnapshotPushes(
    const Partition& p, const DataHeader& h, const zmq::message_t& payload) const {
  const size_t state = SnapshotStateBytes(p, payload);
  auto bad = [&p](const auto&... what) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot of partition ", p.id, ": ", what...));
  };
  if (payload.size() < state + sizeof(uint64_t)) {
    return bad(payload.size(), " bytes, expected at least ", state + sizeof(uint64_t));
  }
  const char* in = payload.data<char>() + state;
  size_t left = payload.size() - state;
  auto take = [&in, &left](uint64_t* value) {
    if (left < sizeof(*value)) return false;
    std::memcpy(value, in, sizeof(*value));
    in += sizeof(*value);
    left -= sizeof(*value);
    return true;
  };
  uint64_t count = 0;
  take(&count);
  std::vector<SnapshotPush> pushes;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t header_bytes = 0;
    if (!take(&header_bytes) || header_bytes > left) return bad("push ", i, " of ", count, " is cut short");
    if (header_bytes > kMaxHeaderBytes) return bad("push ", i, "'s header of ", header_bytes, " bytes is too long");
    SnapshotPush push;
    if (!push.header.ParseFromArray(in, static_cast<int>(header_bytes))) return bad("push ", i, "'s header does not parse");
    in += header_bytes;
    left -= header_bytes;
    uint64_t bytes = 0;
    if (!take(&bytes) || bytes > left) return bad("push ", i, " of ", count, " is cut short");
    push.data = in;
    push.bytes = bytes;
    in += bytes;
    left -= bytes;
    if (push.header.replica_of() != PUSH_PULL || push.header.round() < h.round()) {
      return bad("push ", i, " is not a worker's push of a round the snapshot leaves open");
    }
    if (absl::Status s = CheckForwarded(p, push.header, h.round()); !s.ok()) return bad("push ", i, ": ", s.message());
    if (!ForwardedPushFits(p, push.header, bytes)) return bad("push ", i, " carries ", bytes, " bytes");
    pushes.push_back(push);
  }
  if (left != 0) return bad(left, " bytes after its ", count, " pushes");
  return pushes;
}

void PartitionEngine::ApplySnapshot(Partition& p, const DataHeader& h, const zmq::message_t& payload) {
  const char* in = payload.data<char>();
  auto take = [&in](void* out, size_t n) {
    if (n == 0) return;  // out may be null (SGD keeps no optimizer state)
    std::memcpy(out, in, n);
    in += n;
  };
  take(WritableWeights(p), p.n * sizeof(float));
  take(p.state.data(), p.state.size() * sizeof(float));
  if (p.delta_pulls) take(p.mirror.data(), p.n * sizeof(float));
  if (sum_only_) {
    if (!p.aggregate->unique()) p.aggregate.reset(SharedBuffer::Create(p.n));  // still being sent
    take(p.aggregate->data(), p.n * sizeof(float));
  }
  take(p.last_request.data(), p.last_request.size() * sizeof(uint64_t));
  take(p.applied_by.data(), p.applied_by.size() * sizeof(uint64_t));
  take(p.applied_digest.data(), p.applied_digest.size() * sizeof(uint64_t));
  std::vector<uint64_t> joined(p.last_request.size());
  take(joined.data(), joined.size() * sizeof(uint64_t));
  for (size_t w = 0; w < joined.size() && w < join_incarnation_.size(); ++w) {
    // This copy installed a map whose rejoin the primary had not applied
    // when it took the snapshot (maps keep listing a rejoin): the counters
    // are the old process's; the new one numbers its requests afresh.
    if (join_incarnation_[w] != 0 && join_incarnation_[w] != joined[w]) {
      p.last_request[w] = 0;
      p.applied_by[w] = 0;
      p.applied_digest[w] = 0;
    }
  }
  uint64_t initialized = 0;
  take(&initialized, sizeof(initialized));
  if (compression::ErrorFeedback* feedback = PullFeedback(p)) {
    compression::ErrorFeedback::KeyCopy copy;
    uint64_t calls = 0;
    take(&calls, sizeof(calls));
    copy.calls = static_cast<int64_t>(calls);
    copy.residual.resize(p.n);
    take(copy.residual.data(), p.n * sizeof(float));
    feedback->Restore(p.id, std::move(copy));
  }
  p.encoded_round = -1;
  if (CarriesEncodedAnswer(p)) {
    uint64_t encoded = 0;
    take(&encoded, sizeof(encoded));
    if (encoded > 0) {
      if (!p.encoded || !p.encoded->unique() || p.encoded->bytes() < encoded) {
        p.encoded.reset(SharedBuffer::Create((encoded + sizeof(float) - 1) / sizeof(float)));
      }
      take(p.encoded->byte_data(), encoded);
      p.encoded_bytes = encoded;
      p.encoded_round = static_cast<int64_t>(h.round());
    }
  }
  p.completed = h.round();
  // Held pushes of rounds the snapshot covers are never summed or replayed.
  std::erase_if(p.forwarded, [&p](const ParkedPush& f) { return f.header.round() < p.completed; });
  // The open rounds' pushes (HandleReplica checked them).
  if (auto pushes = SnapshotPushes(p, h, payload); pushes.ok()) {
    for (const SnapshotPush& push : *pushes) HoldForwarded(p, push.header, push.data, push.bytes);
  }
  p.contributors = h.contributors();
  p.skipped = std::min(h.skipped_rounds(), p.completed);
  p.last_skipped = h.no_gradient() && p.completed > 0;
  p.initialized = initialized != 0 || p.completed > 0;
  p.synced = true;
  p.applied_snapshot = SnapshotId{h.replica_from(), h.epoch(), h.request_id()};
  ++copies_generation_;
}

std::vector<uint64_t> PartitionEngine::SyncedCopies() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : partitions_) {
    if (p->synced) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool PartitionEngine::Settled(const Partition& p) const { return ConfirmedBy(p) == p.sent; }

uint64_t PartitionEngine::Replicate(Partition& p, DataHeader h, const void* data, size_t bytes,
                                    std::optional<uint32_t> only) {
  return Replicate(p, std::move(h), bytes, only, [data, bytes] {
    return bytes > 0 ? zmq::message_t(data, bytes) : zmq::message_t();
  });
}

uint64_t PartitionEngine::Replicate(Partition& p, DataHeader h, SharedBuffer& sum) {
  return Replicate(p, std::move(h), sum.bytes(), std::nullopt, [&sum] { return sum.ZeroCopyMessage(); });
}

uint64_t PartitionEngine::Replicate(Partition& p, DataHeader h, size_t bytes, std::optional<uint32_t> only,
                                    absl::FunctionRef<zmq::message_t()> payload_for_one) {
  if (p.backups.empty() || !replicate_) return 0;
  ++p.sent;
  h.set_op(REPLICATE);
  h.set_replica_from(server_index_);
  h.set_request_id(p.sent);
  h.set_partition_id(p.id);
  h.set_epoch(epoch_);
  h.set_num_elements(p.n);
  h.set_dtype(FLOAT32);
  for (Backup& b : p.backups) {
    if (only && b.server != *only) continue;
    zmq::message_t payload = payload_for_one();
    replicate_(b.server, h, payload);
    ++stats_.replicated;
    stats_.replicated_bytes += bytes;
    b.last_sent = p.sent;
  }
  return p.sent;
}

void PartitionEngine::AnswerWhenConfirmed(Partition& p, const zmq::message_t& peer, const DataHeader& request,
                                          uint64_t sequence) {
  if (sequence <= ConfirmedBy(p)) {
    AnswerWeights(p, peer, request);
    return;
  }
  p.unconfirmed.push_back(Waiter{zmq::message_t(peer.data(), peer.size()), request});
  p.unconfirmed.back().header.set_round(sequence);
}

void PartitionEngine::OnConfirmed(Partition& p) {
  const uint64_t confirmed = ConfirmedBy(p);
  std::vector<Waiter> still;
  for (Waiter& waiter : p.unconfirmed) {
    if (waiter.header.round() <= confirmed) {
      AnswerWeights(p, waiter.peer, waiter.header);
    } else {
      still.push_back(std::move(waiter));
    }
  }
  p.unconfirmed = std::move(still);
  if (RoundBased(config_) && confirmed == p.sent) FinishRound(p);
}

void PartitionEngine::HandleReplicaAck(uint32_t from_server, const DataHeader& answer) {
  auto it = partitions_.find(answer.partition_id());
  if (it == partitions_.end()) return;
  Partition& p = *it->second;
  Backup* b = BackupOn(p, from_server);
  if (!p.primary || b == nullptr) return;  // from a copy the map no longer lists
  const absl::Status s = ResponseStatus(answer);
  if (Deposed(s, epoch_, answer.server_epoch())) {
    // The update is no one's to confirm: answered OK, what waits for it
    // would acknowledge to a worker an update the job's primary never
    // applied (chaos16). It stays unanswered, for the workers to re-send by
    // the newer map, and no snapshot re-creates that copy: it is no copy of
    // this one any more.
    LOG_IF(WARNING, !p.deposed_said)
        << "server " << server_index_ << ": backup server " << from_server << " (shard map epoch "
        << answer.server_epoch() << ", this server's " << epoch_ << ") says another server is the primary of "
        << "partition " << p.id << ": this server was replaced meanwhile; its requests are left for the workers "
        << "to re-send by the newer map";
    p.deposed_said = true;
    return;
  }
  const bool moved_away = !s.ok() && MovedAway(s, epoch_, answer.server_epoch());
  if (moved_away) {
    VLOG(1) << "server " << server_index_ << ": backup server " << from_server << " no longer holds partition "
            << p.id << " (its shard map epoch " << answer.server_epoch() << ", this server's " << epoch_ << ")";
  } else if (!s.ok()) {
    // The copies may differ from here on: say so loudly, and do not stall
    // training on a copy that will never confirm.
    ++stats_.errors;
    ++stats_.errors_by_code[StatSlot(static_cast<int>(s.code()), stats_.errors_by_code.size(), 2)];
    LOG(ERROR) << "server " << server_index_ << ": backup server " << from_server << " refused update "
               << answer.request_id() << " of partition " << p.id << ": " << s;
  }
  b->confirmed = std::max(b->confirmed, std::min(answer.request_id(), p.sent));
  // A copy that refused an update lacks it (or its whole state): it differs
  // from here on. Re-created once its server serves this epoch (a refusal
  // of a later update says so), after the last snapshot was answered; the
  // refusals of updates sent before that snapshot are covered by it.
  if (!s.ok() && !moved_away && answer.request_id() >= b->snapshot_at) b->needs_snapshot = true;
  if (b->needs_snapshot && answer.server_epoch() == epoch_ && b->confirmed >= b->snapshot_at) {
    b->needs_snapshot = false;
    if (b->snapshots_again < kSnapshotTries) {
      ++b->snapshots_again;
      LOG(WARNING) << "server " << server_index_ << ": backup server " << b->server << " refused an update of partition "
                   << p.id << ": re-creating its copy (" << b->snapshots_again << " of " << kSnapshotTries << " tries)";
      SendSnapshot(p, b->server);
    } else {
      LOG(ERROR) << "server " << server_index_ << ": backup server " << b->server << " still refuses updates of partition "
                 << p.id << " after " << kSnapshotTries << " snapshots: its copy differs from this one";
    }
  }
  OnConfirmed(p);
  if (!handing_off_.empty()) ProgressHandoffs();
}

std::vector<uint64_t> PartitionEngine::ConnectionToBackupBroke(uint32_t server) {
  std::vector<uint64_t> resent;
  for (auto& [id, p] : partitions_) {
    if (!p->primary) continue;
    const Backup* b = BackupOn(*p, server);
    if (b == nullptr || b->confirmed >= b->last_sent) continue;
    SendSnapshot(*p, server);
    resent.push_back(id);
  }
  std::sort(resent.begin(), resent.end());
  return resent;
}

void PartitionEngine::ProbeUnconfirmedSnapshots() {
  for (auto& [id, p] : partitions_) {
    if (!p->primary) continue;
    for (Backup& b : p->backups) {
      const bool unconfirmed = b.snapshot_at > 0 && b.confirmed < b.snapshot_at;
      // Sent again blindly before, a snapshot merely slow queued behind
      // itself on the same link, and the partition waited for the last copy.
      // A probe is a header: one each check while it stays unconfirmed, so
      // a probe lost as well (held past its time by a server that just
      // joined) is followed by another, not waited for.
      if (unconfirmed && b.unconfirmed_snapshot == b.snapshot_at) {
        LOG_IF(WARNING, b.probed_snapshot != b.snapshot_at)
            << "server " << server_index_ << ": backup server " << b.server << " has not confirmed the snapshot of "
            << "partition " << id << " (update " << b.snapshot_at << ") since the last check: asking whether it "
            << "arrived (again every check while it stays unconfirmed)";
        ProbeSnapshot(*p, b);
      }
      b.unconfirmed_snapshot = unconfirmed ? b.snapshot_at : 0;
    }
  }
}

std::vector<PartitionEngine::ReplicationStall> PartitionEngine::CheckReplicationStalls() {
  struct Seen {
    ReplicationStall stall;  // with every partition stuck now
    bool was = false;        // some partition was reported stalled
    bool newly = false;      // some partition is stuck since this check
  };
  std::map<uint32_t, Seen> seen;  // by backup server
  for (auto& [id, p] : partitions_) {
    if (!p->primary) continue;
    for (Backup& b : p->backups) {
      const bool waiting = b.confirmed < b.last_sent && b.confirmed >= b.snapshot_at;
      const bool stuck = waiting && b.checked_waiting && b.confirmed == b.checked_confirmed;
      Seen& s = seen[b.server];
      s.stall.backup = b.server;
      s.stall.address = b.address;
      s.was |= b.stalled;
      s.newly |= stuck && !b.stalled;
      if (stuck) s.stall.partitions.push_back(id);
      b.stalled = stuck;
      b.checked_confirmed = b.confirmed;
      b.checked_waiting = waiting;
    }
  }
  std::vector<ReplicationStall> out;
  for (auto& [server, s] : seen) {
    s.stall.resumed = s.was && s.stall.partitions.empty();
    if (!s.newly && !s.stall.resumed) continue;
    std::sort(s.stall.partitions.begin(), s.stall.partitions.end());
    out.push_back(std::move(s.stall));
  }
  return out;
}

void PartitionEngine::ProbeSnapshot(const Partition& p, Backup& b) {
  b.probed_snapshot = b.snapshot_at;
  if (!replicate_) return;
  ++stats_.snapshot_probes;
  // No update number of its own: its answer confirms the snapshot, and what
  // the partition waits for stays the snapshot.
  DataHeader h;
  h.set_op(REPLICATE);
  h.set_replica_of(SNAPSHOT_PROBE);
  h.set_replica_from(server_index_);
  h.set_request_id(b.snapshot_at);
  h.set_partition_id(p.id);
  h.set_epoch(b.snapshot_epoch);  // as the snapshot: deferred with it, refused with it
  h.set_num_elements(p.n);
  h.set_dtype(FLOAT32);
  zmq::message_t none;
  replicate_(b.server, h, none);
}

absl::Status PartitionEngine::AnswerProbe(Partition& p, const DataHeader& h) {
  if (!p.synced) return AwaitingSnapshot(p);
  if (p.applied_snapshot == SnapshotId{h.replica_from(), h.epoch(), h.request_id()}) return absl::OkStatus();
  // This copy's primary re-created it (it refused an update) and that
  // snapshot did not arrive: what it holds is the state the snapshot
  // replaces, no valid copy until one does.
  p.synced = false;
  ++copies_generation_;
  return absl::FailedPreconditionError(absl::StrCat("partition ", p.id, ": the snapshot server ", h.replica_from(),
                                                    " sent as update ", h.request_id(), " (epoch ", h.epoch(),
                                                    ") has not arrived; this copy is not synced until one does"));
}

absl::Status PartitionEngine::AwaitingSnapshot(const Partition& p) {
  return absl::FailedPreconditionError(
      absl::StrCat("partition ", p.id, ": this copy is being re-created and its snapshot has not arrived"));
}

void PartitionEngine::HandleReplica(const zmq::message_t& peer, const DataHeader& h, const zmq::message_t* payload) {
  absl::Status s;
  auto it = partitions_.find(h.partition_id());
  if (it == partitions_.end()) {
    s = absl::NotFoundError(absl::StrCat("server ", server_index_, " holds no copy of partition ", h.partition_id()));
  } else if (it->second->primary) {
    s = absl::FailedPreconditionError(absl::StrCat("server ", server_index_, " is the primary of partition ",
                                                   h.partition_id(), " (epoch ", epoch_, "); ", kFromReplacedPrimary));
  } else if (h.epoch() < it->second->primary_since ||
             (h.has_replica_from() && h.replica_from() != it->second->primary_server && h.epoch() <= epoch_)) {
    // From a replaced primary (one that died with updates in flight):
    // routed before the map named this copy's primary, or sent by another
    // server while this copy's map, at least as recent as the sender's,
    // names that one (a map this server skipped can hide the change from
    // the epoch alone). Applied after the new primary's, it would make this
    // copy differ from it.
    s = absl::FailedPreconditionError(absl::StrCat(
        "replica update of partition ", h.partition_id(), " from server ",
        h.has_replica_from() ? absl::StrCat(h.replica_from()) : "?", " routed at epoch ", h.epoch(),
        ", but this copy's primary is server ", it->second->primary_server, " since epoch ", it->second->primary_since,
        " or later (this server is at ", epoch_, "): ", kFromReplacedPrimary));
  } else if (h.summed_workers_size() > 0 && (h.replica_of() != PUSH || !RoundBased(config_))) {
    s = absl::InvalidArgumentError(absl::StrCat("replica update of partition ", h.partition_id(),
                                                " names summed workers, which only a sync round's update may"));
  } else if (h.no_gradient() && (!RoundBased(config_) || (h.replica_of() != PUSH && h.replica_of() != PUSH_PULL &&
                                                          h.replica_of() != SNAPSHOT))) {
    s = absl::InvalidArgumentError(absl::StrCat("replica update of partition ", h.partition_id(),
                                                " says it carries no gradient, which only a sync round's update, a "
                                                "forwarded push or a snapshot may"));
  } else if (h.replica_of() == SNAPSHOT_PROBE) {
    s = AnswerProbe(*it->second, h);
  } else if (h.replica_of() == SNAPSHOT) {
    s = payload != nullptr ? SnapshotPushes(*it->second, h, *payload).status()
                           : absl::InvalidArgumentError(absl::StrCat("snapshot of partition ", h.partition_id(),
                                                                     " carries no payload"));
  } else {
    // A forwarded push carries what the worker sent; a round summed from
    // forwarded pushes carries nothing.
    const Partition& p = *it->second;
    const size_t got = payload != nullptr ? payload->size() : 0;
    const size_t expected = h.summed_workers_size() > 0 || h.no_gradient() ? 0 : p.n * sizeof(float);
    const bool fits = h.replica_of() == PUSH_PULL ? ForwardedPushFits(p, h, got) : got == expected;
    if (payload == nullptr || !fits) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "replica update of partition ", h.partition_id(), " carries ", got, " bytes, expected ",
          h.replica_of() == PUSH_PULL && !PushCodec(p, h.round()).raw() ? absl::StrCat("a push of 1 to ", p.n * 8 + 64)
                                                                        : absl::StrCat(expected)));
    }
  }
  bool apply = false;
  if (s.ok()) {
    auto is_new = ReplicaIsNew(*it->second, h);
    s = is_new.status();
    apply = is_new.ok() && *is_new;
    if (s.code() == absl::StatusCode::kDataLoss) {
      // This copy lacks an update: not a valid copy (nor reported synced)
      // until its primary re-creates it.
      it->second->synced = false;
      ++copies_generation_;
    }
  }
  if (apply && h.replica_of() == PUSH && h.summed_workers_size() > 0) {
    // Summed before it is confirmed, so a push that does not decode refuses
    // the update instead of leaving a copy that confirmed what it did not
    // apply. (The optimizer pass still runs after the confirmation.)
    s = SumForwarded(*it->second, h);
    apply = s.ok();
  }
  if (!s.ok() && MovedAway(s, h.epoch(), epoch_)) {
    VLOG(1) << "server " << server_index_ << ": " << s << " (moved away; the update was routed at epoch "
            << h.epoch() << ", this server is at " << epoch_ << ")";
  } else if (!s.ok()) {
    LOG(ERROR) << "server " << server_index_ << ": " << s;
  }
  // Confirmed before applying, to keep this pass off the primary's critical
  // path: this thread applies it before it handles anything else, so no
  // request can see this copy without it.
  Answer(peer, h, s);  // echoes the request id the primary matches
  if (apply) ApplyReplica(*it->second, h, *payload);
}

absl::StatusOr<bool> PartitionEngine::ReplicaIsNew(const Partition& p, const DataHeader& h) const {
  if (h.replica_of() == SNAPSHOT) {
    // An older snapshot than the one applied, from the same primary at no
    // later epoch: a copy a broken connection delivered late, after the
    // primary sent it again on the next one (ConnectionToBackupBroke).
    // Applied, it would take the copy back past every update since.
    const SnapshotId& applied = p.applied_snapshot;
    return !(applied.update != 0 && h.replica_from() == applied.from && h.epoch() <= applied.epoch &&
             h.request_id() < applied.update);
  }
  if (h.replica_of() == SNAPSHOT_PROBE) return false;  // answered (AnswerProbe), applies nothing
  if (!p.synced) return AwaitingSnapshot(p);
  if (h.replica_of() == INIT) return !p.initialized && p.completed == 0;
  if (h.replica_of() == PUSH_PULL) {  // a worker's push forwarded (ssp, compressed sync rounds)
    if (absl::Status s = CheckForwarded(p, h, p.completed); !s.ok()) return s;
    if (h.round() < p.completed) return false;  // its round is applied here already
    // Held already, unless it is another push of that round (another
    // request): the one this primary counted replaces one a replaced
    // primary forwarded (the worker re-ran its step and re-encoded it).
    const ParkedPush* held = FindForwarded(p, h.worker_rank(), h.round());
    return held == nullptr || held->header.request_id() != h.replica_request_id();
  }
  if (h.replica_of() != PUSH) return absl::InvalidArgumentError("replica update of an unknown kind");
  if (!RoundBased(config_)) {
    if (h.batch_workers_size() == 0 || h.batch_workers_size() != h.batch_request_ids_size()) {
      return absl::InvalidArgumentError("async replica update names no pushes");
    }
    bool any_new = false;
    for (int i = 0; i < h.batch_workers_size(); ++i) {
      const uint32_t w = h.batch_workers(i);
      if (w >= config_.num_workers()) return absl::InvalidArgumentError("replica update names a bad worker rank");
      // Routed before w rejoined: its previous process's push, applied
      // unless the update count says it was (below).
      any_new = any_new || h.epoch() < JoinEpoch(w) || h.batch_request_ids(i) > p.last_request[w];
    }
    if (!any_new) return false;
  }
  if (h.round() < p.completed) return false;
  if (h.round() > p.completed) {
    return absl::DataLossError(absl::StrCat("partition ", p.id, ": replica update ", h.round(),
                                            " arrived but this copy has applied ", p.completed,
                                            " (an update is missing)"));
  }
  if (h.summed_workers_size() > 0) {
    if (!RoundBased(config_) || static_cast<uint32_t>(h.summed_workers_size()) != h.contributors()) {
      return absl::InvalidArgumentError("replica update sums forwarded pushes that do not match its contributors");
    }
    std::vector<bool> seen(config_.num_workers(), false);
    for (uint32_t w : h.summed_workers()) {
      if (w >= seen.size() || seen[w]) return absl::InvalidArgumentError("replica update names a bad or repeated worker");
      seen[w] = true;
      if (FindForwarded(p, w, h.round()) == nullptr) {
        return absl::DataLossError(absl::StrCat("partition ", p.id, ": round ", h.round(), " sums worker ", w,
                                                "'s push, which was not forwarded to this copy"));
      }
    }
  }
  return true;
}

void PartitionEngine::ApplyReplica(Partition& p, const DataHeader& h, const zmq::message_t& payload) {
  const float* data = payload.data<float>();
  if (h.replica_of() == SNAPSHOT) {
    ApplySnapshot(p, h, payload);
  } else if (h.replica_of() == PUSH_PULL) {
    HoldForwarded(p, h, payload.data(), payload.size());
  } else if (h.replica_of() == INIT) {
    std::memcpy(WritableWeights(p), data, payload.size());
    if (p.delta_pulls) std::memcpy(p.mirror.data(), data, payload.size());
    p.initialized = true;
    p.encoded_round = -1;
  } else if (!RoundBased(config_)) {
    // The primary's batch of k pushes: one pass with the same scales.
    const uint32_t k = static_cast<uint32_t>(h.batch_workers_size());
    optimizer_->Apply(p.completed, 1.0f / static_cast<float>(k), data, WritableWeights(p), p.state.data(), p.n,
                      h.lr_scale() > 0 ? h.lr_scale() : 1.0f);
    for (int i = 0; i < h.batch_workers_size(); ++i) {
      const uint32_t w = h.batch_workers(i);
      // The previous process's: the rejoin started the counters afresh.
      if (h.epoch() < JoinEpoch(w)) continue;
      p.last_request[w] = std::max(p.last_request[w], h.batch_request_ids(i));
      worker_last_id_[w] = std::max(worker_last_id_[w], h.batch_request_ids(i));
      ++p.applied_by[w];
      p.applied_digest[w] += PushDigest(h.batch_request_ids(i));
    }
    p.completed += k;
    ++stats_.updates;
  } else {
    p.contributors = h.contributors() > 0 ? h.contributors() : config_.num_workers();
    p.lr_scale = h.lr_scale() > 0 ? h.lr_scale() : 1.0f;
    // Named by a bitmap, or by the workers it leaves out (in rank order).
    const auto& absent = h.round_absent_workers();
    const bool all_but_absent =
        h.round_workers().empty() && static_cast<uint64_t>(absent.size()) + h.contributors() == p.applied_by.size();
    for (uint32_t w = 0, next_absent = 0; w < p.applied_by.size(); ++w) {
      while (next_absent < static_cast<uint32_t>(absent.size()) && absent[next_absent] < w) ++next_absent;
      const bool summed = w / 8 < h.round_workers().size()
                              ? (h.round_workers()[w / 8] >> (w % 8) & 1) != 0
                              : all_but_absent && !(next_absent < static_cast<uint32_t>(absent.size()) &&
                                                    absent[next_absent] == w);
      // As the primary counted it: a rejoin it had not installed yet when it
      // sent this started the counters afresh after this round.
      if (summed && h.epoch() >= JoinEpoch(w)) ++p.applied_by[w];
    }
    // Applied from the message (aligned by Handle); a round summed from
    // forwarded pushes is in p.acc already (HandleReplica).
    if (h.no_gradient()) {
      SkipRound(p);
    } else {
      ApplyRound(p, h.summed_workers_size() == 0 ? data : nullptr);
    }
    std::erase_if(p.forwarded, [&p](const ParkedPush& f) { return f.header.round() < p.completed; });
  }
}

void PartitionEngine::RunDeferred() {
  std::vector<Deferred> ready = std::move(deferred_);
  deferred_.clear();
  for (Deferred& d : ready) {
    if (d.header.epoch() > epoch_ && d.header.epoch() <= epoch_ + kEpochsAhead) {
      deferred_.push_back(std::move(d));
      continue;
    }
    Handle(d.peer, d.header, d.has_payload ? &d.payload : nullptr);
  }
}

EngineQueues PartitionEngine::Queues() const {
  EngineQueues q;
  q.deferred = deferred_.size();
  for (const auto& [id, p] : partitions_) {
    q.waiting_pulls += p->waiting.size();
    q.parked_pushes += p->ahead.size();
    q.unconfirmed += p->unconfirmed.size();
    q.bounded += p->bounded.size();
    q.handoff_held += p->handoff_held.size();
    q.forwarded += p->forwarded.size();
    if (p->primary) q.replication_lag += p->sent - ConfirmedBy(*p);
  }
  return q;
}

std::vector<PartitionReport> PartitionEngine::Reports(size_t max, size_t* held) const {
  std::vector<uint64_t> ids;
  ids.reserve(partitions_.size());
  for (const auto& [id, p] : partitions_) ids.push_back(id);
  if (held != nullptr) *held = ids.size();
  if (ids.size() > max) {
    std::nth_element(ids.begin(), ids.begin() + max, ids.end());
    ids.resize(max);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<PartitionReport> out;
  out.reserve(ids.size());
  for (uint64_t id : ids) {
    const Partition& p = *partitions_.at(id);
    PartitionReport r{id, p.tensor, p.primary, p.completed, p.stale_gradients, p.staleness_sum, p.staleness_max, {}};
    for (const Backup& b : p.backups) {  // none unless primary
      r.backup_lag.emplace_back(b.server, b.last_sent > b.confirmed ? b.last_sent - b.confirmed : 0);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace shardps
