#include "server/partition_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/codec_policy.h"
#include "server/engine_test_util.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Sent {
  std::string peer;
  DataHeader header;
  std::vector<float> payload;
};

class EngineTest : public ::testing::Test {
 protected:
  // An engine for `c` serving partition 5 of `n` elements. Answers are
  // recorded; the raw payload bytes also go into header.error (for codecs).
  void MakeFromConfig(const ClusterConfig& c, int n) {
    auto engine = PartitionEngine::Create(c, [this](const zmq::message_t& peer, DataHeader& h, zmq::message_t* p) {
      Sent s{peer.to_string(), h, {}};
      if (p) s.payload.assign(p->data<float>(), p->data<float>() + p->size() / 4);
      if (p && !h.codec().empty()) s.header.set_error(std::string(p->data<char>(), p->size()));
      sent_.push_back(s);
    });
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    ShardMap map;
    map.set_epoch(3);
    map.add_tensors()->set_name("t");
    PartitionInfo* info = map.add_partitions();
    info->set_id(5);
    info->set_num_elements(n);
    ASSERT_TRUE(engine_->InstallShardMap(map, 0).ok());
  }

  // SGD with learning rate 1, so a weight moves by exactly the mean gradient.
  static ClusterConfig Config(Consistency consistency, bool deterministic, int workers,
                              UpdateMode mode = UPDATE_ON_SERVER) {
    ClusterConfig c;
    c.set_update_mode(mode);
    c.set_consistency(consistency);
    c.set_deterministic(deterministic);
    c.set_num_workers(workers);
    c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    c.mutable_optimizer()->set_learning_rate(1.0f);
    return c;
  }

  void Make(Consistency consistency, bool deterministic, int workers, const std::string& codec = "none",
            UpdateMode mode = UPDATE_ON_SERVER, int n = 2) {
    ClusterConfig c = Config(consistency, deterministic, workers, mode);
    c.mutable_compression()->set_codec(codec);
    MakeFromConfig(c, n);
  }

  // Sends raw bytes as a payload encoded with `codec`.
  void SendEncoded(Op op, uint32_t rank, uint64_t round, const std::string& codec, const std::string& bytes,
                   uint64_t n) {
    const DataHeader h = RequestHeader(op, rank, round, 3, ++next_id_, n, codec);
    zmq::message_t peer(std::string("w") + std::to_string(rank));
    zmq::message_t payload(bytes.data(), bytes.size());
    engine_->Handle(peer, h, &payload);
  }

  // `epoch` the request was routed with; `incarnation` 0: not said.
  void Send(Op op, uint32_t rank, uint64_t round, std::vector<float> values, uint64_t id = 0, uint64_t epoch = 3,
            uint64_t incarnation = 0) {
    DataHeader h = RequestHeader(op, rank, round, epoch, id ? id : ++next_id_, values.size());
    h.set_worker_incarnation(incarnation);
    zmq::message_t peer(std::string("w") + std::to_string(rank));
    zmq::message_t payload(values.data(), values.size() * 4);
    engine_->Handle(peer, h, op == PULL ? nullptr : &payload);
  }

  // Epoch `epoch` of the same map with `excluded` workers removed.
  static ShardMap SameMap(uint64_t epoch, const std::vector<uint32_t>& excluded, int n) {
    ShardMap map;
    map.set_epoch(epoch);
    map.add_tensors()->set_name("t");
    PartitionInfo* info = map.add_partitions();
    info->set_id(5);
    info->set_num_elements(n);
    for (uint32_t r : excluded) map.add_excluded_workers(r);
    return map;
  }

  // Installs epoch 4 of the same map with `excluded` workers removed.
  void RemoveWorkers(std::vector<uint32_t> excluded, int n = 2) {
    ASSERT_TRUE(engine_->InstallShardMap(SameMap(4, excluded, n), 0).ok());
  }

  // Installs epoch 5 of the same map: worker `rank` rejoined at `round`
  // with registration `incarnation`; `excluded` still removed.
  // `catch_up`: as the scheduler places a rank rejoining alone.
  void RejoinWorker(uint32_t rank, uint64_t round, uint64_t incarnation, std::vector<uint32_t> excluded = {},
                    bool catch_up = false) {
    ShardMap map = SameMap(5, excluded, 2);
    WorkerRejoin* r = map.add_rejoined_workers();
    r->set_rank(rank);
    r->set_round(round);
    r->set_incarnation(incarnation);
    r->set_catch_up(catch_up);
    ASSERT_TRUE(engine_->InstallShardMap(map, 0).ok());
  }

  // A push of epoch 5 from registration `incarnation` of worker `rank`.
  void PushFrom(uint32_t rank, uint64_t incarnation, uint64_t round, std::vector<float> g, uint64_t id = 0) {
    Send(PUSH, rank, round, std::move(g), id, 5, incarnation);
  }

  std::vector<float> Weights(int n = 2) { return std::vector<float>(engine_->weights(5), engine_->weights(5) + n); }

  std::unique_ptr<PartitionEngine> engine_;
  std::vector<Sent> sent_;
  uint64_t next_id_ = 0;
};

TEST_F(EngineTest, SyncAppliesOnceAllWorkersPushedAndAnswersWaitingPulls) {
  Make(SYNC, false, 2);
  Send(PUSH_PULL, 0, 0, {2, 4});
  EXPECT_TRUE(sent_.empty()) << "push-pull waits for the round";
  Send(PUSH_PULL, 1, 0, {4, 0});
  ASSERT_EQ(sent_.size(), 2u);
  // mean gradient {3, 2}, lr 1 -> weights {-3, -2}
  EXPECT_EQ(sent_[0].payload, (std::vector<float>{-3, -2}));
  EXPECT_EQ(sent_[0].peer, "w0");
  EXPECT_EQ(sent_[1].header.completed_rounds(), 1u);
}

// ZeroMQ hands over frames that start anywhere in its receive buffer; reading
// them as floats in place was undefined behaviour (UBSan's report in the
// sanitizer tree, tools/test.sh --sanitize address).
TEST_F(EngineTest, PayloadNotAlignedForFloatsIsApplied) {
  Make(SYNC, false, 2);
  Send(PUSH, 1, 0, {0, 0});  // the misaligned push is then added to this one
  const float g[2] = {2, 4};
  alignas(float) char buffer[1 + sizeof(g)];
  std::memcpy(buffer + 1, g, sizeof(g));
  DataHeader h;
  h.set_op(PUSH_PULL);
  h.set_epoch(3);
  h.set_partition_id(5);
  h.set_request_id(1);
  h.set_dtype(FLOAT32);
  h.set_num_elements(2);
  zmq::message_t peer(std::string("w0"));
  zmq::message_t payload(buffer + 1, sizeof(g), nullptr, nullptr);
  engine_->Handle(peer, h, &payload);
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].payload, (std::vector<float>{-1, -2}));
}

TEST_F(EngineTest, DeterministicSumsInRankOrderWhateverTheArrivalOrder) {
  Make(SYNC, true, 3);
  const std::vector<float> a = {1e8f, 1.0f}, b = {-1e8f, 1e-8f}, c = {1.0f, 3.0f};
  Send(PUSH, 2, 0, c);
  Send(PUSH, 0, 0, a);
  Send(PUSH, 1, 0, b);
  std::vector<float> expected = {0, 0};
  for (int i = 0; i < 2; ++i) {
    float sum = a[i];
    sum += b[i];
    sum += c[i];
    expected[i] = 0.0f - 1.0f * (sum * (1.0f / 3.0f));
  }
  EXPECT_EQ(Weights(), expected);
}

TEST_F(EngineTest, RetriedPushIsNotAppliedTwice) {
  Make(SYNC, false, 1);
  Send(PUSH, 0, 0, {1, 1}, 10);
  Send(PUSH, 0, 0, {1, 1}, 10);
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1}));
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].header.status_code(), 0);
}

