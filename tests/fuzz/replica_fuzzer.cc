// Fuzzes the backup side of replication: a real PartitionEngine that is
// server 1, a BACKUP of partition 5 whose primary is server 0 (with three
// servers, server 2 another backup), handed REPLICATE requests as a primary
// sends them (INIT, sync rounds' sums, rounds summed from forwarded pushes,
// forwarded pushes, async batches, snapshots) with fuzzed fields and
// payloads that are mostly the right size, and shard maps that keep it a
// backup, promote it (then workers push and pull), add or remove backups,
// exclude a worker, or give its copy back after maps it skipped (a later
// listed_at, as the scheduler sets for each copy it gives). A buggy primary, or a hostile peer holding a server key,
// may send anything: the backup must never crash, leak or read out of bounds.
// Invariants checked after each request:
//  - every answer is a RESPONSE; a worker's uncompressed answer holds what
//    its header says;
//  - a refused replica update leaves the weights and the update count as
//    they were; a confirmed one was applied whole (or had been before);
//  - the weights stay finite while every payload the input sent was finite
//    (and learning-rate scales at most 1);
//  - the forwarded pushes a backup holds stay within workers x (the rounds
//    a push may run ahead + 2).
// Pair mode (n byte bit 7) runs a real primary beside the backup instead,
// with failures (what the dead primary sent may be lost), re-created
// copies (a new process, or a live server given its copy back after it
// skipped the maps that dropped it, its copy behind), hand-offs of the primary role, workers removed and rejoining (in
// the same maps as the role changes, too), and workers that re-send what
// was not answered, and checks that the two copies are bitwise equal
// whenever nothing is in flight, that a push answered OK has its round on
// the backup, that no answer shows a round the backup lacks, that a
// removed worker is refused, and that none is lost (class Pair).
//
// Input: [variant][variant2][n: bit 7 pair mode, bit 6 a partition of 1024+]
// then up to 64 requests: [kind][...fields...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/config.h"
#include "common/data_message.h"
#include "common/optimizer.h"
#include "common/protocol.h"
#include "compression/codec_policy.h"
#include "server/partition_engine.h"
#include "tests/fuzz/engine_answer.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

constexpr const char* kCodecs[] = {"none", "fp16", "2bit:threads=1", "onebit:threads=1",
                                   "topk:ratio=0.25,threads=1", "randomk:ratio=0.5,threads=1", "bf16", "none"};
constexpr uint64_t kPartition = 5;
constexpr uint32_t kThisServer = 1;
constexpr uint64_t kMaxRoundsAhead = 4;  // server/partition_engine.cc

