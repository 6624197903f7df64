// The partitions one server owns and the rules that update them: validation
// of every request, round accumulation (sync), apply-on-arrival (async),
// pulls that wait for a round, idempotent retries.
//
// Transport-free: requests come in as (peer identity, header, payload) and
// answers leave through the ReplySink, so the engine is tested without
// sockets. Owned and driven by one thread (the server's engine thread); not
// thread-safe, and needs no lock on the hot path.
#ifndef SHARDPS_SERVER_PARTITION_ENGINE_H_
#define SHARDPS_SERVER_PARTITION_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/optimizer.h"
#include "common/shared_buffer.h"
#include "compression/codec_policy.h"
#include "compression/error_feedback.h"
#include "proto/cluster.pb.h"
#include "proto/data.pb.h"

namespace shardps {

struct EngineStats {
  uint64_t requests = 0;
  uint64_t errors = 0;
  uint64_t bytes_in = 0;   // payload bytes received
  uint64_t bytes_out = 0;  // payload bytes sent
  uint64_t updates = 0;    // optimizer steps applied
};

class PartitionEngine {
 public:
  // Sends one answer to `peer`. `payload` may be null (errors, acks).
  using ReplySink = std::function<void(const zmq::message_t& peer, DataHeader& header, zmq::message_t* payload)>;

  static absl::StatusOr<std::unique_ptr<PartitionEngine>> Create(const ClusterConfig& config, ReplySink sink);

  // Adopts shard map `map` for server `server_index`: creates the partitions
  // it now owns (zero weights) and keeps those it already had, and follows
  // its membership: requests of workers in `excluded_workers` are refused
  // from then on, and sync rounds complete with the workers that remain
  // (a round a removed worker was holding up completes at once, averaged
  // over the workers that contributed to it).
  // Fails if the config names a codec that cannot be created.
  absl::Status InstallShardMap(const ShardMap& map, uint32_t server_index);
  uint64_t epoch() const { return epoch_; }

  // Handles one request. `payload` is null when the message had no payload
  // frame. Every outcome, including bad input, is answered through the sink
  // or parked until it can be (a pull waiting for its round).
  void Handle(const zmq::message_t& peer, const DataHeader& header, zmq::message_t* payload);

  // Answers every parked request with `status` (shutdown).
  void FailWaiting(const absl::Status& status);

  const EngineStats& stats() const { return stats_; }
  // Current weights of a partition, for tests; null if not owned.
  const float* weights(uint64_t partition_id) const;

 private:
  struct Waiter {
    zmq::message_t peer;
    DataHeader header;
  };
  struct ParkedPush {
    zmq::message_t peer;
    DataHeader header;
    zmq::message_t payload;
  };
  struct Partition {
    uint64_t id = 0;
    size_t n = 0;
    compression::PartitionCodecs codecs;  // null codec: raw fp32
    SharedBufferPtr weights;
    // Sum only: the last completed round's gradient sum, and its encoding.
    SharedBufferPtr aggregate;
    // Cached encoded answer (compressed pull) and the round it encodes.
    SharedBufferPtr encoded;
    size_t encoded_bytes = 0;
    int64_t encoded_round = -1;
    std::vector<float> acc_encoded;            // sync, summable codecs: sum of payloads
    std::vector<std::vector<float>> decoded;   // deterministic + codec: per-rank gradients
    std::vector<float> scratch;                // async + codec: one decoded gradient
    // Compressed weight deltas (compression::PullsWeightDeltas): the weights
    // as the workers hold them, and the delta being encoded.
    bool delta_pulls = false;
    std::vector<float> mirror;
    std::vector<float> delta;
    std::vector<float> state;
    uint64_t completed = 0;  // sync: rounds applied; async: pushes applied
    bool initialized = false;
    std::vector<float> acc;                // sync: this round's sum
    uint32_t arrivals = 0;                 // sync: pushes in for this round
    std::vector<uint64_t> next_round;      // sync: per worker, next round it owes
    std::vector<uint64_t> incarnation;     // per worker: registration of its pushes
    uint32_t contributors = 0;             // sync: gradients in the last completed round
    std::vector<zmq::message_t> held;      // deterministic: per-rank gradients
    std::vector<uint64_t> last_request;    // async: per worker, last applied request id
    std::vector<Waiter> waiting;           // pulls waiting for `completed`
    std::vector<ParkedPush> ahead;         // pushes for a later round
  };

  PartitionEngine(const ClusterConfig& config, std::unique_ptr<Optimizer> optimizer, ReplySink sink);

  absl::Status Validate(const DataHeader& h, const zmq::message_t* payload, Partition** out);
  // Refuses a push from a restarted worker process (new registration) that
  // would restart the rounds the old process had reached.
  absl::Status CheckIncarnation(Partition& p, const DataHeader& h) const;
  void ApplyMembership(const ShardMap& map);
  // Sync: every worker still in the job has pushed the current round.
  bool RoundComplete(const Partition& p) const;
  // Whether worker `w` pushed the round being accumulated (rounds arrive in
  // order per worker, so a worker that owes a later round has).
  static bool Contributed(const Partition& p, uint32_t w) { return p.next_round[w] > p.completed; }
  void Init(Partition& p, const zmq::message_t& peer, const DataHeader& h, const zmq::message_t& payload);
  void PushSync(Partition& p, const zmq::message_t& peer, const DataHeader& h, zmq::message_t* payload);
  void PushAsync(Partition& p, const zmq::message_t& peer, const DataHeader& h, const zmq::message_t& payload);
  void PullOrWait(Partition& p, const zmq::message_t& peer, const DataHeader& h, uint64_t round);
  void CompleteRound(Partition& p);
  absl::Status Accumulate(Partition& p, uint32_t worker, uint64_t round, zmq::message_t* payload);
  void SumRound(Partition& p);
  // The answer payload for a pull: weights (raw or fp16/bf16) or, in sum-only
  // mode after a round, the aggregate (raw or compressed with error feedback).
  // Fails if the data cannot be encoded (e.g. non-finite weight deltas).
  absl::StatusOr<zmq::message_t> AnswerPayload(Partition& p, DataHeader* reply);
  float* WritableWeights(Partition& p);
  void Answer(const zmq::message_t& peer, const DataHeader& request, const absl::Status& status);
  void AnswerWeights(Partition& p, const zmq::message_t& peer, const DataHeader& request);

  const ClusterConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
  const bool sum_only_;
  // Server-side error feedback of compressed aggregates, per pull codec spec.
  absl::flat_hash_map<std::string, std::unique_ptr<compression::ErrorFeedback>> pull_feedback_;
  const ReplySink sink_;
  uint64_t epoch_ = 0;
  uint32_t server_index_ = 0;
  std::vector<bool> excluded_;  // per worker rank: removed from the job
  uint32_t num_excluded_ = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Partition>> partitions_;
  EngineStats stats_;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_PARTITION_ENGINE_H_