TEST_F(EngineTest, PushAheadOfTheRoundIsParkedThenApplied) {
  Make(SYNC, false, 2);
  Send(PUSH, 0, 0, {1, 0});
  Send(PUSH, 0, 1, {1, 0});  // worker 0 runs ahead
  Send(PUSH, 1, 0, {1, 0});  // round 0 completes, round 1 has worker 0's push
  Send(PUSH, 1, 1, {1, 0});  // round 1 completes
  EXPECT_EQ(Weights(), (std::vector<float>{-2, 0}));
}

TEST_F(EngineTest, WorkerRunningSeveralRoundsAheadIsNotRefused) {
  Make(SYNC, false, 2);
  Send(PUSH, 0, 0, {1, 0});
  Send(PUSH, 0, 1, {1, 0});  // parked
  Send(PUSH, 0, 2, {1, 0});  // parked
  Send(PUSH, 1, 0, {1, 0});  // round 0 completes; round 1's push is replayed
  sent_.clear();
  Send(PUSH, 0, 3, {1, 0});  // worker 0 has pushed 0, 1 and 2: round 3 is next
  Send(PUSH, 1, 1, {1, 0});
  Send(PUSH, 1, 2, {1, 0});
  Send(PUSH, 1, 3, {1, 0});
  for (const Sent& s : sent_) EXPECT_EQ(s.header.status_code(), 0) << s.header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{-4, 0}));  // four rounds of mean gradient 1
}

TEST_F(EngineTest, AsyncAppliesEachPushOnArrivalWithItsShareOfTheLearningRate) {
  Make(ASYNC, false, 2);
  Send(PUSH, 0, 0, {1, 2});  // lr 1 over 2 workers: each push moves by 0.5 * g
  EXPECT_EQ(Weights(), (std::vector<float>{-0.5f, -1}));
  Send(PUSH_PULL, 1, 0, {1, 0});
  EXPECT_EQ(sent_.back().payload, (std::vector<float>{-1, -1}));
}

TEST_F(EngineTest, FirstInitWins) {
  Make(SYNC, false, 1);
  Send(INIT, 0, 0, {7, 8});
  Send(INIT, 0, 0, {9, 9});
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
}

TEST_F(EngineTest, BadRequestsGetErrorsAndChangeNothing) {
  Make(SYNC, false, 1);
  Send(INIT, 0, 0, {7, 8});
  sent_.clear();
  Send(PUSH, 0, 0, {1, 2, 3});  // wrong length
  Send(PUSH, 5, 0, {1, 2});     // rank out of range
  Send(PUSH, 0, 3, {1, 2});     // skips rounds
  DataHeader h;
  h.set_op(PUSH);
  h.set_epoch(3 + 1000);  // an epoch this server will not serve soon
  h.set_partition_id(5);
  zmq::message_t peer(std::string("x"));
  zmq::message_t payload(8);
  engine_->Handle(peer, h, &payload);
  h.set_epoch(3);
  h.set_partition_id(99);  // unknown partition
  engine_->Handle(peer, h, &payload);
  h.set_partition_id(5);
  h.set_num_elements(2);
  h.set_dtype(FLOAT32);
  engine_->Handle(peer, h, nullptr);  // missing payload
  ASSERT_EQ(sent_.size(), 6u);
  EXPECT_THAT(sent_[0].header.error(), HasSubstr("has 2 elements"));
  EXPECT_THAT(sent_[1].header.error(), HasSubstr("rank 5"));
  EXPECT_THAT(sent_[2].header.error(), HasSubstr("owes round 0"));
  EXPECT_THAT(sent_[3].header.error(), HasSubstr("wrong epoch"));
  EXPECT_EQ(sent_[3].header.server_epoch(), 3u);
  EXPECT_EQ(sent_[4].header.status_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(sent_[5].header.error(), HasSubstr("no payload"));
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
  EXPECT_EQ(engine_->stats().errors, 6u);
}

TEST_F(EngineTest, CompressedPushesAreDecodedAndSummed) {
  const int n = 4096;  // above the 2bit minimum size
  Make(SYNC, false, 2, "2bit:threshold=0.25", UPDATE_ON_SERVER, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  std::vector<float> g(n, 1.0f);
  SendEncoded(PUSH, 0, 0, spec, EncodeForTest(spec, g, 5, 0), n);
  SendEncoded(PUSH, 1, 0, spec, EncodeForTest(spec, g, 5, 0), n);
  // Each worker's 2bit gradient decodes to +0.25: mean 0.25, lr 1.
  EXPECT_EQ(Weights(n), std::vector<float>(n, -0.25f));
}

TEST_F(EngineTest, NonFiniteCompressedGradientsAreRefused) {
  const int n = 4096;
  std::vector<float> bad(n, 1.0f);
  bad[9] = std::numeric_limits<float>::quiet_NaN();
  // fp16/bf16 payloads are checked before decoding; async and deterministic
  // sync check what other codecs decode (topk keeps the NaN as a value).
  struct Case {
    std::string codec;
    Consistency mode;
    bool deterministic;
  };
  for (const Case& c : std::vector<Case>{{"fp16", SYNC, false},
                                         {"bf16", ASYNC, false},
                                         {"topk:ratio=0.5", ASYNC, false},
                                         {"topk:ratio=0.5", SYNC, true}}) {
    sent_.clear();
    Make(c.mode, c.deterministic, 1, c.codec, UPDATE_ON_SERVER, n);
    const std::string spec = compression::ParseCodecSpec(c.codec)->ToString();
    SendEncoded(PUSH, 0, 0, spec, EncodeForTest(spec, bad, 5, 0), n);
    ASSERT_EQ(sent_.size(), 1u) << c.codec;
    EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << c.codec;
    EXPECT_THAT(sent_[0].header.error(), HasSubstr("reject_non_finite")) << c.codec;
    EXPECT_EQ(Weights(n), std::vector<float>(n, 0.0f)) << c.codec;
  }
}

TEST_F(EngineTest, SummableCodecIsAggregatedWithoutDecodingEachPush) {
  const int n = 4096;
  Make(SYNC, false, 2, "randomk:ratio=0.5", UPDATE_ON_SERVER, n);
  const std::string spec = compression::ParseCodecSpec("randomk:ratio=0.5")->ToString();
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 7);
    b[i] = 1.0f;
  }
  SendEncoded(PUSH, 0, 0, spec, EncodeForTest(spec, a, 5, 0), n);
  SendEncoded(PUSH, 1, 0, spec, EncodeForTest(spec, b, 5, 0), n);
  // Decoding the summed payloads equals summing the decoded payloads.
  auto codec = compression::CreateCodec(spec);
  std::vector<float> da(n), db(n);
  ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(EncodeForTest(spec, a, 5, 0).data()),
                                                   EncodeForTest(spec, a, 5, 0).size()),
                               compression::CodecSeed(5, 0), absl::MakeSpan(da)).ok());
  ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(EncodeForTest(spec, b, 5, 0).data()),
                                                   EncodeForTest(spec, b, 5, 0).size()),
                               compression::CodecSeed(5, 0), absl::MakeSpan(db)).ok());
  std::vector<float> w = Weights(n);
  for (int i = 0; i < n; ++i) ASSERT_FLOAT_EQ(w[i], -0.5f * (da[i] + db[i])) << i;
}

TEST_F(EngineTest, MalformedCompressedPayloadsAreRejectedAndNotCounted) {
  const int n = 4096;
  Make(SYNC, false, 1, "2bit", UPDATE_ON_SERVER, n);
  const std::string spec = compression::ParseCodecSpec("2bit")->ToString();
  std::string good = EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0);
  std::string truncated = good.substr(0, good.size() - 8);
  std::string bad_threshold = good;
  const float nan = std::nanf("");
  std::memcpy(bad_threshold.data(), &nan, sizeof(nan));  // 2bit payload starts with its threshold
  std::string bad_code = good;
  bad_code[8] = static_cast<char>(0xff);  // code 3 is not a 2bit value
  SendEncoded(PUSH, 0, 0, spec, truncated, n);
  SendEncoded(PUSH, 0, 0, spec, bad_threshold, n);
  SendEncoded(PUSH, 0, 0, spec, bad_code, n);
  SendEncoded(PUSH, 0, 0, "fp16", good, n);  // not the configured codec
  Send(PUSH, 0, 0, std::vector<float>(n, 1.0f));  // raw where 2bit is configured
  ASSERT_EQ(sent_.size(), 5u);
  for (const Sent& s : sent_) EXPECT_EQ(s.header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << s.header.error();
  EXPECT_THAT(sent_[3].header.error(), HasSubstr("does not match"));
  EXPECT_EQ(Weights(n), std::vector<float>(n, 0.0f));
  // The round was not counted: a good push still completes it.
  SendEncoded(PUSH, 0, 0, spec, good, n);
  EXPECT_EQ(sent_.back().header.status_code(), 0);
  EXPECT_EQ(Weights(n)[0], -0.5f);
}