// The cluster variant: consistency (sync, ssp in rounds, ssp on arrival,
// async), determinism, optimizer, update mode, codecs, workers, servers.
ClusterConfig Config(uint8_t bits, uint8_t bits2) {
  ClusterConfig c;
  switch (bits & 3) {
    case 0: c.set_consistency(SYNC); break;
    case 1: c.set_consistency(SSP); c.set_ssp_in_rounds(true); break;
    case 2: c.set_consistency(SSP); break;
    default: c.set_consistency(ASYNC); break;
  }
  if (c.consistency() == SSP) c.set_staleness(1 + (bits2 >> 2) % 3);
  c.set_deterministic(bits & 4);
  c.set_update_mode(bits & 0x10 ? SUM_ONLY : UPDATE_ON_SERVER);
  c.set_num_workers(2 + (bits2 >> 4 & 1));
  c.set_num_servers(bits2 & 2 ? 3 : 2);
  c.set_replication(bits2 & 2 ? 3 : 2);
  c.mutable_optimizer()->set_kind(bits & 8 ? OptimizerConfig::ADAM : OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(0.5f);
  c.set_reject_non_finite(bits2 & 0x20);
  c.set_staleness_aware_lr(bits2 & 0x40);
  const char* codec = kCodecs[bits >> 5];
  c.mutable_compression()->set_codec(codec);
  if (bits2 & 1) c.mutable_compression()->set_pull_codec(codec);
  return c;
}

// The harness's side of the cluster: what it sent, what the engine answered.
struct Cluster {
  ClusterConfig config;
  uint64_t n = 0;
  uint32_t workers = 0;
  bool three = false;
  uint64_t epoch = 3;
  uint32_t primary = 0;
  std::vector<uint32_t> backups;
  std::vector<uint32_t> excluded;  // removed workers (pair mode: until they rejoin)
  std::vector<WorkerRejoin> rejoins;  // pair mode: workers that rejoined the job, the latest per rank
  uint64_t handoff_epoch = 0;  // pair mode: the map that listed a hand-off to backups[0] (0: none)
  uint32_t generation[3] = {};  // per server: bumps its address, a server that joined in its place
  std::map<uint32_t, uint64_t> listed_at;  // per server: the map that gave it its copy (PartitionInfo.listed_at)
  compression::PartitionCodecs codecs;
  int state_slots = 0;
  uint64_t replica_id = 0;
  // Replica updates the engine sent as primary, not confirmed yet.
  std::deque<DataHeader> unconfirmed;
  // The answers of the request being handled, to the servers.
  std::vector<DataHeader> server_answers;
  // Whether every payload and learning-rate scale sent so far was finite
  // (at most 1).
  bool clean = true;
};

ShardMap Map(const Cluster& c) {
  ShardMap map;
  map.set_epoch(c.epoch);
  TensorSpec* t = map.add_tensors();
  t->set_name("t");
  t->add_shape(c.n);
  for (uint32_t s = 0; s < (c.three ? 3u : 2u); ++s) {
    ServerInfo* info = map.add_servers();
    info->set_index(s);
    info->set_data_address("tcp://s" + std::to_string(s) + ":" + std::to_string(c.generation[s]));
  }
  PartitionInfo* info = map.add_partitions();
  info->set_id(kPartition);
  info->set_tensor(0);
  info->set_num_elements(c.n);
  info->set_server(c.primary);
  for (uint32_t b : c.backups) info->add_backups(b);
  for (const auto& [server, epoch] : c.listed_at) (*info->mutable_listed_at())[server] = epoch;
  for (uint32_t w : c.excluded) map.add_excluded_workers(w);
  for (const WorkerRejoin& r : c.rejoins) *map.add_rejoined_workers() = r;
  if (c.handoff_epoch != 0) {
    Handoff* h = map.add_handoffs();
    h->set_partition(kPartition);
    h->set_from(c.primary);
    h->set_to(c.backups[0]);
    h->set_epoch(c.handoff_epoch);
  }
  return map;
}

std::set<uint32_t> Holders(const Cluster& c) {
  std::set<uint32_t> holders(c.backups.begin(), c.backups.end());
  holders.insert(c.primary);
  return holders;
}

// A new map (the next epoch, or one further: a skipped map) with the
// membership the input chooses; with bit 6, this server's backup copy was
// dropped and given back in maps it skipped (a later listed_at: it makes
// the copy anew and waits for a snapshot).
void NextMap(FuzzInput& in, Cluster& c) {
  const uint8_t b = in.Byte();
  c.epoch += 1 + (b >> 7);
  const std::set<uint32_t> held = Holders(c);
  const uint32_t generation2 = c.generation[2];
  switch (b & 7) {
    case 0: break;  // the same roles
    case 1: c.primary = 1; c.backups.clear(); break;  // promoted, alone
    case 2: c.primary = 1; c.backups = {0}; break;    // promoted, the old primary back as its backup
    case 3: c.primary = 0; c.backups = {1}; break;
    case 4:
      if (c.three) { c.primary = 2; c.backups = {1}; }  // server 0 died; server 2 took over
      break;
    case 5:
      if (c.three) { c.primary = 1; c.backups = {2}; ++c.generation[2]; }  // a re-created copy on server 2
      break;
    case 6: {
      const int w = in.Byte() % (c.workers + 1) - 1;
      c.excluded.clear();
      if (w >= 0) c.excluded.push_back(w);
      break;
    }
    default:
      if (c.three) c.backups = c.primary == 1 ? std::vector<uint32_t>{0, 2} : std::vector<uint32_t>{1, 2};
      break;
  }
  // The scheduler lists each copy it gives a server (a new process at a
  // server's index holds none).
  for (uint32_t s : Holders(c)) {
    if (!held.contains(s) || (s == 2 && c.generation[2] != generation2)) c.listed_at[s] = c.epoch;
  }
  if ((b & 0x40) && c.primary != kThisServer) {
    ++c.epoch;
    c.listed_at[kThisServer] = c.epoch;
  }
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// n finite values in [-8, 8): the first 64 from the input, the rest
// mixed from those (partitions large enough for a codec hold 1024 or more).
std::vector<float> Values(FuzzInput& in, size_t n) {
  const std::string bytes = in.Bytes(std::min<size_t>(n, 64));
  std::vector<float> v(n, 0.0f);
  for (size_t i = 0; i < n && !bytes.empty(); ++i) {
    const uint8_t b = static_cast<uint8_t>(bytes[i % bytes.size()]) ^ (i < bytes.size() ? 0 : i * 37);
    v[i] = static_cast<int8_t>(b) / 16.0f;
  }
  return v;
}

// `values` as a worker sends them for `round`: in the round's push codec.
std::string Encoded(const Cluster& c, const std::vector<float>& values, uint64_t round, std::string* spec) {
  const compression::WireCodec wire =
      compression::RoundCodec(c.config, c.codecs, compression::Direction::kPush, round);
  *spec = wire.spec;
  if (wire.raw()) return FloatBytes(values);
  std::string out(wire.codec->EncodedBytes(values.size()), '\0');
  auto bytes = wire.codec->Encode(values, compression::CodecSeed(kPartition, round),
                                  absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  out.resize(bytes.ok() ? *bytes : 0);
  return out;
}

// A snapshot as SendSnapshot lays it out (partition_replication.cc), its
// values finite: weights, optimizer state (non-negative, as Adam's), mirror,
// aggregate, per-worker request ids, pushes, their digests and rejoins, INIT flag, error
// feedback, the last round's encoded answer, the open rounds' pushes (from
// `round`).
std::string Snapshot(FuzzInput& in, const Cluster& c, uint64_t round) {
  const bool sum_only = c.config.update_mode() == SUM_ONLY;
  const bool feedback = sum_only && c.codecs.pull != nullptr;
  const size_t floats = c.n * (1 + c.state_slots + (compression::PullsWeightDeltas(c.config, c.codecs) ? 1 : 0) +
                               (sum_only ? 1 : 0));
  std::vector<float> v = Values(in, floats);
  for (float& x : v) x = std::fabs(x);
  std::string s = FloatBytes(v);
  std::vector<uint64_t> ids(4 * c.workers + 1);
  for (uint64_t& id : ids) id = in.Byte() % 4;
  s += std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
  if (feedback) {
    const uint64_t calls = in.Byte() % 4;
    s += std::string(reinterpret_cast<const char*>(&calls), sizeof(calls)) + FloatBytes(Values(in, c.n));
  }
  if (RoundBased(c.config) && c.codecs.pull != nullptr) {
    const std::string answer = in.Field();
    const uint64_t length = answer.size();
    s += std::string(reinterpret_cast<const char*>(&length), sizeof(length)) + answer;
  }
  auto put = [&s](uint64_t value) { s += std::string(reinterpret_cast<const char*>(&value), sizeof(value)); };
  const uint8_t pushes = in.Byte();
  put(pushes % 4);
  for (int i = 0; i < pushes % 4; ++i) {
    const uint8_t bits = in.Byte();
    DataHeader f;
    f.set_replica_of(bits & 1 ? PUSH : PUSH_PULL);
    f.set_round(round + in.Byte() % 6 - (bits & 2 ? 1 : 0));
    f.set_worker_rank(in.Byte() % (c.workers + 1));
    f.set_replica_request_id(in.Byte() % 8);
    std::string spec;
    std::string payload = Encoded(c, Values(in, c.n), f.round(), &spec);
    f.set_codec(bits & 4 ? in.Field() : spec);
    if (bits & 8) payload.resize(in.Byte());
    const std::string header = f.SerializeAsString();
    put(bits & 0x10 ? in.Int(2) : header.size());
    s += header;
    put(bits & 0x20 ? in.Int(4) : payload.size());
    s += payload;
  }
  if (pushes & 0x80) s += in.Field();  // bytes after the pushes
  return s;
}

// Values read back from the engine for the invariants.
struct Copy {
  bool held = false;
  std::vector<float> weights;
  uint64_t version = 0;
  bool primary = false;
  uint64_t forwarded = 0;
};

Copy Read(const PartitionEngine& engine, uint64_t n) {
  Copy copy;
  const float* w = engine.weights(kPartition);
  if (w == nullptr) return copy;
  copy.held = true;
  copy.weights.assign(w, w + n);
  const std::vector<PartitionReport> reports = engine.Reports(1);
  if (!reports.empty()) {
    copy.version = reports[0].version;
    copy.primary = reports[0].primary;
  }
  copy.forwarded = engine.Queues().forwarded;
  return copy;
}

// A REPLICATE request from the input: its sender, epoch, kind, round and
// the fields of each kind, mostly as a primary sends them.
DataHeader ReplicaHeader(FuzzInput& in, Cluster& c, uint64_t completed, std::string* payload) {
  DataHeader h;
  const uint8_t bits = in.Byte();
  const uint8_t sender = in.Byte();
  h.set_op(REPLICATE);
  h.set_protocol_version(kProtocolVersion);
  h.set_partition_id(bits & 1 ? in.Int(1) : kPartition);
  h.set_epoch(bits & 2 ? c.epoch + in.Byte() % 7 - 3 : c.epoch);
  h.set_num_elements(c.n);
  h.set_dtype(FLOAT32);
  h.set_request_id(bits & 4 ? in.Int(2) : ++c.replica_id);
  switch (sender % 8) {
    case 0: break;  // an older primary: no replica_from
    case 1: h.set_replica_from(2); break;
    case 2: h.set_replica_from(sender); break;  // a bogus index
    default: h.set_replica_from(c.primary); break;
  }
  constexpr Op kKinds[] = {PUSH, PUSH, PUSH_PULL, PUSH_PULL, INIT, SNAPSHOT, SNAPSHOT_PROBE, OP_UNSPECIFIED};
  Op kind = kKinds[(bits >> 3) & 7];
  if (kind == OP_UNSPECIFIED) kind = static_cast<Op>(in.Byte() % 9);
  h.set_replica_of(kind);
  const uint8_t ahead = in.Byte() % 5;  // 4: the round before this copy's
  h.set_round(bits & 0x40 ? in.Int(8) : ahead == 4 ? completed - 1 : completed + ahead);
  h.set_worker_rank(in.Byte() % (c.workers + 1));
  h.set_replica_request_id(in.Byte() % 8);
  h.set_contributors(in.Byte() % (c.workers + 2));
  const uint8_t lists = in.Byte();
  for (int i = 0; i < lists % 4; ++i) h.add_summed_workers(in.Byte() % (c.workers + 1));
  for (int i = 0; i < (lists >> 2) % 4; ++i) {
    h.add_batch_workers(in.Byte() % (c.workers + 1));
    h.add_batch_request_ids(in.Byte() % 8);
  }
  if (lists & 0x10 && h.batch_request_ids_size() > 0) h.add_batch_request_ids(1);  // lists of unequal length
  constexpr float kScales[] = {0.0f, 1.0f, 0.5f, 0.25f};
  h.set_lr_scale(kScales[(lists >> 5) & 3]);
  if (lists & 0x80) {
    float scale;
    const uint32_t raw = static_cast<uint32_t>(in.Int(4));
    std::memcpy(&scale, &raw, sizeof(scale));
    h.set_lr_scale(scale);
    if (!(scale <= 1.0f) || std::isnan(scale)) c.clean = false;
  }
  if (bits & 0x80) h.set_based_on(in.Byte() % 8);
  // A round or forwarded push with no gradient, a snapshot after one, from
  // bytes already read (the corpus and regressions keep their meaning).
  if (h.replica_request_id() == 7) {
    h.set_no_gradient(true);
    h.set_skipped_rounds(h.contributors() % 2 == 0 ? h.round() / 2 : h.round() + 1);
  }
  // Adam's bias correction divides by zero at step 2^64 - 1: a snapshot
  // that far (no primary gets there) may make the weights infinite.
  if (kind == SNAPSHOT && h.round() > (uint64_t{1} << 32)) c.clean = false;
  std::string spec;
  const uint8_t mode = in.Byte();
  switch (mode % 8) {
    case 0: case 1: *payload = FloatBytes(Values(in, c.n)); break;
    case 2: case 3: *payload = Encoded(c, Values(in, c.n), h.round(), &spec); break;
    case 4: *payload = Snapshot(in, c, h.round()); break;
    case 5:
      if (mode & 0x20) {  // the right size, off by one float
        *payload = FloatBytes(Values(in, c.n + 1));
        if (mode & 0x40) payload->resize(payload->size() - 2 * sizeof(float));
      } else {
        *payload = in.Field();
        c.clean = false;
      }
      break;
    case 6: payload->clear(); break;
    default: {
      std::vector<float> v = Values(in, c.n);
      v[in.Byte() % c.n] = mode & 8 ? NAN : INFINITY;
      *payload = FloatBytes(v);
      c.clean = false;
    }
  }
  h.set_codec(mode & 0x10 ? in.Field() : spec);
  return h;
}

// A worker's request (answered once this copy is promoted; refused before).
DataHeader WorkerHeader(FuzzInput& in, Cluster& c, uint64_t completed, std::string* payload) {
  DataHeader h;
  const uint8_t bits = in.Byte();
  constexpr Op kOps[] = {PUSH, PUSH_PULL, PUSH_PULL, PULL, INIT, PUSH, PULL, OP_UNSPECIFIED};
  h.set_op(kOps[bits & 7]);
  h.set_protocol_version(kProtocolVersion);
  h.set_worker_rank(in.Byte() % (c.workers + 1));
  h.set_request_id(in.Int(1));
  h.set_round(completed + in.Byte() % 4);
  h.set_partition_id(kPartition);
  h.set_epoch(bits & 8 ? c.epoch - 1 : c.epoch);
  h.set_num_elements(c.n);
  h.set_dtype(FLOAT32);
  h.set_worker_incarnation(bits & 0x10 ? 1 : 0);
  if (bits & 0x20) h.set_based_on(completed);
  std::string spec;
  if (h.op() == INIT || bits & 0x40) {
    *payload = FloatBytes(Values(in, c.n));
  } else {
    *payload = Encoded(c, Values(in, c.n), h.round(), &spec);
  }
  h.set_codec(spec);
  if (bits & 0x80) {
    *payload = in.Field();
    c.clean = false;
  }
  return h;
}

void CheckFinite(const Cluster& c, const Copy& copy) {
  if (!c.clean || !copy.held) return;
  for (float x : copy.weights) Require(std::isfinite(x), "weights not finite after finite updates");
}

// Confirms (or refuses, by kind bit 4) up to four of the updates this copy
// sent as a primary, as the backup (kind bit 5: server 2, else 0) would.
void Confirm(FuzzInput& in, Cluster& c, PartitionEngine& engine, uint8_t kind) {
  for (int k = in.Byte() % 4; k >= 0 && !c.unconfirmed.empty(); --k) {
    DataHeader ack;
    ack.set_op(RESPONSE);
    ack.set_request_id(c.unconfirmed.front().request_id());
    ack.set_partition_id(c.unconfirmed.front().partition_id());
    if (kind & 0x10) ack.set_status_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    c.unconfirmed.pop_front();
    engine.HandleReplicaAck(kind & 0x20 ? 2 : 0, ack);
  }
}

// A confirmed replica update was applied, whole, or was one applied before.
void CheckConfirmed(const Cluster& c, const DataHeader& h, const Copy& before, const Copy& after) {
  if (h.replica_of() == SNAPSHOT) {
    Require(after.version == h.round(), "a confirmed snapshot was not applied");
  } else if (h.replica_of() == PUSH && RoundBased(c.config)) {
    Require(after.version == before.version + (h.round() == before.version ? 1 : 0),
            "a confirmed round was not applied, or applied out of order");
  } else if (h.replica_of() == PUSH) {
    Require(after.version == before.version ||
                (h.round() == before.version && after.version == before.version + h.batch_workers_size()),
            "a confirmed async batch moved the update count by other than its pushes");
  } else {
    Require(after.version == before.version, "a confirmed INIT or forwarded push moved the update count");
  }
}

// Sends a replica update (kinds 0-10) or a worker's request (11-13), its
// payload in `bytes` (which outlives the engine: it may hold the frame), and
// checks that a refused replica update changed nothing.
void Send(FuzzInput& in, Cluster& c, PartitionEngine& engine, uint8_t kind, const Copy& before, std::string& bytes) {
  const bool replica = kind % 16 < 11;
  const DataHeader h =
      replica ? ReplicaHeader(in, c, before.version, &bytes) : WorkerHeader(in, c, before.version, &bytes);
  zmq::message_t peer(replica ? "server" + std::to_string(h.replica_from()) : "w" + std::to_string(h.worker_rank()));
  zmq::message_t payload(bytes.data(), bytes.size(), nullptr, nullptr);
  const bool with_payload = !(replica && bytes.empty() && (kind & 0x20));
  engine.Handle(peer, h, with_payload ? &payload : nullptr);
  const Copy after = Read(engine, c.n);
  if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) {  // what an input does, to read a finding
    std::fprintf(stderr, "fuzz: %s (%zu bytes) -> %s; version %lu -> %lu, forwarded %lu\n",
                 h.ShortDebugString().c_str(), bytes.size(),
                 c.server_answers.empty() ? "-" : c.server_answers[0].ShortDebugString().c_str(),
                 static_cast<unsigned long>(before.version), static_cast<unsigned long>(after.version),
                 static_cast<unsigned long>(after.forwarded));
  }
  if (!replica || c.server_answers.size() != 1 || !before.held) return;
  if (c.server_answers[0].status_code() != 0) {
    Require(after.held && after.version == before.version, "a refused replica update changed the update count");
    Require(std::memcmp(after.weights.data(), before.weights.data(), c.n * sizeof(float)) == 0,
            "a refused replica update changed the weights");
  } else {
    CheckConfirmed(c, h, before, after);
  }
}

// Pair mode: a real primary and backup (servers 0 and 1) whose replica
// updates and confirmations travel in one queue, in order; workers push to
// the server the map names primary. A map may kill the primary (the backup
// takes over alone; what the dead one sent may still arrive, or be lost),
// kill the backup, bring the dead server back as a new process (a backup
// re-created from a snapshot), hand the primary role off to the backup
// (the roles switch once the primary reports the hand-off done), remove a
// worker, or let a removed one rejoin (a new process, from a later round);
// a map may change the roles and the membership together (NewMap).
// Workers push their rounds in order, a refused push again before a new
// one, and re-send what was not answered to each new primary, as a worker
// does.
// Checked: whenever nothing is in flight and both live, the two copies are
// bitwise equal; a push answered OK has its round on the backup, and the
// weights an answer carries no round the backup lacks; a removed worker's
// pushes are refused; no push is refused for owing a round its worker was
// answered for (round based, no copy promoted before its snapshot arrived).
class Pair {
 public:
  explicit Pair(Cluster& c) : c_(c) {}

  bool Start(uint32_t s) {
    live_[s] = false;
    auto engine = PartitionEngine::Create(
        c_.config,
        [this, s](const zmq::message_t& peer, DataHeader& h, zmq::message_t* p) {
          CheckAnswer(h, p);
          const std::string to = peer.to_string();
          if (to.rfind("server", 0) == 0) {  // "server<index>.<generation>": to the process that asked
            Post(Wire{s, static_cast<uint32_t>(to[6] - '0'), static_cast<uint32_t>(std::strtoul(&to[8], nullptr, 10)),
                      h, "", true});
          }
          if (to[0] == 'w') {  // "w<rank>.<incarnation>"
            OnWorkerAnswer(s, static_cast<uint32_t>(to[1] - '0'), std::strtoull(&to[3], nullptr, 10), h);
          }
        },
        [this, s](uint32_t to, DataHeader& h, zmq::message_t& payload) {
          Require(h.op() == REPLICATE, "a replica update is not a REPLICATE");
          Post(Wire{s, to, 0, h, payload.to_string(), false});
        });
    if (!engine.ok()) return false;
    engines_[s] = *std::move(engine);
    if (c_.epoch > 3) engines_[s]->JoinRunningJob();
    live_[s] = engines_[s]->InstallShardMap(Map(c_), s).ok();
    return live_[s];
  }

  void Step(FuzzInput& in) {
    if (c_.handoff_epoch != 0 && live_[c_.primary] && !engines_[c_.primary]->HandoffsDone().empty()) SwitchRoles();
    const uint8_t kind = in.Byte();
    if (kind % 8 == 7) {
      NewMap(in.Byte());
    } else if (kind % 8 >= 4) {
      for (int k = in.Byte() % 8; k >= 0 && !wire_.empty(); --k) DeliverOne();
    } else {
      if (kind & 0x80) Batch();
      Push(in, kind);
    }
    CheckEqual();
  }

 private:
  struct Wire {
    uint32_t from, to;
    uint32_t to_generation;  // the receiving process: one that died loses what was sent to it
    DataHeader header;
    std::string payload;
    bool ack;
    uint32_t from_generation = 0;  // the sending process
  };

  // A worker's push as it sent it (a re-send carries the same bytes).
  struct SentPush {
    uint64_t round = 0;
    std::string codec, bytes;
    bool answered = false;  // OK
    bool refused = false;   // its last answer was an error: sent again before a new push
    bool again = false;     // sent again after a refusal, not answered OK yet (it may be deferred)
  };

  void Post(Wire m) {
    if (m.to > 1) return;
    if (!m.ack) m.to_generation = c_.generation[m.to];  // a confirmation goes to the process that asked
    m.from_generation = c_.generation[m.from];
    wire_.push_back(std::move(m));
  }

  // What a server sent before it died still arrives (a replaced primary's
  // late update) unless the map that declared it dead dropped it; what was
  // sent to a process that died is lost with it.
  void DeliverOne() {
    Wire m = std::move(wire_.front());
    wire_.pop_front();
    if (!live_[m.to] || m.to_generation != c_.generation[m.to]) return;
    if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) {
      std::fprintf(stderr, "fuzz: %u -> %u: %s (%zu bytes)\n", m.from, m.to, m.header.ShortDebugString().c_str(),
                   m.payload.size());
    }
    if (m.ack) {
      engines_[m.to]->HandleReplicaAck(m.from, m.header);
      return;
    }
    // A new process at m.from's index has other sockets: it never gets this
    // request's confirmation.
    zmq::message_t peer("server" + std::to_string(m.from) + "." + std::to_string(m.from_generation));
    zmq::message_t payload(m.payload.data(), m.payload.size());
    engines_[m.to]->Handle(peer, m.header, &payload);
  }

  // Opens a batch on the primary (async: the pushes until it closes apply
  // as one update), or closes the open one.
  void Batch() {
    if (!live_[c_.primary]) return;
    batching_ = !batching_;
    if (batching_) {
      engines_[c_.primary]->BeginBatch();
    } else {
      engines_[c_.primary]->EndBatch();
    }
  }

  // An answer to incarnation `incarnation` of worker w (a process that
  // rejoined since gets none).
  void OnWorkerAnswer(uint32_t s, uint32_t w, uint64_t incarnation, const DataHeader& h) {
    if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) {
      std::fprintf(stderr, "fuzz: %u -> worker %u: %s\n", s, w, h.ShortDebugString().c_str());
    }
    if (h.request_id() == kInitId || w >= c_.workers) return;
    NoteRemoval(w, incarnation, h);
    if (incarnation != incarnation_[w]) return;
    if (h.request_id() == 0 || h.request_id() > sent_[w].size()) return;
    Require(static_cast<int>(w) != sending_removed_ || h.status_code() != 0,
            "a removed worker's push was answered OK");
    SentPush& push = sent_[w][h.request_id() - 1];  // a push's id is its round + 1
    if (h.status_code() == 0) {
      push.answered = true;
      push.refused = push.again = false;
      CheckDurable(s, push.round);
      CheckVisible(s, h);
      CheckContributors(h);
      return;
    }
    if (!push.answered) push.refused = true;
    // Owing a round the worker was answered OK for: that push was lost.
    const size_t at = h.error().find("owes round ");
    if (!RoundBased(c_.config) || unchecked_ || at == std::string::npos) return;
    const uint64_t owed = std::strtoull(h.error().c_str() + at + 11, nullptr, 10);
    const uint64_t i = owed - first_round_[w];
    Require(owed < first_round_[w] || i >= sent_[w].size() || !sent_[w][i].answered,
            "a worker's push was refused for owing a round it was answered for");
  }

  // Worker w's request `id` to the primary: a push, or INIT (`push` holds
  // its weights).
  void Send(uint32_t w, uint64_t id, const SentPush& push, Op op = PUSH_PULL) {
    DataHeader h;
    h.set_op(op);
    h.set_protocol_version(kProtocolVersion);
    h.set_worker_rank(w);
    h.set_partition_id(kPartition);
    h.set_epoch(c_.epoch);
    h.set_num_elements(c_.n);
    h.set_dtype(FLOAT32);
    h.set_request_id(id);
    h.set_round(push.round);
    if (op == PUSH_PULL && RoundBased(c_.config)) h.set_based_on(push.round);
    h.set_codec(push.codec);
    if (incarnation_[w] != 0) h.set_worker_incarnation(incarnation_[w]);
    if (op == PUSH_PULL) pushed_.insert({w, incarnation_[w], push.round});
    zmq::message_t peer("w" + std::to_string(w) + "." + std::to_string(incarnation_[w]));
    zmq::message_t payload(push.bytes.data(), push.bytes.size());
    if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) {
      std::fprintf(stderr, "fuzz: worker %u -> %u: %s\n", w, c_.primary, h.ShortDebugString().c_str());
    }
    // A removed worker (its rank excluded in the primary's map) is refused.
    sending_removed_ = Removed(w) ? static_cast<int>(w) : -1;
    if (live_[c_.primary]) engines_[c_.primary]->Handle(peer, h, &payload);
    sending_removed_ = -1;
  }

  bool Removed(uint32_t w) const { return std::find(c_.excluded.begin(), c_.excluded.end(), w) != c_.excluded.end(); }

  // Worker w (w < 0: none) is removed from the job, unless it is already,
  // or it is the last worker left (the job would end).
  void Remove(int w) {
    if (w < 0 || Removed(w) || c_.excluded.size() + 1 >= c_.workers) return;
    c_.excluded.push_back(w);
  }

  // Worker `kind / 8 % workers` sends INIT, or its earliest refused push
  // again (until it is answered OK), or a retry of its last push (same
  // request id), or its next round's push, to the primary.
  void Push(FuzzInput& in, uint8_t kind) {
    const uint32_t w = (kind >> 3 & 0x0f) % c_.workers;
    if (kind & 2 && !initialized_) {
      initialized_ = true;
      SentPush init;
      init.bytes = FloatBytes(Values(in, c_.n));
      Send(w, kInitId, init, INIT);
      return;
    }
    std::vector<SentPush>& list = sent_[w];
    auto refused = std::find_if(list.begin(), list.end(), [](const SentPush& p) { return p.refused || p.again; });
    size_t i = refused - list.begin();
    if (refused == list.end()) {
      if (kind & 1 && !list.empty()) {
        i = list.size() - 1;
      } else {
        SentPush push;
        push.round = first_round_[w] + list.size();
        push.bytes = Encoded(c_, Values(in, c_.n), push.round, &push.codec);
        list.push_back(std::move(push));
      }
    }
    list[i].again = list[i].again || list[i].refused;
    list[i].refused = false;
    Send(w, i + 1, list[i]);
  }

  // A new primary: each worker sends what was not answered, in order, up
  // to the first refused.
  void Resend() {
    for (uint32_t w = 0; w < c_.workers; ++w) {
      for (size_t i = 0; i < sent_[w].size(); ++i) {
        if (sent_[w][i].answered) continue;
        sent_[w][i].refused = false;
        Send(w, i + 1, sent_[w][i]);
        if (sent_[w][i].refused) break;
      }
    }
  }

  // Worker w, removed, rejoins at a round past every live copy's (by
  // `later` more): a new process, its requests numbered afresh.
  void Rejoin(uint32_t w, uint64_t later) {
    uint64_t round = 0;
    for (uint32_t s : {0u, 1u}) {
      const std::vector<PartitionReport> reports = live_[s] ? engines_[s]->Reports(1) : std::vector<PartitionReport>{};
      if (!reports.empty()) round = std::max(round, reports[0].version);
    }
    std::erase_if(c_.rejoins, [w](const WorkerRejoin& r) { return r.rank() == w; });
    WorkerRejoin& r = c_.rejoins.emplace_back();
    r.set_rank(w);
    r.set_round(round + later);
    r.set_incarnation(++incarnations_);
    r.set_epoch(c_.epoch);
    std::erase(c_.excluded, w);
    sent_[w].clear();
    first_round_[w] = r.round();
    first_round_of_[r.incarnation()] = r.round();
    incarnation_[w] = r.incarnation();
  }

  // An error answer to process `incarnation` of worker w that says its push
  // was removed with it (parked for a later round when the map removed the
  // worker): no copy may count that push.
  void NoteRemoval(uint32_t w, uint64_t incarnation, const DataHeader& h) {
    if (h.status_code() == 0 || h.error().find("this worker was removed from the job") == std::string::npos) return;
    const auto first = first_round_of_.find(incarnation);
    if (first == first_round_of_.end() || h.request_id() == 0) return;
    removed_pushes_.insert({w, incarnation, first->second + h.request_id() - 1});
  }

  // Sum only, round based: the contributors answer `h` names for its last
  // round are at most the workers that pushed that round, counting no push
  // that was removed with its worker.
  void CheckContributors(const DataHeader& h) const {
    if (c_.config.update_mode() != SUM_ONLY || !RoundBased(c_.config) || h.completed_rounds() == 0) return;
    const uint64_t round = h.completed_rounds() - 1;
    std::set<uint32_t> ranks;
    for (const auto& push : pushed_) {
      if (std::get<2>(push) == round && !removed_pushes_.contains(push)) ranks.insert(std::get<0>(push));
    }
    Require(h.contributors() <= ranks.size(), "a round counted a push that was removed with its worker");
  }

  bool Synced(uint32_t s) const {
    const std::vector<uint64_t> synced = engines_[s]->SyncedCopies();
    return std::find(synced.begin(), synced.end(), kPartition) != synced.end();
  }

  // Server `s` holds a synced copy of the one the map lists: not the copy
  // it held before a map it has not installed yet gave the copy back.
  bool HoldsValidCopy(uint32_t s) const {
    auto listed = c_.listed_at.find(s);
    return Synced(s) && (listed == c_.listed_at.end() || engines_[s]->epoch() >= listed->second);
  }

  void Install() {
    for (uint32_t s : {0u, 1u}) {
      if (live_[s] && static_cast<int>(s) != skipping_) (void)engines_[s]->InstallShardMap(Map(c_), s);
    }
  }

  // The primary reported its hand-off done: the next map switches the roles.
  void SwitchRoles() {
    if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) std::fprintf(stderr, "fuzz: hand-off done: roles switch\n");
    ++c_.epoch;
    std::swap(c_.primary, c_.backups[0]);
    c_.handoff_epoch = 0;
    // The same map may change the membership (ListHandoff).
    if (switch_rejoin_ && !c_.excluded.empty()) Rejoin(c_.excluded.front(), 0);
    Remove(switch_removal_);
    switch_rejoin_ = false;
    switch_removal_ = -1;
    Install();
    Resend();
  }

  // Lists a hand-off of the primary role to the backup, if it holds a
  // synced copy; the map that switches the roles lets the first removed
  // worker rejoin (`rejoin`) and removes worker `removal` (-1: none).
  // Returns whether it did.
  bool ListHandoff(bool rejoin, int removal) {
    const uint32_t other = 1 - c_.primary;
    if (c_.backups.empty() || !live_[other] || c_.handoff_epoch != 0 || !Synced(other)) return false;
    c_.handoff_epoch = c_.epoch;
    switch_rejoin_ = rejoin;
    switch_removal_ = removal;
    return true;
  }

  // The roles map byte `b` chooses (bits 0-1; bit 2: what a dead primary
  // sent is lost with it). Returns whether they could change so (then
  // `restarted` names a server started afresh, `promoted` says the backup
  // took over).
  bool ChangeRoles(uint8_t b, int* restarted, bool* promoted) {
    const uint32_t other = 1 - c_.primary;
    switch (b % 4) {
      case 0:
        if (!(b & 0x04)) return true;  // the same roles (a hand-off under way stays listed)
        if (c_.backups.empty() || !live_[other]) return false;
        if ((b & 0xc0) == 0x40) {
          // Both servers skipped the maps that dropped the backup's copy and
          // gave it back: the backup makes it anew, and the primary, seeing
          // the later listing, sends it the whole state.
          ++c_.epoch;
          c_.listed_at[other] = c_.epoch;
          c_.handoff_epoch = 0;
          return true;
        }
        // The backup's copy is dropped in maps the backup skips (it stays
        // up, its copy falling behind) until one gives the copy back.
        c_.backups.clear();
        c_.handoff_epoch = 0;
        skipping_ = static_cast<int>(other);
        return true;
      case 1:  // the primary dies: the backup takes over alone
        if (c_.backups.empty() || !live_[other]) return false;
        unchecked_ = unchecked_ || !Synced(other);
        live_[c_.primary] = false;
        if (b & 0x04) {  // what it sent is lost with it
          const uint32_t dead = c_.primary;
          std::erase_if(wire_, [dead](const Wire& m) { return m.from == dead; });
        }
        c_.primary = other;
        c_.backups.clear();
        c_.handoff_epoch = 0;
        *promoted = true;
        return true;
      case 2:  // the backup dies
        live_[other] = false;
        skipping_ = -1;
        c_.backups.clear();
        c_.handoff_epoch = 0;
        return true;
      default:  // the dead server comes back as a new process, a backup
        if (!c_.backups.empty()) return false;
        c_.backups = {other};
        c_.listed_at[other] = c_.epoch;
        if (skipping_ == static_cast<int>(other)) {
          // Given back to the server that skipped the maps in between: its
          // copy lacks their updates, so it must make the copy anew.
          skipping_ = -1;
          return true;
        }
        ++c_.generation[other];
        *restarted = static_cast<int>(other);
        return true;
    }
  }

  // Map byte `b`: the roles (ChangeRoles), with bit 7 a worker removed
  // (bits 4-6: which, or none). Bits 2-3 both set: the first removed worker
  // rejoins instead (bit 4: a round later; with none removed and bit 7, a
  // live worker, bits 4-6, is removed and rejoins in this one map), and
  // without bit 7, bit 5 the roles change in the same map, bit 6 a hand-off
  // is listed in it. Bit 3
  // alone: a hand-off is listed instead, and with bit 6 (not 7) bits 0-1
  // say what the map that switches the roles changes too (bit 0: the first
  // removed worker rejoins; bit 1: worker bits 4-5 is removed). (Bits that
  // older inputs set at random stay without effect where they can.)
  void NewMap(uint8_t b) {
    if (std::getenv("SHARDPS_FUZZ_TRACE") != nullptr) std::fprintf(stderr, "fuzz: map byte %#x\n", b);
    ++c_.epoch;
    int restarted = -1;
    bool promoted = false;
    bool removed_here = false;  // a worker removed and rejoined in this one map
    if ((b & 0x0c) == 0x0c) {  // the removed worker rejoins as a new process
      if (c_.excluded.empty()) {
        // With bit 7, a live worker dies and its new process rejoins in this
        // map: the servers skipped the one that removed it.
        if (!(b & 0x80)) return;
        Remove(static_cast<int>(((b >> 4) & 7) % c_.workers));
        if (c_.excluded.empty()) return;
        removed_here = true;
      }
      Rejoin(c_.excluded.front(), (b >> 4) & 1);
      if ((b & 0xa0) == 0x20) (void)ChangeRoles(b, &restarted, &promoted);
      if ((b & 0xc0) == 0x40) (void)ListHandoff(false, -1);
    } else if ((b & 0x0c) == 0x08) {  // the primary role handed off to a synced backup
      const bool also = (b & 0xc0) == 0x40;
      if (!ListHandoff(also && (b & 1), also && (b & 2) ? (b >> 4) % 4 % c_.workers : -1)) return;
    } else if (!ChangeRoles(b, &restarted, &promoted)) {
      return;
    }
    if ((b & 0x80) && !removed_here) Remove((b >> 4) % (c_.workers + 1) - 1);
    Install();
    if (restarted >= 0) Start(restarted);
    if (promoted) Resend();
  }

  // Primary `s` answered OK a worker's push of `round`: a listed backup that
  // holds a valid copy has the rounds that answer may show (a round-based
  // push is answered once round + 1 - staleness is on every copy), so the
  // answer survives the primary's death.
  void CheckDurable(uint32_t s, uint64_t round) const {
    const uint32_t other = 1 - s;
    if (!RoundBased(c_.config) || !live_[other] || c_.backups.empty() || !HoldsValidCopy(other)) return;
    const uint64_t needed = round + 1 - std::min<uint64_t>(round + 1, c_.config.staleness());
    const std::vector<PartitionReport> reports = engines_[other]->Reports(1);
    Require(!reports.empty() && reports[0].version >= needed, "a push was answered before its round was on the backup");
  }

  // Primary `s` answered weights (`h`): every update they include is on a
  // listed backup that holds a valid copy (a pull never sees a round that
  // the primary's death could undo).
  void CheckVisible(uint32_t s, const DataHeader& h) const {
    const uint32_t other = 1 - s;
    if (!RoundBased(c_.config) || h.num_elements() == 0 || !live_[other] || c_.backups.empty()) return;
    if (!HoldsValidCopy(other)) return;
    const std::vector<PartitionReport> reports = engines_[other]->Reports(1);
    Require(!reports.empty() && reports[0].version >= h.completed_rounds(),
            "an answer showed a round that was not on the backup");
  }

  void CheckEqual() const {
    if (!wire_.empty() || !live_[0] || !live_[1] || c_.backups.empty()) return;
    const float* a = engines_[0]->weights(kPartition);
    const float* b = engines_[1]->weights(kPartition);
    if (a == nullptr || b == nullptr) return;
    Require(std::memcmp(a, b, c_.n * sizeof(float)) == 0, "the copies differ with nothing in flight");
  }

  static constexpr uint64_t kInitId = 1000;
  Cluster& c_;
  std::unique_ptr<PartitionEngine> engines_[2];
  bool live_[2] = {};
  std::deque<Wire> wire_;
  bool initialized_ = false;
  bool batching_ = false;
  // A copy was promoted before its snapshot arrived (no scheduler does
  // that): it does not know which rounds the workers pushed, so pushes may
  // be refused for owing a round they were answered for.
  bool unchecked_ = false;
  int sending_removed_ = -1;  // a removed worker whose push the primary is handling
  int skipping_ = -1;  // a live server whose copy was dropped: it installs no map until one gives the copy back
  // The map that switches the roles of a listed hand-off also: lets the
  // first removed worker rejoin; removes this worker (-1: none).
  bool switch_rejoin_ = false;
  int switch_removal_ = -1;
  uint64_t incarnations_ = 0;
  std::vector<SentPush> sent_[4];  // per worker, by round from its first
  uint64_t first_round_[4] = {};   // per worker: its join round (0 unless it rejoined)
  std::map<uint64_t, uint64_t> first_round_of_ = {{0, 0}};  // per registration (0: none), its join round
  // Pushes sent as (worker, registration, round), and those answered as
  // removed with their worker.
  std::set<std::tuple<uint32_t, uint64_t, uint64_t>> pushed_, removed_pushes_;
  uint64_t incarnation_[4] = {};   // per worker: its registration (0 unless it rejoined)
};

