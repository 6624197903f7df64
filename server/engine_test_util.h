// Test helpers for the partition engine: requests, payload encoding, and
// two engines, server 0 the primary and server 1 the backup of partition 5,
// with their replication delivered by the test.
#ifndef SHARDPS_SERVER_ENGINE_TEST_UTIL_H_
#define SHARDPS_SERVER_ENGINE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compression/codec_policy.h"
#include "server/partition_engine.h"

namespace shardps {

// `values` encoded with codec `spec` as a worker would for `round` of `partition`.
inline std::string EncodeForTest(const std::string& spec, const std::vector<float>& values, uint64_t partition,
                                 uint64_t round) {
  auto codec = compression::CreateCodec(spec);
  EXPECT_TRUE(codec.ok()) << codec.status();
  if (!codec.ok()) return "";
  std::string out((*codec)->EncodedBytes(values.size()), '\0');
  auto n = (*codec)->Encode(values, compression::CodecSeed(partition, round),
                            absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  EXPECT_TRUE(n.ok()) << n.status();
  out.resize(n.ok() ? *n : 0);
  return out;
}

// A request of worker `rank` for partition 5 of `n` elements, routed with
// `epoch`, its payload encoded with `codec` (empty: raw fp32).
inline DataHeader RequestHeader(Op op, uint32_t rank, uint64_t round, uint64_t epoch, uint64_t id, uint64_t n,
                                const std::string& codec = "") {
  DataHeader h;
  h.set_op(op);
  h.set_worker_rank(rank);
  h.set_round(round);
  h.set_epoch(epoch);
  h.set_partition_id(5);
  h.set_request_id(id);
  h.set_dtype(FLOAT32);
  h.set_num_elements(n);
  h.set_codec(codec);
  return h;
}

class ReplicaPairTest : public ::testing::Test {
 protected:
  struct Message {
    uint32_t from = 0, to = 0;
    DataHeader header;
    std::string payload;
  };

  // Two workers, two servers, two copies; SGD with learning rate 1 (sync: a
  // weight moves by the mean gradient) unless `tweak` changes the config.
  // Partition 5 holds `n` elements, initialised to 1 (left uninitialised,
  // on both copies, when `init` is false).
  void Make(Consistency consistency, const std::function<void(ClusterConfig&)>& tweak = nullptr, int n = 2,
            bool init = true) {
    n_ = n;
    ClusterConfig c;
    c.set_consistency(consistency);
    c.set_num_workers(2);
    c.set_num_servers(2);
    c.set_replication(2);
    c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    c.mutable_optimizer()->set_learning_rate(1.0f);
    if (tweak) tweak(c);
    config_ = c;
    for (uint32_t s : {0u, 1u}) Restart(s);
    Install(MapAt(3, 0, 1));
    if (init) Send(0, INIT, 0, 0, std::vector<float>(n, 1.0f));
    Deliver();
    answers_.clear();
    answer_payloads_.clear();
    replicated_.clear();
  }

  // A new engine for server `s`, with nothing in it (a process started in
  // a dead one's place); it holds partition 5 once it installs a map.
  void Restart(uint32_t s) {
    auto engine = PartitionEngine::Create(
        config_,
        [this, s](const zmq::message_t& peer, DataHeader& h, zmq::message_t* payload) {
          const std::string to = peer.to_string();
          if (to.rfind("server", 0) == 0) {  // a confirmation, back to the primary
            acks_.push_back(Message{s, static_cast<uint32_t>(std::stoul(to.substr(6))), h, ""});
          } else {
            answers_.push_back(h);
            answer_payloads_.push_back(payload != nullptr ? payload->to_string() : "");
            if (hold_in_flight_ && payload != nullptr) Hold(*payload);
          }
        },
        [this, s](uint32_t server, DataHeader& h, zmq::message_t& payload) {
          outbox_.push_back(Message{s, server, h, payload.to_string()});
          if (hold_in_flight_) Hold(payload);
        });
    ASSERT_TRUE(engine.ok()) << engine.status();
    engines_[s] = *std::move(engine);
  }

  // Epoch `epoch`: partition 5 with primary `primary` and, if any, backup
  // `backup`, handing off from the primary to the backup if `handoff`.
  ShardMap MapAt(uint64_t epoch, uint32_t primary, std::optional<uint32_t> backup, bool handoff = false) const {
    ShardMap map;
    map.set_epoch(epoch);
    map.add_tensors()->set_name("t");
    for (uint32_t s : {0u, 1u}) {
      ServerInfo* info = map.add_servers();
      info->set_index(s);
      info->set_data_address("tcp://s:" + std::to_string(s + 1));
    }
    PartitionInfo* p = map.add_partitions();
    p->set_id(5);
    p->set_num_elements(n_);
    p->set_server(primary);
    if (backup) p->add_backups(*backup);
    if (handoff) {
      Handoff* h = map.add_handoffs();
      h->set_partition(5);
      h->set_from(primary);
      h->set_to(*backup);
      h->set_epoch(epoch);
    }
    return map;
  }

  void Install(const ShardMap& map) {
    for (uint32_t s : {0u, 1u}) ASSERT_TRUE(engines_[s]->InstallShardMap(map, s).ok());
  }

  // A request of worker `rank` to server `server` with payload `bytes`
  // (encoded with `codec`, empty: raw fp32); returns its id.
  uint64_t SendBytes(uint32_t server, Op op, uint32_t rank, uint64_t round, const std::string& codec,
                     const std::string& bytes, uint64_t epoch = 3, uint64_t id = 0) {
    DataHeader h = RequestHeader(op, rank, round, epoch, id != 0 ? id : ++next_id_, n_, codec);
    if (auto it = incarnations_.find(rank); it != incarnations_.end()) h.set_worker_incarnation(it->second);
    zmq::message_t peer("w" + std::to_string(rank));
    zmq::message_t payload(bytes.data(), bytes.size());
    engines_[server]->Handle(peer, h, op == PULL ? nullptr : &payload);
    return h.request_id();
  }

  uint64_t Send(uint32_t server, Op op, uint32_t rank, uint64_t round, const std::vector<float>& values,
                uint64_t epoch = 3, uint64_t id = 0) {
    return SendBytes(server, op, rank, round, "",
                     std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)), epoch,
                     id);
  }