TEST_F(EngineTest, UncompressedRoundsTakeRawPushesThenTheCodec) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 1);
  c.mutable_compression()->set_codec("2bit:threshold=0.25");
  c.mutable_compression()->set_uncompressed_rounds(2);
  MakeFromConfig(c, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  SendEncoded(PUSH, 0, 0, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0), n);  // round 0 is raw
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("does not match"));
  Send(PUSH, 0, 0, std::vector<float>(n, 1.0f));
  Send(PUSH, 0, 1, std::vector<float>(n, 1.0f));
  EXPECT_EQ(Weights(n), std::vector<float>(n, -2.0f));  // exact values, not +-0.25
  Send(PUSH, 0, 2, std::vector<float>(n, 1.0f));  // round 2 must be compressed
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("does not match"));
  SendEncoded(PUSH, 0, 2, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 2), n);
  EXPECT_EQ(sent_.back().header.status_code(), 0);
  EXPECT_EQ(Weights(n), std::vector<float>(n, -2.25f));
}

TEST_F(EngineTest, WarmupRoundsTakeTheWarmupCodecOnlyAndAtItsExactSize) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 1);
  c.mutable_compression()->set_codec("2bit:threshold=0.25");
  c.mutable_compression()->set_uncompressed_rounds(2);
  c.mutable_compression()->set_warmup_codec("fp16");
  MakeFromConfig(c, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  const std::string fp16 = EncodeForTest("fp16", std::vector<float>(n, 1.0f), 5, 0);
  Send(PUSH, 0, 0, std::vector<float>(n, 1.0f));  // raw fp32 in a warm-up round
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("does not match the codec 'fp16'"));
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("warm-up round 0"));
  SendEncoded(PUSH, 0, 0, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 0), n);
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("does not match"));
  SendEncoded(PUSH, 0, 0, "fp16", fp16.substr(2), n);  // one value short
  EXPECT_EQ(sent_.back().header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(sent_.back().header.error(),
              HasSubstr("fp16 payload of 8190 bytes for partition 5 in warm-up round 0 (expected 8192)"));
  EXPECT_EQ(Weights(n), std::vector<float>(n, 0.0f));
  SendEncoded(PUSH, 0, 0, "fp16", fp16, n);
  EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  SendEncoded(PUSH, 0, 1, "fp16", EncodeForTest("fp16", std::vector<float>(n, 0.5f), 5, 1), n);
  EXPECT_EQ(Weights(n), std::vector<float>(n, -1.5f));  // fp16 holds 1 and 0.5 exactly
  SendEncoded(PUSH, 0, 2, "fp16", EncodeForTest("fp16", std::vector<float>(n, 1.0f), 5, 2), n);
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("does not match the codec '" + spec + "'"));
  SendEncoded(PUSH, 0, 2, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 2), n);
  EXPECT_EQ(sent_.back().header.status_code(), 0);
  EXPECT_EQ(Weights(n), std::vector<float>(n, -1.75f));
}

TEST_F(EngineTest, SumOnlyAggregateOfAWarmupRoundGoesBackInTheWarmupCodec) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, /*deterministic=*/true, 2, SUM_ONLY);
  c.mutable_compression()->set_codec("2bit:threshold=0.25");
  c.mutable_compression()->set_pull_codec("onebit");
  c.mutable_compression()->set_uncompressed_rounds(1);
  c.mutable_compression()->set_warmup_codec("bf16");
  MakeFromConfig(c, n);
  SendEncoded(PUSH_PULL, 0, 0, "bf16", EncodeForTest("bf16", std::vector<float>(n, 0.25f), 5, 0), n);
  SendEncoded(PUSH_PULL, 1, 0, "bf16", EncodeForTest("bf16", std::vector<float>(n, 0.5f), 5, 0), n);
  ASSERT_EQ(sent_.size(), 2u);
  for (const Sent& s : sent_) {
    ASSERT_EQ(s.header.codec(), "bf16") << s.header.error();
    std::vector<float> sum(n);
    auto bf16 = compression::CreateCodec("bf16");
    ASSERT_TRUE(bf16.ok());
    const std::string& bytes = s.header.error();  // the payload's bytes
    ASSERT_TRUE((*bf16)->Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                0, absl::MakeSpan(sum)).ok());
    EXPECT_EQ(sum, std::vector<float>(n, 0.75f));
  }
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  SendEncoded(PUSH_PULL, 0, 1, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 1), n);
  SendEncoded(PUSH_PULL, 1, 1, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 1), n);
  ASSERT_EQ(sent_.size(), 4u);
  EXPECT_EQ(sent_[3].header.codec(), compression::ParseCodecSpec("onebit")->ToString());
}

TEST(EngineConfigTest, SumOnlyFreezeBeforeTheCompressedRoundsIsRefused) {
  ClusterConfig c;
  c.set_update_mode(SUM_ONLY);
  c.mutable_compression()->set_codec("onebit");
  c.mutable_optimizer()->set_freeze_variance_after(100);
  c.mutable_compression()->set_uncompressed_rounds(50);
  auto engine = PartitionEngine::Create(c, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("compression.uncompressed_rounds"));
  c.mutable_compression()->set_uncompressed_rounds(100);
  EXPECT_TRUE(PartitionEngine::Create(c, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {}).ok());
  c.mutable_optimizer()->set_weight_decay(1e-4f);  // workers' momenta carry no decay term
  engine = PartitionEngine::Create(c, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("optimizer.weight_decay"));
  c.mutable_optimizer()->set_weight_decay(0);
  c.mutable_compression()->set_codec("topk");
  c.mutable_compression()->set_momentum(0.9f);  // DGC's momentum on top of Adam's
  engine = PartitionEngine::Create(c, [](const zmq::message_t&, DataHeader&, zmq::message_t*) {});
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("compression.momentum"));
}

TEST_F(EngineTest, SumOnlyAggregateOfAnUncompressedRoundIsRaw) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 1, SUM_ONLY);
  c.mutable_compression()->set_codec("2bit:threshold=0.25");
  c.mutable_compression()->set_pull_codec("2bit:threshold=0.25");
  c.mutable_compression()->set_uncompressed_rounds(1);
  MakeFromConfig(c, n);
  const std::string spec = compression::ParseCodecSpec("2bit:threshold=0.25")->ToString();
  Send(PUSH_PULL, 0, 0, std::vector<float>(n, 0.1f));
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_TRUE(sent_[0].header.codec().empty());
  EXPECT_EQ(sent_[0].payload, std::vector<float>(n, 0.1f));
  SendEncoded(PUSH_PULL, 0, 1, spec, EncodeForTest(spec, std::vector<float>(n, 1.0f), 5, 1), n);
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].header.codec(), spec);
}

TEST_F(EngineTest, SumOnlyAnswersTheRoundSumAndKeepsWeights) {
  Make(SYNC, false, 2, "none", SUM_ONLY);
  Send(INIT, 0, 0, {7, 8});
  Send(PUSH_PULL, 0, 0, {1, 2});
  Send(PUSH_PULL, 1, 0, {3, 4});
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[1].payload, (std::vector<float>{4, 6}));  // the sum; workers apply the optimizer
  EXPECT_EQ(sent_[2].header.completed_rounds(), 1u);
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
}

