// Fuzzes the data plane as a server sees it: header frames parsed exactly as
// the server's receive loop parses them (common/data_message.h), then handed
// with their payload to a real PartitionEngine, whose Validate is the gate
// for everything a worker sends. Requests may come as raw header bytes or as
// headers built from fuzzed fields (which reach the engine's rules sooner).
// Every answer must be a RESPONSE, every answer payload must hold what its
// header says, and nothing may crash, leak or read out of bounds.
//
// Input: [config][n] then up to 64 requests: [kind][...fields...]
#include <memory>
#include <string>
#include <vector>

#include "common/data_message.h"
#include "common/protocol.h"
#include "server/partition_engine.h"
#include "tests/fuzz/engine_answer.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

constexpr const char* kCodecs[] = {"none", "fp16", "bf16", "2bit:threads=1", "onebit:threads=1",
                                   "topk:ratio=0.25,threads=1", "randomk:ratio=0.5,threads=1", "none"};
constexpr uint64_t kPartition = 5;
constexpr uint64_t kEpoch = 3;

// The cluster variant this input runs on: bits choose consistency, update
// mode, codecs and replication (this server is partition 5's primary; its
// backup is server 1).
ClusterConfig Config(uint8_t bits) {
  ClusterConfig c;
  const bool sync = (bits & 1) == 0;
  c.set_consistency(sync ? SYNC : ASYNC);
  c.set_deterministic(sync && (bits & 2));
  c.set_update_mode(sync && (bits & 4) ? SUM_ONLY : UPDATE_ON_SERVER);
  c.set_num_workers(2);
  c.set_num_servers(bits & 0x80 ? 2 : 1);
  c.set_replication(bits & 0x80 ? 2 : 1);
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(0.5f);
  const char* codec = kCodecs[(bits >> 3) & 7];
  c.mutable_compression()->set_codec(codec);
  if (bits & 0x40) c.mutable_compression()->set_pull_codec(codec);
  return c;
}

ShardMap Map(uint64_t epoch, uint64_t n, bool replicated, int excluded) {
  ShardMap map;
  map.set_epoch(epoch);
  TensorSpec* t = map.add_tensors();
  t->set_name("t");
  t->add_shape(n);
  PartitionInfo* info = map.add_partitions();
  info->set_id(kPartition);
  info->set_tensor(0);
  info->set_num_elements(n);
  info->set_server(0);
  if (replicated) info->add_backups(1);
  if (excluded >= 0) map.add_excluded_workers(excluded);
  return map;
}

// A header frame built from fuzzed fields, mostly valid, so that the engine's
// rules past parsing are reached.
std::string BuiltHeader(FuzzInput& in, const ClusterConfig& config) {
  DataHeader h;
  const uint8_t bits = in.Byte();
  h.set_op(static_cast<Op>(1 + in.Byte() % 6));
  h.set_worker_rank(in.Byte() % 3);
  h.set_request_id(in.Int(1));
  h.set_round(in.Int(1) % 8);
  h.set_partition_id(bits & 1 ? in.Int(8) : kPartition);
  h.set_epoch(bits & 2 ? in.Int(1) : kEpoch);
  h.set_num_elements(bits & 4 ? in.Int(8) : in.Int(1));
  h.set_dtype(bits & 8 ? in.Byte() : static_cast<uint32_t>(FLOAT32));
  if (bits & 0x10) h.set_codec(config.compression().codec());
  if (bits & 0x20) h.set_codec(in.Field());
  if (bits & 0x40) h.set_replica_of(static_cast<Op>(in.Byte() % 8));
  if (bits & 0x80) h.set_worker_incarnation(in.Int(1));
  h.set_protocol_version(kProtocolVersion);
  // A push with no gradient (a frozen parameter's), from bits already read,
  // so the corpus and regressions keep their meaning.
  h.set_no_gradient(h.request_id() % 8 == 5);
  return h.SerializeAsString();
}

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardps::fuzz::QuietProtobufLogs();
  using namespace shardps;
  using namespace shardps::fuzz;
  FuzzInput in(data, size);
  const uint8_t variant = in.Byte();
  const ClusterConfig config = Config(variant);
  // Payload bytes that frames point into, as a receive buffer would; they
  // outlive the engine, which may hold frames (parked pushes) until the end.
  std::vector<std::unique_ptr<std::string>> buffers;
  const uint64_t n = 1 + in.Byte() % 64;
  auto engine = PartitionEngine::Create(
      config, [](const zmq::message_t&, DataHeader& h, zmq::message_t* p) { CheckAnswer(h, p); },
      [](uint32_t, DataHeader&, zmq::message_t&) {});
  if (!engine.ok()) return 0;
  const bool replicated = variant & 0x80;
  uint64_t epoch = kEpoch;
  if (!(*engine)->InstallShardMap(Map(epoch, n, replicated, -1), 0).ok()) return 0;

  DataHeader header;
  for (int i = 0; i < 64 && !in.empty(); ++i) {
    const uint8_t kind = in.Byte();
    if (kind % 16 == 15) {  // a new epoch: membership changes
      (void)(*engine)->InstallShardMap(Map(++epoch, n, replicated, in.Byte() % 3 - 1), 0);
      continue;
    }
    const std::string frame = kind & 1 ? BuiltHeader(in, config) : in.Field();
    header.Clear();
    if (!ParseDataHeaderInto(frame.data(), frame.size(), &header).ok()) continue;  // the server answers it
    if (kind % 16 == 14) {  // a backup's answer to a REPLICATE
      (*engine)->HandleReplicaAck(1, header);
      continue;
    }
    // kind & 4: the payload starts at an odd address, as ZeroMQ may hand a
    // frame over from anywhere in its receive buffer.
    const size_t skew = kind & 4 ? 1 : 0;
    buffers.push_back(std::make_unique<std::string>(std::string(skew, ' ') + in.Field()));
    const std::string& buffer = *buffers.back();
    zmq::message_t peer(std::string("w") + std::to_string(header.worker_rank() % 4));
    zmq::message_t payload(const_cast<char*>(buffer.data()) + skew, buffer.size() - skew, nullptr, nullptr);
    (*engine)->Handle(peer, header, kind & 2 ? &payload : nullptr);
  }
  (*engine)->FailWaiting(absl::UnavailableError("fuzz input ended"));
  return 0;
}