  // Delivers every replica update and confirmation until none is left,
  // recording the updates in `replicated_`.
  void Deliver() {
    while (!outbox_.empty() || !acks_.empty()) {
      if (!outbox_.empty()) {
        DeliverOneUpdate();
      } else {
        DeliverOneAck();
      }
    }
  }

  // Hands the first confirmation waiting to the primary. REQUIRES: one is waiting.
  void DeliverOneAck() {
    Message m = std::move(acks_.front());
    acks_.pop_front();
    engines_[m.to]->HandleReplicaAck(m.from, m.header);
  }

  // Delivers the first replica update waiting (its confirmation is queued
  // in `acks_`). REQUIRES: one is waiting.
  void DeliverOneUpdate() {
    Message m = std::move(outbox_.front());
    outbox_.pop_front();
    zmq::message_t peer("server" + std::to_string(m.from));
    zmq::message_t payload(m.payload.data(), m.payload.size());
    engines_[m.to]->Handle(peer, m.header, &payload);
    replicated_.push_back(std::move(m));
  }

  // With `hold_in_flight_`, every payload the engines send (answers and
  // replica updates) is kept as ZeroMQ keeps one still in its queue, with
  // its bytes when it was sent: nothing may write into it meanwhile.
  void Hold(zmq::message_t& payload) {
    std::string bytes = payload.to_string();
    in_flight_.emplace_back(std::move(payload), std::move(bytes));
  }
  void ExpectInFlightUnchanged() {
    for (size_t i = 0; i < in_flight_.size(); ++i) {
      EXPECT_TRUE(in_flight_[i].first.to_string() == in_flight_[i].second)
          << "message " << i << " of " << in_flight_.size() << " (" << in_flight_[i].second.size()
          << " bytes) was written into while it was being sent";
    }
  }

  std::vector<uint64_t> Answered() {
    std::vector<uint64_t> ids;
    for (const DataHeader& h : answers_) ids.push_back(h.request_id());
    return ids;
  }

  std::vector<float> Weights(uint32_t server) {
    const float* w = engines_[server]->weights(5);
    return std::vector<float>(w, w + n_);
  }

  int n_ = 2;
  ClusterConfig config_;
  std::unique_ptr<PartitionEngine> engines_[2];
  std::deque<Message> outbox_, acks_;
  std::vector<Message> replicated_;
  std::vector<DataHeader> answers_;
  std::vector<std::string> answer_payloads_;  // per answer, its payload bytes
  uint64_t next_id_ = 0;
  std::map<uint32_t, uint64_t> incarnations_;  // rank -> registration its requests name (none: 0)
  bool hold_in_flight_ = false;
  std::vector<std::pair<zmq::message_t, std::string>> in_flight_;
};

}  // namespace shardps

#endif  // SHARDPS_SERVER_ENGINE_TEST_UTIL_H_