TEST_F(EngineTest, SumOnlyCompressedAggregateLosesNothingOverRounds) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 2, SUM_ONLY);
  c.mutable_compression()->set_pull_codec("2bit:threshold=0.01");
  MakeFromConfig(c, n);
  auto codec = compression::CreateCodec("2bit:threshold=0.01");
  std::vector<double> decoded_total(n, 0.0), true_total(n, 0.0);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> g0(n), g1(n);
    for (int i = 0; i < n; ++i) {
      g0[i] = 0.001f * static_cast<float>((i * 7 + round) % 11) - 0.004f;
      g1[i] = 0.0005f * static_cast<float>((i * 3 + round) % 5);
      true_total[i] += static_cast<double>(g0[i]) + g1[i];
    }
    sent_.clear();
    Send(PUSH_PULL, 0, round, g0);
    Send(PUSH_PULL, 1, round, g1);
    ASSERT_EQ(sent_.size(), 2u);
    const std::string& bytes = sent_[0].header.error();
    EXPECT_EQ(sent_[0].header.codec(), compression::ParseCodecSpec("2bit:threshold=0.01")->ToString());
    EXPECT_EQ(bytes, sent_[1].header.error()) << "both workers get the same bytes";
    std::vector<float> agg(n);
    ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                 0, absl::MakeSpan(agg)).ok());
    for (int i = 0; i < n; ++i) decoded_total[i] += agg[i];
  }
  // Error feedback: what was sent trails the true sum by less than one threshold.
  for (int i = 0; i < n; ++i) ASSERT_NEAR(decoded_total[i], true_total[i], 0.0101) << i;
}

TEST_F(EngineTest, SyncPullsCarryCompressedWeightDeltasThatTrackTheWeights) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 1);
  c.mutable_compression()->set_pull_codec("onebit");
  MakeFromConfig(c, n);
  std::vector<float> init(n);
  for (int i = 0; i < n; ++i) init[i] = 0.01f * (i % 13);
  Send(INIT, 0, 0, init);
  auto codec = compression::CreateCodec("onebit");
  std::vector<float> held = init;  // what a worker holds: init + decoded deltas
  for (int round = 0; round < 30; ++round) {
    std::vector<float> g(n);
    for (int i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>((i * 5 + round) % 9) + 0.001f;
    sent_.clear();
    Send(PUSH_PULL, 0, round, g);
    ASSERT_EQ(sent_.size(), 1u);
    ASSERT_EQ(sent_[0].header.status_code(), 0) << sent_[0].header.error();
    ASSERT_FALSE(sent_[0].header.codec().empty());
    const std::string& bytes = sent_[0].header.error();
    EXPECT_LT(bytes.size(), n * 4u / 16) << "a compressed delta, not the weights";
    ASSERT_TRUE((*codec)->DecodeAdd(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                    compression::CodecSeed(5, round + 1), absl::MakeSpan(held)).ok());
  }
  // The held copy trails the server's weights by one quantisation error at most.
  const float* w = engine_->weights(5);
  double max_gap = 0, max_move = 0;
  for (int i = 0; i < n; ++i) {
    max_gap = std::max(max_gap, std::abs(double(held[i]) - w[i]));
    max_move = std::max(max_move, std::abs(double(w[i]) - init[i]));
  }
  EXPECT_GT(max_move, 0.05);
  EXPECT_LT(max_gap, 0.2 * max_move);
  // A plain pull returns the whole weights, raw.
  sent_.clear();
  Send(PULL, 0, 30, {});
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_TRUE(sent_[0].header.codec().empty());
  EXPECT_EQ(sent_[0].payload.size(), static_cast<size_t>(n));
}

TEST_F(EngineTest, NonFiniteWeightDeltaIsAnErrorNotACrash) {
  const int n = 4096;
  ClusterConfig c = Config(SYNC, false, 1);
  c.mutable_compression()->set_pull_codec("onebit");
  c.set_reject_non_finite(false);  // let the Inf reach the weights
  MakeFromConfig(c, n);
  std::vector<float> g(n, 1.0f);
  g[7] = std::numeric_limits<float>::infinity();
  Send(PUSH_PULL, 0, 0, g);
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(sent_[0].header.error(), HasSubstr("non-finite"));
}

TEST_F(EngineTest, NonFiniteGradientsAreRefusedAndCountedWeightsUnchanged) {
  for (Consistency mode : {SYNC, ASYNC}) {
    sent_.clear();
    Make(mode, false, 1);
    Send(INIT, 0, 0, {1, 2});
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      for (Op op : {PUSH, PUSH_PULL, INIT}) {
        sent_.clear();
        Send(op, 0, 0, {0.5f, bad});
        ASSERT_EQ(sent_.size(), 1u);
        EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
        EXPECT_THAT(sent_[0].header.error(), HasSubstr("worker 0 for partition 5"));
        EXPECT_THAT(sent_[0].header.error(), HasSubstr("at element 1"));
      }
    }
    EXPECT_EQ(Weights(), (std::vector<float>{1, 2})) << "mode " << mode;
    EXPECT_EQ(engine_->stats().non_finite, 6u);
    // A finite push still goes through after all that.
    sent_.clear();
    Send(PUSH, 0, 0, {1, 1});
    ASSERT_FALSE(sent_.empty());
    EXPECT_EQ(sent_[0].header.status_code(), 0) << sent_[0].header.error();
    EXPECT_NE(Weights(), (std::vector<float>{1, 2}));
  }
}

