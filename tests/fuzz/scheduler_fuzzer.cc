// Fuzzes the scheduler's request handlers: fuzzed protobuf requests go
// straight to the gRPC service implementation (scheduler/scheduler_service.h)
// over a real ClusterState, in any order, as any number of callers might send
// them. Blocking calls get no time to wait (max_wait 0), so each input runs
// at once. A shard map the scheduler hands out must cover every declared
// tensor exactly, and nothing may crash, leak or hang.
//
// Input: [config] then up to 32 calls: [method][u16 length][request bytes]
// (WatchShardMap, a server stream, is not called: it needs a live stream.)
#include <atomic>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "scheduler/cluster_state.h"
#include "scheduler/scheduler_service.h"
#include "tests/fuzz/fuzz_input.h"

namespace shardps::fuzz {
namespace {

ClusterConfig Config(uint8_t bits) {
  ClusterConfig c;
  c.set_consistency(bits & 1 ? ASYNC : SYNC);
  c.set_num_servers(1 + (bits >> 1) % 2);
  c.set_num_workers(1 + (bits >> 2) % 2);
  c.set_replication((bits & 8) && c.num_servers() == 2 ? 2 : 1);
  // The largest partitions allowed, so that a fuzzed model stays a few
  // thousand partitions (model size bounds are issue 12's section 4).
  c.set_partition_bytes(uint64_t{1} << 30);
  c.set_rendezvous_timeout_ms(1);
  c.set_heartbeat_interval_ms(1);
  c.set_heartbeat_timeout_ms(2);
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(0.1f);
  return c;
}

// Elements of `t`; false when the product does not fit in 64 bits.
bool CheckedElements(const TensorSpec& t, uint64_t* n) {
  *n = 1;
  for (int64_t d : t.shape()) {
    if (d <= 0 || __builtin_mul_overflow(*n, static_cast<uint64_t>(d), n)) return false;
  }
  return true;
}

// Every tensor of `map` is covered by its partitions exactly once, in order.
void CheckMap(const ShardMap& map) {
  std::vector<uint64_t> next(map.tensors_size(), 0);
  for (const PartitionInfo& p : map.partitions()) {
    Require(p.tensor() < next.size(), "a partition names a tensor the map does not have");
    Require(p.offset() == next[p.tensor()], "partitions of a tensor leave a gap or overlap");
    Require(p.num_elements() > 0, "a partition holds no element");
    next[p.tensor()] += p.num_elements();
  }
  for (int t = 0; t < map.tensors_size(); ++t) {
    uint64_t n = 0;
    Require(CheckedElements(map.tensors(t), &n), "a shard map holds a tensor whose size overflows 64 bits");
    Require(next[t] == n, "a tensor's partitions do not add up to its shape");
  }
}

// Calls `handler` with `bytes` parsed as its request (gRPC refuses what does
// not parse); the response when the call succeeds.
template <typename Request, typename Response>
std::optional<Response> Invoke(Scheduler::Service& service,
                               grpc::Status (Scheduler::Service::*handler)(grpc::ServerContext*, const Request*,
                                                                           Response*),
                               const std::string& bytes) {
  Request request;
  Response response;
  grpc::ServerContext ctx;
  if (!request.ParseFromString(bytes)) return std::nullopt;
  if (!(service.*handler)(&ctx, &request, &response).ok()) return std::nullopt;
  return response;
}

void Call(Scheduler::Service& service, uint8_t method, const std::string& bytes) {
  using S = Scheduler::Service;
  switch (method % 6) {
    case 0:
      (void)Invoke(service, &S::Register, bytes);
      break;
    case 1:
      (void)Invoke(service, &S::Heartbeat, bytes);
      break;
    case 2:
      if (auto map = Invoke(service, &S::DefineTensors, bytes)) CheckMap(*map);
      break;
    case 3:
      (void)Invoke(service, &S::Barrier, bytes);
      break;
    case 4:
      if (auto status = Invoke(service, &S::Status, bytes); status && status->has_shard_map()) {
        CheckMap(status->shard_map());
      }
      break;
    default:
      (void)Invoke(service, &S::RequestCheckpoint, bytes);
  }
}

}  // namespace
}  // namespace shardps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardps::fuzz::QuietProtobufLogs();
  using namespace shardps;
  using namespace shardps::fuzz;
  FuzzInput in(data, size);
  // A clock the input moves forward, so that liveness rules run too.
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  auto clock = [now] { return absl::UnixEpoch() + absl::Milliseconds(now->load()); };
  auto service = NewSchedulerService(std::make_unique<ClusterState>(Config(in.Byte()), clock), absl::ZeroDuration());
  for (int i = 0; i < 32 && !in.empty(); ++i) {
    const uint8_t method = in.Byte();
    if (method >= 0xf0) {
      now->fetch_add(method - 0xf0);
      continue;
    }
    Call(*service, method, in.Field());
  }
  return 0;
}