void RunPair(FuzzInput& in, Cluster& c) {
  c.three = false;
  c.backups = {1};
  Pair pair(c);
  if (!pair.Start(0) || !pair.Start(1)) return;
  for (int i = 0; i < 128 && !in.empty(); ++i) pair.Step(in);
}

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardps::fuzz::QuietProtobufLogs();
  using namespace shardps;
  using namespace shardps::fuzz;
  FuzzInput in(data, size);
  Cluster c;
  const uint8_t variant = in.Byte();
  const uint8_t variant2 = in.Byte();
  c.config = Config(variant, variant2);
  if (!ValidateConfig(c.config).ok()) return 0;
  const uint8_t size_bits = in.Byte();
  // Small partitions travel raw (a codec needs 256 or 1024 elements).
  c.n = size_bits & 0x40 ? 1024 + 8 * (size_bits & 0x3f) : 1 + (size_bits & 0x3f) % 48;
  c.workers = c.config.num_workers();
  c.three = c.config.num_servers() == 3;
  c.backups = c.three && (variant2 & 0x80) ? std::vector<uint32_t>{1, 2} : std::vector<uint32_t>{1};
  auto codecs = compression::CodecsForPartition(c.config, "t", c.n);
  if (!codecs.ok()) return 0;
  c.codecs = *std::move(codecs);
  auto optimizer = Optimizer::Create(c.config.optimizer());
  if (!optimizer.ok()) return 0;
  c.state_slots = (*optimizer)->state_slots();
  if (size_bits & 0x80) {  // pair mode
    RunPair(in, c);
    return 0;
  }

  auto engine = PartitionEngine::Create(
      c.config,
      [&c](const zmq::message_t& peer, DataHeader& h, zmq::message_t* p) {
        CheckAnswer(h, p);
        if (peer.to_string().rfind("server", 0) == 0) c.server_answers.push_back(h);
      },
      [&c](uint32_t, DataHeader& h, zmq::message_t&) {
        Require(h.op() == REPLICATE, "a replica update is not a REPLICATE");
        if (c.unconfirmed.size() < 256) c.unconfirmed.push_back(h);
      });
  if (!engine.ok()) return 0;
  if (variant2 & 8) (*engine)->JoinRunningJob();  // a re-created copy: nothing valid before its snapshot
  if (!(*engine)->InstallShardMap(Map(c), kThisServer).ok()) return 0;
  // With the staleness bound, the rounds a backup may hold forwarded pushes
  // for: its own, the primary's, and as far ahead as a push may go.
  const uint64_t max_forwarded = c.workers * (kMaxRoundsAhead + c.config.staleness() + 2);

  std::vector<std::unique_ptr<std::string>> buffers;  // frames the engine may hold until the end
  for (int i = 0; i < 64 && !in.empty(); ++i) {
    const uint8_t kind = in.Byte();
    const Copy before = Read(**engine, c.n);
    c.server_answers.clear();
    if (kind % 16 == 15) {
      NextMap(in, c);
      (void)(*engine)->InstallShardMap(Map(c), kThisServer);
    } else if (kind % 16 == 14) {
      Confirm(in, c, **engine, kind);
    } else {
      buffers.push_back(std::make_unique<std::string>());
      Send(in, c, **engine, kind, before, *buffers.back());
    }
    const Copy after = Read(**engine, c.n);
    CheckFinite(c, after);
    Require(after.forwarded <= max_forwarded, "a backup holds more forwarded pushes than the rounds allow");
  }
  (*engine)->FailWaiting(absl::UnavailableError("fuzz input ended"));
  return 0;
}