// The finiteness check rides on the copy of a round's (or an async batch's)
// first gradient into the sum, and adding into a sum is checked first: a
// refused gradient, first or not, must leave the sum as if it was never sent,
// bitwise, and pushes that are not summed at once (ahead of the round, a
// retry) are refused as before.
TEST_F(EngineTest, RefusedNonFiniteGradientLeavesTheSumAsIfNeverSent) {
  const int n = 1031;  // not a multiple of any vector width
  auto gradient = [](int seed) {
    std::vector<float> g(n);
    for (int i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i * (seed + 2))) * (1.0f + seed);
    return g;
  };
  auto poisoned = [&](int seed, float bad, int at) {
    std::vector<float> g = gradient(seed);
    g[at] = bad;
    return g;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (Consistency mode : {SYNC, ASYNC}) {
    // Three workers, two rounds (async: two batches of three pushes).
    auto run = [&](bool with_refused) {
      sent_.clear();
      Make(mode, false, 3, "none", UPDATE_ON_SERVER, n);
      Send(INIT, 0, 0, gradient(9));
      for (uint64_t round = 0; round < 2; ++round) {
        if (mode == ASYNC) engine_->BeginBatch();
        if (with_refused) Send(PUSH, 1, round, poisoned(1, nan, 0));  // the first of the sum
        Send(PUSH, 0, round, gradient(0 + 3 * round));
        if (with_refused) Send(PUSH_PULL, 2, round, poisoned(2, inf, n - 1));  // added to a sum
        Send(PUSH, 1, round, gradient(1 + 3 * round));
        if (with_refused && mode == SYNC) {
          Send(PUSH, 0, round, poisoned(0, -inf, 7));      // a retry of a counted push
          Send(PUSH, 1, round + 1, poisoned(1, nan, 500));  // ahead of the round
        }
        Send(PUSH, 2, round, gradient(2 + 3 * round));
        if (mode == ASYNC) engine_->EndBatch();
      }
      int refused = 0;
      for (const Sent& s : sent_) {
        if (s.header.status_code() == 0) continue;
        ++refused;
        EXPECT_EQ(s.header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
        EXPECT_THAT(s.header.error(), HasSubstr("refused (reject_non_finite), weights unchanged"));
      }
      EXPECT_EQ(engine_->stats().non_finite, static_cast<uint64_t>(refused));
      EXPECT_EQ(engine_->UpdateCounts()[0].completed, mode == SYNC ? 2u : 6u);
      return std::make_pair(Weights(n), refused);
    };
    const auto [clean, none] = run(false);
    const auto [weights, refused] = run(true);
    EXPECT_EQ(none, 0) << "mode " << mode;
    EXPECT_EQ(refused, mode == SYNC ? 8 : 4) << "mode " << mode;
    EXPECT_EQ(std::memcmp(weights.data(), clean.data(), n * sizeof(float)), 0) << "mode " << mode;
  }
}

TEST_F(EngineTest, AsyncRequestIdFarAheadIsRefusedAndDoesNotPoisonLaterPushes) {
  Make(ASYNC, false, 2);
  Send(INIT, 0, 0, {0, 0});
  Send(PUSH, 0, 0, {1, 1});  // applied
  const std::vector<float> after_one = Weights();
  sent_.clear();
  for (uint64_t forged : {UINT64_MAX, next_id_ + (uint64_t{1} << 21)}) {
    Send(PUSH, 0, 0, {0, 0}, forged);
    ASSERT_EQ(sent_.size(), 1u);
    EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(sent_[0].header.error(), HasSubstr(absl::StrCat("request id ", forged, " from worker 0")));
    sent_.clear();
  }
  EXPECT_EQ(Weights(), after_one);
  // The worker's own next pushes are applied, not taken for retries.
  Send(PUSH, 0, 0, {1, 1});
  Send(PUSH, 0, 0, {1, 1});
  EXPECT_EQ(engine_->UpdateCounts()[0].applied_by_worker[0], 3u);
  // A retry (same id as an applied push) is still answered without applying.
  Send(PUSH, 0, 0, {1, 1}, next_id_);
  EXPECT_EQ(engine_->UpdateCounts()[0].applied_by_worker[0], 3u);
  // Ids within the window are fine (the worker sent elsewhere meanwhile).
  Send(PUSH, 0, 0, {1, 1}, next_id_ + 1000);
  EXPECT_EQ(engine_->UpdateCounts()[0].applied_by_worker[0], 4u);
  EXPECT_EQ(engine_->stats().bad_request_ids, 2u);
}

TEST_F(EngineTest, ShutdownAnswersWaitingPulls) {
  Make(SYNC, false, 2);
  Send(PUSH_PULL, 0, 0, {1, 1});
  engine_->FailWaiting(absl::UnavailableError("stopping"));
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].header.status_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(EngineTest, ARoundHeldUpByARemovedWorkerCompletesWithTheOthersAveraged) {
  Make(SYNC, false, 3);
  Send(PUSH_PULL, 0, 0, {2, 4});
  Send(PUSH_PULL, 1, 0, {4, 0});
  EXPECT_TRUE(sent_.empty()) << "waits for worker 2";
  RemoveWorkers({2});
  ASSERT_EQ(sent_.size(), 2u);
  // The mean over the two gradients that are in: {3, 2}.
  EXPECT_EQ(sent_[0].payload, (std::vector<float>{-3, -2}));
  // Later rounds need only the workers that remain; the removed one is refused.
  Send(PUSH, 2, 1, {9, 9});
  EXPECT_THAT(sent_[2].header.error(), HasSubstr("worker 2 was declared dead and removed from the job"));
  Send(PUSH, 0, 1, {1, 1});
  Send(PUSH, 1, 1, {1, 1});
  EXPECT_EQ(Weights(), (std::vector<float>{-4, -3}));
}

TEST_F(EngineTest, ARoundOfOneGradientIsAppliedFromItsMessageAndEachRoundStartsAfresh) {
  // The round's (async: the batch's) first gradient is held as received,
  // not copied into a sum: with one worker (or the others removed) it is the
  // round's sum, and the next round's first gradient replaces it.
  const int n = 1031;
  auto gradient = [](int seed) {
    std::vector<float> g(n);
    for (int i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i * (seed + 2))) * (1.0f + seed);
    return g;
  };
  for (const auto& [mode, workers] : {std::pair{SYNC, 1}, std::pair{SYNC, 2}, std::pair{ASYNC, 1}}) {
    SCOPED_TRACE(absl::StrCat("mode ", mode, ", ", workers, " workers"));
    sent_.clear();
    Make(mode, false, workers, "none", UPDATE_ON_SERVER, n);
    Send(INIT, 0, 0, gradient(9));
    std::vector<float> want = gradient(9);
    if (workers == 2) RemoveWorkers({1}, n);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> poisoned = gradient(round);
      poisoned[round * 100] = std::numeric_limits<float>::quiet_NaN();
      Send(PUSH, 0, round, poisoned);  // refused: leaves nothing held
      Send(PUSH_PULL, 0, round, gradient(round));
      const std::vector<float> g = gradient(round);
      for (int i = 0; i < n; ++i) want[i] -= g[i];  // SGD, learning rate 1, one gradient
      ASSERT_FALSE(sent_.empty());
      EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
      EXPECT_EQ(std::memcmp(sent_.back().payload.data(), want.data(), n * sizeof(float)), 0) << "round " << round;
    }
    EXPECT_EQ(engine_->UpdateCounts()[0].completed, 3u);
    EXPECT_EQ(engine_->stats().non_finite, 3u);
    const std::vector<float> weights = Weights(n);
    EXPECT_EQ(std::memcmp(weights.data(), want.data(), n * sizeof(float)), 0);
  }
}

TEST_F(EngineTest, ARemovedWorkersContributionToTheOpenRoundCountsAndItsParkedPushesDoNot) {
  Make(SYNC, true, 3);
  Send(PUSH, 2, 0, {6, 6});
  Send(PUSH, 2, 1, {100, 100});  // parked: round 1 is ahead
  Send(PUSH, 0, 0, {0, 3});
  RemoveWorkers({2});
  EXPECT_TRUE(Weights() == (std::vector<float>{0, 0})) << "worker 1 still owes round 0";
  Send(PUSH, 1, 0, {3, 0});
  EXPECT_EQ(Weights(), (std::vector<float>{-3, -3}));  // (6 + 0 + 3) / 3, (6 + 3 + 0) / 3
  Send(PUSH, 0, 1, {2, 2});
  Send(PUSH, 1, 1, {4, 4});
  EXPECT_EQ(Weights(), (std::vector<float>{-6, -6})) << "round 1 is the mean of workers 0 and 1 only";
}

TEST_F(EngineTest, SumOnlyAnswersSayHowManyGradientsTheAggregateSums) {
  Make(SYNC, false, 3, "none", SUM_ONLY);
  Send(PUSH_PULL, 0, 0, {1, 1});
  Send(PUSH_PULL, 1, 0, {2, 2});
  RemoveWorkers({2});
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[0].header.contributors(), 2u);
  EXPECT_EQ(sent_[0].payload, (std::vector<float>{3, 3}));
}

TEST_F(EngineTest, ARestartedWorkerProcessIsRefusedInsteadOfTakenForARetry) {
  Make(SYNC, false, 1);
  auto push = [&](uint64_t incarnation, uint64_t round) {
    DataHeader h;
    h.set_op(PUSH);
    h.set_round(round);
    h.set_epoch(3);
    h.set_partition_id(5);
    h.set_request_id(++next_id_);
    h.set_dtype(FLOAT32);
    h.set_num_elements(2);
    h.set_worker_incarnation(incarnation);
    std::vector<float> g = {1, 1};
    zmq::message_t peer(std::string("w0"));
    zmq::message_t payload(g.data(), 8);
    engine_->Handle(peer, h, &payload);
  };
  push(7, 0);
  push(7, 1);
  EXPECT_EQ(Weights(), (std::vector<float>{-2, -2}));
  push(9, 0);  // a new process of rank 0 starting over
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[2].header.status_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(sent_[2].header.error(), HasSubstr("worker 0 restarted"));
  EXPECT_EQ(Weights(), (std::vector<float>{-2, -2}));
  push(7, 0);  // the old process's retry is still recognised
  EXPECT_EQ(sent_[3].header.status_code(), 0);
  EXPECT_EQ(Weights(), (std::vector<float>{-2, -2}));
}

TEST_F(EngineTest, ARejoinedWorkerIsCountedFromItsJoinRoundOnly) {
  Make(SYNC, false, 3);
  RemoveWorkers({2});
  Send(PUSH, 0, 0, {2, 2});
  Send(PUSH, 1, 0, {4, 4});
  EXPECT_EQ(Weights(), (std::vector<float>{-3, -3}));
  RejoinWorker(2, /*round=*/3, /*incarnation=*/11);
  // Its first pull waits for the weights of the round before its join round.
  Send(PULL, 2, 3, {0, 0}, 0, 5, 11);
  for (uint64_t round : {1, 2}) {
    Send(PUSH, 0, round, {1, 1});
    Send(PUSH, 1, round, {1, 1});  // rounds 1 and 2 complete without worker 2
  }
  EXPECT_EQ(Weights(), (std::vector<float>{-5, -5}));
  auto answer = std::find_if(sent_.begin(), sent_.end(), [](const Sent& a) { return a.peer == "w2"; });
  ASSERT_NE(answer, sent_.end()) << "the pull is answered once round 2 is applied";
  EXPECT_EQ(answer->payload, (std::vector<float>{-5, -5}));
  PushFrom(2, 11, 2, {50, 50});
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("rejoined the job at round 3 and pushed round 2"));
  // From round 3 on the round waits for it and averages over all three.
  Send(PUSH, 0, 3, {3, 3});
  Send(PUSH, 1, 3, {3, 3});
  EXPECT_EQ(Weights(), (std::vector<float>{-5, -5})) << "round 3 waits for the rejoined worker";
  PushFrom(2, 11, 3, {9, 9});
  EXPECT_EQ(Weights(), (std::vector<float>{-10, -10}));  // (3 + 3 + 9) / 3
}

// The watch hands a server only the latest map: one may learn of a worker's
// removal and its rejoin (its process restarted at once) from the same map.
// The open round then completes without it, as after the removal alone,
// instead of waiting for a push the dead process will never send.
TEST_F(EngineTest, ARemovalAndRejoinInOneMapCompleteTheOpenRoundWithoutTheWorker) {
  for (const bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "arrival order");
    Make(SYNC, deterministic, 2);
    Send(PUSH, 1, 0, {4, 4});
    Send(PUSH, 0, 0, {2, 2});
    Send(PUSH, 0, 1, {6, 6});  // round 1 waits for worker 1, which dies
    EXPECT_EQ(Weights(), (std::vector<float>{-3, -3}));
    RejoinWorker(1, /*round=*/3, /*incarnation=*/11);  // the removal map was skipped
    EXPECT_EQ(Weights(), (std::vector<float>{-9, -9})) << "round 1 is worker 0's alone";
    Send(PUSH, 0, 2, {1, 1});
    EXPECT_EQ(Weights(), (std::vector<float>{-10, -10})) << "round 2 completes without the rejoined worker";
    sent_.clear();
  }
}

// A worker removed while its push of the open round is counted, and
// rejoined at that round before it completes: the round holds one gradient
// of that worker, the first (its new process's push is taken for a retry).
TEST_F(EngineTest, AWorkerRejoinedAtTheRoundItsOldPushIsCountedInIsCountedOnce) {
  for (const bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "arrival order");
    Make(SYNC, deterministic, 2);
    Send(PUSH, 1, 0, {4, 4});
    RemoveWorkers({1});
    RejoinWorker(1, /*round=*/0, /*incarnation=*/11);
    PushFrom(1, 11, 0, {8, 8});
    EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
    Send(PUSH, 0, 0, {2, 2});
    EXPECT_EQ(Weights(), (std::vector<float>{-3, -3})) << "(2 + 4) / 2";
    PushFrom(1, 11, 1, {2, 2});
    Send(PUSH, 0, 1, {4, 4});
    EXPECT_EQ(Weights(), (std::vector<float>{-6, -6})) << "round 1 counts the new process";
    sent_.clear();
  }
}

TEST_F(EngineTest, ARankRejoiningAloneCatchesUpWhereItsPartitionCompletedTheJoinRound) {
  // Both workers removed mid-step: this partition had worker 1's push of
  // round 1, and the removal completed that round; another partition that
  // had none stayed at 1 round. The rank rejoins alone at the fewest (1):
  // here its push of round 1 is taken for a retry (answered, not counted),
  // and its push of round 2 is counted and completes it. Without catch_up
  // it was refused, and the worker failed.
  Make(SYNC, false, 2);
  Send(PUSH, 0, 0, {1, 1});
  Send(PUSH, 1, 0, {1, 1});
  Send(PUSH, 1, 1, {3, 3});
  RemoveWorkers({0, 1});
  ASSERT_EQ(engine_->fewest_completed_round(), 2u) << "round 1 completed with worker 1's push";
  const std::vector<float> before = Weights();
  RejoinWorker(0, /*round=*/1, /*incarnation=*/11, {1}, /*catch_up=*/true);
  sent_.clear();
  PushFrom(0, 11, 1, {9, 9});
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  EXPECT_EQ(Weights(), before) << "not counted: round 1 completed without it";
  PushFrom(0, 11, 2, {2, 2});
  EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{before[0] - 2, before[1] - 2})) << "round 2: worker 0's gradient alone";
}

TEST_F(EngineTest, ARoundWaitingAWholeCheckForOneWorkersPushIsReportedOnceNamingItAndAgainWhenItMoves) {
  // chaos16 (`tools/chaos.sh wsrv`): a worker cut off from one server only
  // stalled the sync job without a word from any node.
  Make(SYNC, false, 3);
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty()) << "no round open";
  Send(PUSH, 0, 0, {1, 1});
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty()) << "open since less than a whole check";
  Send(PUSH, 2, 0, {1, 1});
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty()) << "a push came in since the last check";
  std::vector<PartitionEngine::RoundStall> stalls = engine_->CheckRoundStalls();
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].worker, 1u);
  EXPECT_EQ(stalls[0].partitions, std::vector<uint64_t>{5});
  EXPECT_EQ(stalls[0].round, 0u);
  EXPECT_FALSE(stalls[0].resumed);
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty()) << "the same stall said twice";
  Send(PUSH, 1, 0, {1, 1});  // the round completes
  stalls = engine_->CheckRoundStalls();
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].worker, 1u);
  EXPECT_TRUE(stalls[0].resumed);
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty());
}

TEST_F(EngineTest, AStalledWorkerThatIsRemovedIsNotSaidToReachTheServerAgain) {
  // A killed worker stalls its rounds until the scheduler declares it dead;
  // the rounds then move without it. Before, the next check said "worker
  // 1's pushes reach it again" of a worker that had just been removed.
  Make(SYNC, false, 3);
  Send(PUSH, 0, 0, {1, 1});
  Send(PUSH, 2, 0, {1, 1});
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty());
  ASSERT_EQ(engine_->CheckRoundStalls().size(), 1u) << "worker 1's push missing a whole check";
  RemoveWorkers({1});  // declared dead: the round completes without it
  EXPECT_THAT(engine_->CheckRoundStalls(), IsEmpty()) << "removed, not resumed";
}

TEST_F(EngineTest, APartitionPastTheJoinRoundTakesTheRejoinedWorkersEarlierRoundsForRetriesAndWaitsForItAtTheOpenOne) {
  // The scheduler placed the rank by the servers' pace and this one was
  // faster. Its pushes of the rounds completed without it were refused and
  // the worker failed ("must rejoin again"); now they are answered, not
  // counted, and the open round counts it.
  Make(SYNC, false, 2);
  RemoveWorkers({1});
  for (uint64_t round : {0, 1, 2}) Send(PUSH, 0, round, {1, 1});
  RejoinWorker(1, /*round=*/1, /*incarnation=*/11);  // this server learned of it late
  const std::vector<float> before = Weights();
  ASSERT_EQ(before, (std::vector<float>{-3, -3}));
  for (uint64_t round : {1, 2}) {
    PushFrom(1, 11, round, {9, 9});
    EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  }
  EXPECT_EQ(Weights(), before) << "rounds 1 and 2 completed without it: not counted";
  Send(PUSH, 0, 3, {1, 1});
  EXPECT_EQ(Weights(), before) << "round 3 waits for the rejoined worker";
  PushFrom(1, 11, 3, {3, 3});
  EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{-5, -5})) << "round 3: the mean of both workers' gradients";
}

TEST_F(EngineTest, AnAsyncRejoinedWorkersPushesAreCountedAfresh) {
  Make(ASYNC, false, 2);
  for (uint64_t id : {1, 2, 3}) Send(PUSH, 1, 0, {1, 1}, id);
  RemoveWorkers({1});
  RejoinWorker(1, /*round=*/4, /*incarnation=*/12);
  PushFrom(1, 12, 4, {1, 1}, /*id=*/1);  // a new process numbers its requests from 1
  EXPECT_EQ(sent_.back().header.status_code(), 0) << sent_.back().header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{-2, -2})) << "applied, not taken for a retry (lr / W each)";
  std::vector<PartitionUpdates> counts = engine_->UpdateCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].applied_by_worker[1], 1u) << "what this process was acknowledged, nothing of the dead one";
}

TEST_F(EngineTest, ARequestRoutedSeveralEpochsAheadWaitsForThatEpoch) {
  // Primary moves (replication 1) make about three epochs each within
  // milliseconds: a worker saw epoch 10 while this server served 5, and was
  // refused "wrong epoch" (its push failed the job) when 4 was the limit.
  Make(SYNC, false, 1);
  Send(PUSH, 0, 0, {1, 1}, 0, 3 + 7);
  EXPECT_TRUE(sent_.empty()) << (sent_.empty() ? "" : sent_[0].header.error());
  ASSERT_TRUE(engine_->InstallShardMap(SameMap(3 + 7, {}, 2), 0).ok());
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].header.status_code(), 0) << sent_[0].header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1}));
}

TEST_F(EngineTest, RequestsRoutedWithAnOlderEpochAreServedWhileThePartitionStaysHere) {
  Make(SYNC, false, 1);
  RemoveWorkers({});  // epoch 4, same partitions
  Send(PUSH, 0, 0, {1, 1});  // routed with epoch 3
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].header.status_code(), 0) << sent_[0].header.error();
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1}));
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(EngineTest, PushesParkedForTheNextRoundAreNotCountedWhenAWorkerIsRemoved) {
  Make(SYNC, true, 3);
  Send(PUSH, 0, 0, {2, 2});
  Send(PUSH, 1, 0, {4, 4});
  Send(PUSH, 0, 1, {1, 1});  // parked: worker 2 still owes round 0
  Send(PUSH, 1, 1, {3, 3});
  RemoveWorkers({2});
  // Round 0 is the mean of workers 0 and 1, then both parked pushes make round 1.
  EXPECT_EQ(Weights(), (std::vector<float>{-5, -5}));
  EXPECT_EQ(sent_.size(), 4u) << "every push answered";
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(EngineTest, InitIsNeverASilentNoOp) {
  Make(SYNC, false, 1);
  Send(INIT, 0, 0, {7, 8});
  Send(INIT, 0, 0, {7, 8});  // a retry: same values, no update yet
  Send(INIT, 0, 0, {1, 1});  // another INIT: refused, weights kept
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[1].header.status_code(), 0);
  EXPECT_EQ(sent_[2].header.status_code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(Weights(), (std::vector<float>{7, 8}));
  Send(PUSH, 0, 0, {1, 1});
  Send(INIT, 0, 0, {-1, -2});  // after an update: refused, saying why
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("has taken 1 updates"));
  EXPECT_EQ(Weights(), (std::vector<float>{6, 7}));
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

class SspEngineTest : public EngineTest {
 protected:
  // `in_rounds`: ssp_in_rounds (the tests below before the on-arrival ones).
  void MakeSsp(uint32_t staleness, int workers, bool staleness_aware = true, bool in_rounds = true) {
    ClusterConfig c = Config(SSP, false, workers);
    c.set_staleness(staleness);
    c.set_staleness_aware_lr(staleness_aware);
    c.set_ssp_in_rounds(in_rounds);
    MakeFromConfig(c, 2);
  }
  // A push-pull of `round` computed on the weights of `based_on` rounds.
  void PushPullBasedOn(uint32_t rank, uint64_t round, uint64_t based_on, std::vector<float> g) {
    DataHeader h;
    h.set_op(PUSH_PULL);
    h.set_worker_rank(rank);
    h.set_round(round);
    h.set_based_on(based_on);
    h.set_epoch(3);
    h.set_partition_id(5);
    h.set_request_id(++next_id_);
    h.set_dtype(FLOAT32);
    h.set_num_elements(g.size());
    zmq::message_t peer(std::string("w") + std::to_string(rank));
    zmq::message_t payload(g.data(), g.size() * 4);
    engine_->Handle(peer, h, &payload);
  }
};

// SSP applied on arrival (the default): each push steps the weights at once
// (lr / W, as async), and a push-pull of round r is answered only once every
// other worker has pushed round r - staleness.
TEST_F(SspEngineTest, OnArrivalEachPushIsAppliedAtOnceAndAFastWorkerWaitsOnlyForTheBound) {
  MakeSsp(1, 2, /*staleness_aware=*/true, /*in_rounds=*/false);
  PushPullBasedOn(1, 0, 0, {0, 0});
  PushPullBasedOn(0, 0, 0, {2, 2});
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1})) << "applied on arrival with lr 1 / 2 workers";
  EXPECT_EQ(sent_[1].payload, (std::vector<float>{-1, -1}));
  PushPullBasedOn(0, 1, 1, {2, 2});
  ASSERT_EQ(sent_.size(), 3u) << "round 1 - 1 = 0: worker 1 has pushed it";
  PushPullBasedOn(0, 2, 2, {2, 2});
  EXPECT_EQ(sent_.size(), 3u) << "round 2 - 1 = 1: waits for worker 1's push of round 1";
  EXPECT_EQ(Weights(), (std::vector<float>{-3, -3})) << "held is the answer, not the update";
  EXPECT_EQ(engine_->Queues().bounded, 1u) << "the held answer shows in the queue metrics";
  PushPullBasedOn(1, 1, 1, {0, 0});
  ASSERT_EQ(sent_.size(), 5u) << "worker 1's answer and worker 0's held one";
  EXPECT_EQ(engine_->Queues().bounded, 0u);
  EXPECT_EQ(sent_[3].peer, "w1");
  EXPECT_EQ(sent_[4].peer, "w0");
  EXPECT_EQ(sent_[4].payload, (std::vector<float>{-3, -3}));
  // The slowest worker is never held: worker 1 may push on.
  PushPullBasedOn(1, 2, 2, {0, 0});
  EXPECT_EQ(sent_.size(), 6u);
}

TEST_F(SspEngineTest, OnArrivalAWorkerRemovedFromTheJobNoLongerHoldsTheOthers) {
  MakeSsp(1, 3, /*staleness_aware=*/true, /*in_rounds=*/false);
  for (uint32_t w = 0; w < 3; ++w) PushPullBasedOn(w, 0, 0, {0, 0});
  PushPullBasedOn(0, 1, 1, {0, 0});
  PushPullBasedOn(0, 2, 1, {0, 0});
  ASSERT_EQ(sent_.size(), 4u) << "worker 0's round 2 waits for workers 1 and 2";
  PushPullBasedOn(1, 1, 1, {0, 0});
  EXPECT_EQ(sent_.size(), 5u) << "worker 2 is still behind";
  RemoveWorkers({2});
  ASSERT_EQ(sent_.size(), 6u);
  EXPECT_EQ(sent_.back().peer, "w0");
}

TEST_F(SspEngineTest, OnArrivalARetryOfAnAppliedPushIsHeldByTheBoundToo) {
  MakeSsp(1, 2, /*staleness_aware=*/true, /*in_rounds=*/false);
  PushPullBasedOn(1, 0, 0, {0, 0});
  PushPullBasedOn(0, 0, 0, {2, 2});
  PushPullBasedOn(0, 1, 1, {2, 2});
  PushPullBasedOn(0, 2, 2, {2, 2});
  ASSERT_EQ(sent_.size(), 3u);
  // Worker 0 sends its round-2 push again (same request id): not applied
  // twice, and still within the bound only once worker 1 catches up.
  DataHeader retry;
  retry.set_op(PUSH_PULL);
  retry.set_worker_rank(0);
  retry.set_round(2);
  retry.set_epoch(3);
  retry.set_partition_id(5);
  retry.set_request_id(next_id_);
  retry.set_dtype(FLOAT32);
  retry.set_num_elements(2);
  std::vector<float> g = {2, 2};
  zmq::message_t peer(std::string("w0")), payload(g.data(), 8);
  engine_->Handle(peer, retry, &payload);
  EXPECT_EQ(sent_.size(), 3u);
  EXPECT_EQ(Weights(), (std::vector<float>{-3, -3}));
  PushPullBasedOn(1, 1, 1, {0, 0});
  ASSERT_EQ(sent_.size(), 6u) << "worker 1's answer, then both of worker 0's";
  EXPECT_EQ(Weights(), (std::vector<float>{-3, -3}));
}

TEST_F(SspEngineTest, AWorkerRunsAtMostStalenessRoundsAheadOfTheSlowest) {
  MakeSsp(1, 2);
  PushPullBasedOn(0, 0, 0, {2, 2});
  ASSERT_EQ(sent_.size(), 1u) << "round 0 + 1 - 1 = 0 rounds needed: answered at once";
  EXPECT_EQ(sent_[0].header.completed_rounds(), 0u);
  EXPECT_EQ(Weights(), (std::vector<float>{0, 0})) << "the round is not applied before worker 1's push";
  PushPullBasedOn(0, 1, 0, {4, 4});
  EXPECT_EQ(sent_.size(), 1u) << "round 1 needs round 0 complete: worker 0 waits for worker 1";
  PushPullBasedOn(1, 0, 0, {0, 0});
  // Round 0 (mean {1, 1}) completes: worker 1's answer and worker 0's round-1
  // answer both carry it.
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(Weights(), (std::vector<float>{-1, -1}));
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(sent_[i].header.completed_rounds(), 1u);
    EXPECT_EQ(sent_[i].payload, (std::vector<float>{-1, -1}));
  }
}

TEST_F(SspEngineTest, StalenessZeroAnswersOnlyOnceTheRoundIsComplete) {
  MakeSsp(0, 2);
  PushPullBasedOn(0, 0, 0, {2, 2});
  EXPECT_TRUE(sent_.empty());
  PushPullBasedOn(1, 0, 0, {0, 0});
  EXPECT_EQ(sent_.size(), 2u);
}

TEST_F(SspEngineTest, AStaleRoundStepsByTheLearningRateOverItsMeanStaleness) {
  MakeSsp(3, 2);
  // Rounds 0 and 1 from both workers on fresh weights.
  for (uint64_t r = 0; r < 2; ++r) {
    PushPullBasedOn(0, r, r, {0, 0});
    PushPullBasedOn(1, r, r, {0, 0});
  }
  ASSERT_EQ(Weights(), (std::vector<float>{0, 0}));
  // Round 2: gradients computed on the weights of round 0, i.e. 2 rounds
  // stale each: lr 1 / 2 on the mean gradient {4, 4}.
  PushPullBasedOn(0, 2, 0, {4, 4});
  PushPullBasedOn(1, 2, 0, {4, 4});
  EXPECT_EQ(Weights(), (std::vector<float>{-2, -2}));
  EXPECT_EQ(engine_->stats().staleness_max, 2.0);
  EXPECT_EQ(engine_->stats().stale_gradients, 6u);
}

TEST_F(SspEngineTest, TheStalenessAwareRateCanBeSwitchedOff) {
  MakeSsp(3, 1, /*staleness_aware=*/false);
  PushPullBasedOn(0, 0, 0, {0, 0});
  PushPullBasedOn(0, 1, 0, {0, 0});
  PushPullBasedOn(0, 2, 0, {4, 4});
  EXPECT_EQ(Weights(), (std::vector<float>{-4, -4}));
  EXPECT_EQ(engine_->stats().staleness_max, 2.0) << "measured all the same";
}

TEST_F(SspEngineTest, AWorkerFarAheadIsRefusedNamingTheBound) {
  MakeSsp(1, 2);
  // Worker 0 alone: rounds 0..5 are parked (max ahead = 4 + staleness 1).
  for (uint64_t r = 0; r <= 6; ++r) PushPullBasedOn(0, r, 0, {1, 1});
  ASSERT_FALSE(sent_.empty());
  EXPECT_EQ(sent_.back().header.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(sent_.back().header.error(), HasSubstr("more than 5 rounds ahead"));
}

TEST_F(SspEngineTest, ARemovedWorkerNoLongerHoldsTheOthersBack) {
  MakeSsp(1, 2);
  PushPullBasedOn(0, 0, 0, {2, 2});
  PushPullBasedOn(0, 1, 0, {2, 2});
  ASSERT_EQ(sent_.size(), 1u);
  RemoveWorkers({1});
  // Round 0 completes with worker 0's gradient; its round-1 answer goes out.
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].header.completed_rounds(), 1u);
}

TEST_F(EngineTest, AsyncStalenessIsCountedInRoundsOfWPushes) {
  ClusterConfig c = Config(ASYNC, false, 2);
  MakeFromConfig(c, 2);
  // lr 1 / W = 0.5 per push. Four pushes on version 0: the last is 3
  // pushes = 1.5 rounds stale, so it steps by 0.5 / 1.5.
  for (int i = 0; i < 3; ++i) Send(PUSH_PULL, 0, 0, {0, 0});
  DataHeader h;
  h.set_op(PUSH_PULL);
  h.set_worker_rank(1);
  h.set_based_on(0);
  h.set_epoch(3);
  h.set_partition_id(5);
  h.set_request_id(++next_id_);
  h.set_dtype(FLOAT32);
  h.set_num_elements(2);
  std::vector<float> g = {3, 3};
  zmq::message_t peer("w1", 2);
  zmq::message_t payload(g.data(), 8);
  engine_->Handle(peer, h, &payload);
  EXPECT_FLOAT_EQ(Weights()[0], -1.0f);
  EXPECT_EQ(engine_->stats().staleness_max, 1.5);
}

}  // namespace
}  // namespace shardps

namespace shardps {
namespace {

TEST_F(EngineTest, AsyncPushesDrainedTogetherApplyAsOneUpdate) {
  Make(ASYNC, false, 3);  // lr 1 / W = 1/3 per push
  engine_->BeginBatch();
  Send(PUSH_PULL, 0, 0, {2, 2});
  Send(PUSH_PULL, 1, 0, {4, 4});
  EXPECT_TRUE(sent_.empty()) << "answered with the batch";
  EXPECT_EQ(Weights(), (std::vector<float>{0, 0}));
  engine_->EndBatch();
  // One SGD step with the mean {3, 3} and 2 x 1/3: what the two pushes would
  // have done one by one.
  EXPECT_FLOAT_EQ(Weights()[0], -2.0f);
  EXPECT_EQ(engine_->stats().updates, 1u);
  ASSERT_EQ(sent_.size(), 2u);
  for (const Sent& s : sent_) EXPECT_EQ(s.header.completed_rounds(), 2u) << "both pushes counted";
}

TEST_F(EngineTest, AnAsyncBatchIsAppliedOnceWPushesAreIn) {
  Make(ASYNC, false, 2);
  engine_->BeginBatch();
  Send(PUSH_PULL, 0, 0, {2, 2});
  Send(PUSH_PULL, 1, 0, {2, 2});
  EXPECT_EQ(sent_.size(), 2u) << "a round's worth of pushes does not wait for the end of the batch";
  Send(PUSH_PULL, 0, 0, {2, 2}, /*id=*/1);
  engine_->EndBatch();
  EXPECT_EQ(engine_->stats().updates, 1u) << "a retry is answered, not applied again";
  EXPECT_EQ(sent_.size(), 3u);
}

}  // namespace
}  // namespace shardps
