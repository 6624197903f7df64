// Multi-process tests: real scheduler and server processes on loopback, the
// worker library in the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/algorithm/container.h"
#include "common/scheduler_client.h"
#include "common/tensor_spec.h"
#include "common/optimizer.h"
#include "common/protocol.h"
#include "proto/data.pb.h"
#include "tests/test_cluster.h"
#include "worker/c_api.h"
#include "worker/worker.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

ClusterConfig Config(int servers, int workers, Consistency consistency = SYNC) {
  ClusterConfig c;
  c.set_num_servers(servers);
  c.set_num_workers(workers);
  c.set_consistency(consistency);
  c.set_partition_bytes(1024);  // small, so tensors span both servers
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_learning_rate(0.5f);
  c.set_rendezvous_timeout_ms(20000);
  return c;
}

TensorSpec Tensor(const std::string& name, int64_t n) { return Float32Tensor(name, n); }

// Null (with the reason reported) when the worker cannot register; callers
// ASSERT on it.
std::unique_ptr<Worker> Connect(const TestCluster& cluster, uint32_t rank) {
  auto w = Worker::Create({.scheduler_address = cluster.scheduler_address(), .rank = rank});
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

// Workers 0 and 1 of `cluster`, both having defined tensor "w" of `n`
// floats; false (with the reason reported) when either step fails.
bool ConnectTwoWithTensor(const TestCluster& cluster, int64_t n, std::unique_ptr<Worker>& w0,
                          std::unique_ptr<Worker>& w1) {
  std::thread t([&] { w1 = Connect(cluster, 1); });
  w0 = Connect(cluster, 0);
  t.join();
  if (!w0 || !w1) return false;
  absl::Status s1;
  std::thread d([&] { s1 = w1->DefineTensors({Tensor("w", n)}); });
  absl::Status s0 = w0->DefineTensors({Tensor("w", n)});
  d.join();
  EXPECT_TRUE(s0.ok() && s1.ok()) << s0 << "; " << s1;
  return s0.ok() && s1.ok();
}

TEST(ClusterTest, TensorSplitAcrossServersIsReassembled) {
  auto cluster = TestCluster::Start(Config(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  ASSERT_NE(worker, nullptr);
  const int n = 1001;  // 4 partitions of ~1 KiB over 2 servers, odd size
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", n), Tensor("b", 3)}).ok());
  std::vector<float> init(n), grad(n), out(n);
  for (int i = 0; i < n; ++i) {
    init[i] = i;
    grad[i] = 2.0f * i;
  }
  ASSERT_TRUE(worker->InitTensor("w", init, absl::Seconds(10)).ok());
  auto h = worker->PushPull("w", grad, absl::MakeSpan(out));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(worker->Wait(*h, absl::Seconds(10)).ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], init[i] - 0.5f * grad[i]) << i;  // w - lr * g
  EXPECT_EQ(worker->stats().bytes_pulled, n * 4u);
}

// One server, one 4096-float partition, sum-only Adam (lr 0.01) frozen after
// `raw_rounds` uncompressed rounds, then `codec` pushes (1-bit Adam).
ClusterConfig FrozenAdamConfig(int workers, const std::string& codec, int raw_rounds) {
  ClusterConfig config = Config(1, workers);
  config.set_partition_bytes(64 * 1024);
  config.set_update_mode(SUM_ONLY);
  config.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  config.mutable_optimizer()->set_learning_rate(0.01f);
  config.mutable_optimizer()->set_freeze_variance_after(raw_rounds);
  config.mutable_compression()->set_codec(codec);
  config.mutable_compression()->set_uncompressed_rounds(raw_rounds);
  return config;
}

// Sum-only, Adam frozen after round 0, onebit pushes from round 1 on: the
// worker compresses its momentum in units of d (the frozen divisor), so a
// sign codec carries gradients spanning five orders of magnitude with no loss
// worth the name, and the step equals frozen Adam's. In gradient units onebit
// would send +-mean|g| for every weight.
// One worker on a fresh cluster for `config` pushes `grad` (one partition)
// in two PushPull rounds from zero weights. Fills the weights it ends with,
// the reference optimizer's on the same gradients, and the worker's stats.
void TwoRoundsOfOneWorker(const ClusterConfig& config, const std::vector<float>& grad, std::vector<float>* weights,
                          std::vector<float>* want, WorkerStats* stats) {
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Connect(**cluster, 0);
  const size_t n = grad.size();
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", n)}).ok());
  weights->assign(n, 0.0f);
  want->assign(n, 0.0f);
  std::vector<float> state(2 * n, 0.0f);
  ASSERT_TRUE(worker->InitTensor("w", *weights, absl::Seconds(10)).ok());
  auto reference = Optimizer::Create(config.optimizer());
  ASSERT_TRUE(reference.ok());
  for (uint64_t round = 0; round < 2; ++round) {
    auto h = worker->PushPull("w", grad, absl::MakeSpan(*weights));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(worker->Wait(*h, absl::Seconds(10)).ok());
    (*reference)->Apply(round, 1.0f, grad.data(), want->data(), state.data(), n);
  }
  *stats = worker->stats();
}

TEST(ClusterTest, SumOnlyFrozenAdamCompressesInPreconditionedUnits) {
  const int n = 4096;  // one partition, above onebit's minimum size
  std::vector<float> grad(n), weights, want;
  for (int i = 0; i < n; ++i) grad[i] = (i % 2 ? -1.0f : 1.0f) * std::pow(10.0f, -static_cast<float>(i % 6));
  WorkerStats stats;
  ASSERT_NO_FATAL_FAILURE(TwoRoundsOfOneWorker(FrozenAdamConfig(1, "onebit", 1), grad, &weights, &want, &stats));
  EXPECT_LT(stats.bytes_pushed, 2 * n * 4u + n / 8 + 64);  // INIT and round 0 raw, round 1 onebit
  for (int i = 0; i < n; ++i) ASSERT_NEAR(weights[i], want[i], 1e-5) << i << " (gradient " << grad[i] << ")";
}

// Warm-up rounds in fp16 both ways (compression.warmup_codec): worker and
// server agree on every round's codec, the sum-only aggregate comes back in
// fp16 too, at half the raw bytes, and gradients fp16 holds exactly train
// exactly as raw ones would.
TEST(ClusterTest, WarmupRoundsTravelInFp16BothWays) {
  ClusterConfig config = FrozenAdamConfig(1, "onebit", 2);
  config.mutable_compression()->set_pull_codec("onebit");
  config.mutable_compression()->set_warmup_codec("fp16");
  const int n = 4096;
  std::vector<float> grad(n), weights, want;
  for (int i = 0; i < n; ++i) grad[i] = (i % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f, -(i % 12));
  WorkerStats stats;
  ASSERT_NO_FATAL_FAILURE(TwoRoundsOfOneWorker(config, grad, &weights, &want, &stats));
  EXPECT_EQ(stats.bytes_pushed, n * 4u + 2 * n * 2u);  // INIT raw, then two fp16 rounds
  EXPECT_EQ(stats.bytes_pulled, 2 * n * 2u);
  for (int i = 0; i < n; ++i) ASSERT_EQ(weights[i], want[i]) << i;
}

// Two workers, fp16 (nearly exact) momenta for four rounds after the freeze,
// gradients that change every round and one weight that never gets any:
// every worker's weights follow Adam applied to the mean gradient. A wrong
// 1/W, a stale momentum or a bias correction one round off are far outside
// the tolerance.
TEST(ClusterTest, SumOnlyFrozenAdamMomentaOfTwoWorkersFollowAdamOnTheMean) {
  ClusterConfig config = FrozenAdamConfig(2, "fp16", 2);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Worker> workers[2];
  std::thread second([&] { workers[1] = Connect(**cluster, 1); });
  workers[0] = Connect(**cluster, 0);
  second.join();
  ASSERT_NE(workers[0], nullptr);
  ASSERT_NE(workers[1], nullptr);
  const int n = 4096, blank = 5;
  std::thread define([&] { ASSERT_TRUE(workers[1]->DefineTensors({Tensor("w", n)}).ok()); });
  ASSERT_TRUE(workers[0]->DefineTensors({Tensor("w", n)}).ok());
  define.join();
  std::vector<float> weights[2] = {std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  ASSERT_TRUE(workers[0]->InitTensor("w", weights[0], absl::Seconds(10)).ok());
  std::vector<float> want(n, 0.0f), state(2 * n, 0.0f), sum(n);
  auto reference = Optimizer::Create(config.optimizer());
  ASSERT_TRUE(reference.ok());
  for (uint64_t round = 0; round < 6; ++round) {
    std::vector<float> grad[2] = {std::vector<float>(n), std::vector<float>(n)};
    for (int i = 0; i < n; ++i) {
      const float size = std::pow(10.0f, -static_cast<float>(i % 4)) * (1.0f + 0.3f * round);
      grad[0][i] = i == blank ? 0.0f : size * std::sin(0.1f * i + round);
      // Same sign, other size: each worker's momentum in units of d stays
      // O(1), where fp16 rounds it finely (opposite signs would make d small
      // against one worker's gradient and fp16's relative error large).
      grad[1][i] = grad[0][i] * (0.5f + 0.4f * std::cos(0.7f * i - round));
      sum[i] = grad[0][i] + grad[1][i];
    }
    absl::Status status[2];
    auto step = [&](int w) {
      auto h = workers[w]->PushPull("w", grad[w], absl::MakeSpan(weights[w]));
      status[w] = h.ok() ? workers[w]->Wait(*h, absl::Seconds(10)) : h.status();
    };
    std::thread other(step, 1);
    step(0);
    other.join();
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    (*reference)->Apply(round, 0.5f, sum.data(), want.data(), state.data(), n);
  }
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(weights[w][blank], 0.0f);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(weights[w][i], want[i], 2e-4) << "worker " << w << " weight " << i;
  }
}

TEST(ClusterTest, PerPartitionPushPullMatchesWholeTensor) {
  auto cluster = TestCluster::Start(Config(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", 700)}).ok());
  auto parts = worker->Partitions("w");
  ASSERT_TRUE(parts.ok());
  ASSERT_GT(parts->size(), 1u);
  std::vector<float> grad(700, 1.0f), out(700, 0.0f);
  for (int round = 0; round < 2; ++round) {
    std::vector<Worker::Handle> handles;
    for (size_t i = 0; i < parts->size(); ++i) {
      const auto& e = (*parts)[i];
      auto h = worker->PushPullPartition("w", i, absl::MakeConstSpan(grad).subspan(e.offset, e.num_elements),
                                         absl::MakeSpan(out).subspan(e.offset, e.num_elements));
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    for (auto h : handles) ASSERT_TRUE(worker->Wait(h, absl::Seconds(10)).ok());
  }
  // Then a whole-tensor call continues at round 2 on every partition.
  auto h = worker->PushPull("w", grad, absl::MakeSpan(out));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(worker->Wait(*h, absl::Seconds(10)).ok());
  EXPECT_EQ(out, std::vector<float>(700, -1.5f));  // three SGD steps of 0.5
  EXPECT_FALSE(worker->PushPullPartition("w", parts->size(), grad, absl::MakeSpan(out)).ok());
}

// Several threads share one worker: whichever thread waits drains answers
// for all of them, and every thread sees its own results.
TEST(ClusterTest, ThreadsSharingAWorkerEachGetTheirAnswers) {
  auto cluster = TestCluster::Start(Config(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  constexpr int kThreads = 4, kRounds = 100, kN = 777;
  std::vector<TensorSpec> specs;
  for (int t = 0; t < kThreads; ++t) specs.push_back(Tensor("t" + std::to_string(t), kN));
  ASSERT_TRUE(worker->DefineTensors(specs).ok());
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> outs(kThreads, std::vector<float>(kN));
  std::vector<absl::Status> status(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> grad(kN, static_cast<float>(t + 1));
      for (int r = 0; r < kRounds && status[t].ok(); ++r) {
        auto h = worker->PushPull("t" + std::to_string(t), grad, absl::MakeSpan(outs[t]));
        status[t] = h.ok() ? worker->Wait(*h, absl::Seconds(20)) : h.status();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(status[t].ok()) << "thread " << t << ": " << status[t];
    // SGD lr 0.5 for kRounds rounds of gradient t+1.
    EXPECT_FLOAT_EQ(outs[t][kN - 1], -0.5f * (t + 1) * kRounds) << "thread " << t;
  }
}

TEST(ClusterTest, SyncRoundWaitsForEveryWorker) {
  auto cluster = TestCluster::Start(Config(2, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Worker> w0, w1;
  ASSERT_TRUE(ConnectTwoWithTensor(**cluster, 600, w0, w1));
  std::vector<float> g0(600, 1.0f), g1(600, 3.0f), out0(600), out1(600);
  auto h0 = w0->PushPull("w", g0, absl::MakeSpan(out0));
  ASSERT_TRUE(h0.ok());
  // Worker 1 has not pushed: the round cannot complete.
  EXPECT_EQ(w0->Wait(*h0, absl::Milliseconds(300)).code(), absl::StatusCode::kDeadlineExceeded);
  auto h0b = w0->Pull("w", absl::MakeSpan(out0));
  auto h1 = w1->PushPull("w", g1, absl::MakeSpan(out1));
  ASSERT_TRUE(h0b.ok() && h1.ok());
  ASSERT_TRUE(w1->Wait(*h1, absl::Seconds(10)).ok());
  ASSERT_TRUE(w0->Wait(*h0b, absl::Seconds(10)).ok());
  EXPECT_EQ(out1[0], -0.5f * 2.0f);  // mean gradient 2, lr 0.5
  EXPECT_EQ(out0, out1);
}

TEST(ClusterTest, ErrorsNameTheTensorAndSizes) {
  auto cluster = TestCluster::Start(Config(1, 1));
  ASSERT_TRUE(cluster.ok());
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", 10)}).ok());
  std::vector<float> wrong(11);
  EXPECT_THAT(worker->Push("w", wrong).status().message(), HasSubstr("gradient has 11 elements, expected 10"));
  EXPECT_THAT(worker->Push("nope", wrong).status().message(), HasSubstr("unknown tensor 'nope'"));
  EXPECT_EQ(worker->Wait(12345, absl::Seconds(1)).code(), absl::StatusCode::kInvalidArgument);
}

// Names travel in protobuf strings: one that is not UTF-8 made protobuf drop
// the request with no word of which field. The worker names it instead, and
// the definition can be made again.
TEST(ClusterTest, NamesThatAreNotUtf8OrTooLongAreRefusedByTheWorkerNamingThem) {
  auto cluster = TestCluster::Start(Config(1, 1));
  ASSERT_TRUE(cluster.ok());
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  absl::Status s = worker->DefineTensors({Tensor("w\xff", 10)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor name 'w\\xff' is not UTF-8 (byte 1"));
  TensorSpec coded = Tensor("w", 10);
  coded.set_codec(std::string(5000, 'x'));
  s = worker->DefineTensors({coded});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("codec of tensor 'w' 'xxxx"));
  EXPECT_THAT(s.message(), HasSubstr("is 5000 bytes long; at most 4096"));
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", 10)}).ok());
  s = worker->Barrier("b\xc0\xaf", nullptr, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("barrier name 'b\\xc0\\xaf' is not UTF-8 (byte 1"));
}

TEST(ClusterTest, WorkerWithNoSchedulerFailsWithinItsDeadline) {
  const absl::Time start = absl::Now();
  auto w = Worker::Create({.scheduler_address = "127.0.0.1:1", .rank = 0, .rendezvous_timeout = absl::Seconds(1)});
  ASSERT_FALSE(w.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(w.status().message(), HasSubstr("scheduler 127.0.0.1:1"));
  EXPECT_THAT(w.status().message(), HasSubstr("registering worker rank 0"));
}

TEST(ClusterTest, RendezvousTimeoutNamesTheMissingRank) {
  ClusterConfig config = Config(1, 2);
  config.set_rendezvous_timeout_ms(1000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok());
  auto w = Worker::Create({.scheduler_address = (*cluster)->scheduler_address(), .rank = 0,
                           .rendezvous_timeout = absl::Seconds(10)});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(w.status().message(), HasSubstr("missing worker ranks: 1"));
}

TEST(ClusterTest, ServerDrainsAndExitsCleanlyOnSigterm) {
  auto cluster = TestCluster::Start(Config(1, 1));
  ASSERT_TRUE(cluster.ok());
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", 100)}).ok());
  std::vector<float> g(100, 1.0f), out(100);
  auto h = worker->PushPull("w", g, absl::MakeSpan(out));
  ASSERT_TRUE(worker->Wait(*h, absl::Seconds(10)).ok());
  EXPECT_EQ((*cluster)->StopServer(0), 0);
}

TEST(ClusterTest, AServerStoppedWithSigtermIsFailedOverAtOnceAndWhatItHeldCompletes) {
  // Heartbeats that would take two minutes to time out: within the test only
  // the stopped server's own word can fail it over.
  ClusterConfig config = Config(3, 2);
  config.set_heartbeat_timeout_ms(120000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Worker> w0, w1;
  const int n = 3000;  // 12 partitions over 3 servers, 2 copies each
  ASSERT_TRUE(ConnectTwoWithTensor(**cluster, n, w0, w1));
  std::vector<float> g0(n, 1.0f), g1(n, 3.0f), out0(n), out1(n);
  // Worker 1 has not pushed: every server holds worker 0's request.
  auto h0 = w0->PushPull("w", g0, absl::MakeSpan(out0));
  ASSERT_TRUE(h0.ok());
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time stopped = absl::Now();
  ASSERT_EQ((*cluster)->StopServer(0), 0);
  auto h1 = w1->PushPull("w", g1, absl::MakeSpan(out1));
  ASSERT_TRUE(h1.ok());
  ASSERT_TRUE(w1->Wait(*h1, absl::Seconds(20)).ok());
  absl::Status s0 = w0->Wait(*h0, absl::Seconds(20));
  ASSERT_TRUE(s0.ok()) << s0;  // not "server 0 is shutting down"
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(30));
  EXPECT_EQ(out1[0], -0.5f * 2.0f);  // mean gradient 2, lr 0.5
  EXPECT_EQ(out0, out1);
}

// A replication-1 job of 3 servers started with --drain-on-stop 60 and
// heartbeats that would take two minutes to time out (nothing fails over),
// in which two workers train kRounds rounds of a 3000-float tensor (12
// partitions) with gradients 1 and 3, 25 ms apart.
class DrainOnStopJob {
 public:
  static constexpr int kRounds = 40;
  static constexpr int kN = 3000;

  void Start() {
    ClusterConfig config = Config(3, 2);
    config.set_replication(1);
    config.set_heartbeat_interval_ms(100);
    config.set_heartbeat_timeout_ms(120000);
    auto cluster = TestCluster::Start(config, {"--drain-on-stop", "60"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(ConnectTwoWithTensor(*cluster_, kN, w0_, w1_));
    t0_ = std::thread([this] { Train(*w0_, 1.0f, out0_); });
    t1_ = std::thread([this] { Train(*w1_, 3.0f, out1_); });
    while (rounds_done_.load() < 5) absl::SleepFor(absl::Milliseconds(5));
  }

  // Once the workers are done: every weight took every round once, and
  // exactly `servers_left` servers left, holding no partition.
  void ExpectEveryRoundAndServersLeft(size_t servers_left) {
    t0_.join();
    t1_.join();
    // Each round adds -0.5 * mean(1, 3) = -1 to every weight: exact in floats.
    EXPECT_EQ(out0_, std::vector<float>(kN, -static_cast<float>(kRounds)));
    EXPECT_EQ(out1_, out0_);
    auto client = SchedulerClient::Create(cluster_->scheduler_address());
    ASSERT_TRUE(client.ok());
    auto status = (*client)->Status(absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << status.status();
    // Servers register in any order: the stopped process's index is the one
    // listed as left.
    std::vector<uint32_t> left;
    for (const NodeStatus& node : status->nodes()) {
      if (node.role() == SERVER && node.left()) left.push_back(node.rank());
    }
    ASSERT_EQ(left.size(), servers_left) << status->ShortDebugString();
    for (const PartitionInfo& p : status->shard_map().partitions()) {
      for (uint32_t l : left) {
        EXPECT_NE(p.server(), l) << p.ShortDebugString();
        EXPECT_THAT(p.backups(), Not(::testing::Contains(l))) << p.ShortDebugString();
      }
    }
  }

  TestCluster& cluster() { return *cluster_; }
  int rounds_done() const { return rounds_done_.load(); }

 private:
  void Train(Worker& w, float grad, std::vector<float>& out) {
    std::vector<float> g(kN, grad);
    for (int r = 0; r < kRounds; ++r) {
      auto h = w.PushPull("w", g, absl::MakeSpan(out));
      ASSERT_TRUE(h.ok()) << h.status();
      absl::Status s = w.Wait(*h, absl::Seconds(30));
      ASSERT_TRUE(s.ok()) << "round " << r << ": " << s;
      if (grad == 1.0f) rounds_done_.fetch_add(1);
      absl::SleepFor(absl::Milliseconds(25));
    }
  }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Worker> w0_, w1_;
  std::vector<float> out0_ = std::vector<float>(kN), out1_ = std::vector<float>(kN);
  std::atomic<int> rounds_done_{0};
  std::thread t0_, t1_;
};

TEST(ClusterTest, AServerStoppedWithDrainOnStopHandsItsPartitionsOnAndNoUpdateIsLostOrDoubled) {
  // Replication 1: without the drain, the stopped server's partitions
  // would have no copy left. With --drain-on-stop its primaries are copied
  // to the others and handed off while both workers train, then it leaves.
  DrainOnStopJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start());
  const int code = job.cluster().StopServer(2, absl::Seconds(60));
  const int stopped_at = job.rounds_done();
  job.ExpectEveryRoundAndServersLeft(1);
  EXPECT_EQ(code, 0);
  EXPECT_LT(stopped_at, DrainOnStopJob::kRounds) << "the drain outlasted the training: nothing was handed on while it ran";
}

TEST(ClusterTest, ACancelledDrainUndoesItsMovesAndItsServerServesOnWithNoUpdateLostOrDoubled) {
  // `shardps drain --cancel` as soon as the scheduler plans server 2's
  // moves (replication 1: each an extra copy of a primary, synced, then
  // handed off): the moves not yet handing off are undone, their extra
  // copies dropped while the workers train, and server 2 serves on.
  DrainOnStopJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start());
  auto client = SchedulerClient::Create(job.cluster().scheduler_address());
  ASSERT_TRUE(client.ok()) << client.status();
  DrainRequest request;
  request.set_server(2);
  auto drain = (*client)->Drain(request, absl::Seconds(5));
  ASSERT_TRUE(drain.ok()) << drain.status();
  ShardMap planned;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (planned.moves().empty() && absl::Now() < deadline) {
    auto status = (*client)->Status(absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << status.status();
    planned = status->shard_map();
  }
  ASSERT_THAT(planned.moves(), Not(IsEmpty())) << "no move planned for the drain";
  request.set_cancel(true);
  auto cancel = (*client)->Drain(request, absl::Seconds(5));
  ASSERT_TRUE(cancel.ok()) << cancel.status();
  EXPECT_GT(cancel->copies(), 0u);
  auto cancelled = (*client)->Status(absl::Seconds(5));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  // (Which moves were undone depends on how far each had got: a hand-off
  // under way finishes. The scheduler's unit tests pin that down.)
  EXPECT_FALSE(cancelled->shard_map().servers(2).draining());
  job.ExpectEveryRoundAndServersLeft(0);
}

TEST(ClusterTest, ADrainOnStopServerStoppedWhileTheSchedulerRestartsDrainsOnceItIsBack) {
  // The scheduler is down (a restart) when server 2 gets SIGTERM: it cannot
  // ask for its drain yet, so it serves on and asks again until the
  // scheduler is back, instead of stopping at once without it (which would
  // lose its partitions, and end the workers' jobs).
  DrainOnStopJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start());
  job.cluster().KillScheduler();
  int code = -1;
  std::thread stop([&] { code = job.cluster().StopServer(2, absl::Seconds(60)); });
  absl::SleepFor(absl::Seconds(1));
  EXPECT_TRUE(job.cluster().RestartScheduler().ok());
  stop.join();
  job.ExpectEveryRoundAndServersLeft(1);
  EXPECT_EQ(code, 0);
}

TEST(ClusterTest, ADrainOnStopServerWhoseSchedulerHangsServesBetweenItsAsks) {
  // A scheduler that does not answer (stopped, or a host gone without a
  // reset) makes each ask for the drain wait its whole second on the engine
  // thread; between two asks the server serves, so training goes on.
  DrainOnStopJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_EQ(kill(job.cluster().scheduler_pid(), SIGSTOP), 0);
  int code = -1;
  std::thread stop([&] { code = job.cluster().StopServer(2, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(500));
  const int before = job.rounds_done();
  absl::SleepFor(absl::Seconds(4));
  const int trained = job.rounds_done() - before;
  ASSERT_EQ(kill(job.cluster().scheduler_pid(), SIGCONT), 0);
  stop.join();
  EXPECT_TRUE(trained >= 10 || job.rounds_done() == DrainOnStopJob::kRounds)
      << trained << " rounds in 4 s while the server asked for its drain";
  job.ExpectEveryRoundAndServersLeft(1);
  EXPECT_EQ(code, 0);
}

TEST(ClusterTest, ADrainOnStopServerWhoseSchedulerStaysAwayStopsAfterTheHeartbeatTimeoutNotTheDrains) {
  // The whole job torn down: the scheduler is gone for good. The server asks
  // for its drain for as long as nodes wait for a scheduler (2 s here), not
  // for --drain-on-stop's 60 s, then stops.
  ClusterConfig config = Config(2, 1);
  config.set_heartbeat_interval_ms(100);
  config.set_heartbeat_timeout_ms(2000);
  auto cluster = TestCluster::Start(config, {"--drain-on-stop", "60"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->ServerAddresses().ok());
  (*cluster)->KillScheduler();
  const absl::Time start = absl::Now();
  EXPECT_EQ((*cluster)->StopServer(0, absl::Seconds(60)), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// chaos16: a server paused (SIGSTOP) past the heartbeat timeout, then resumed,
// had been failed over and was fenced by the epoch, but lingered: serving
// nothing, holding its address, never joining again. Told by the scheduler
// that it was declared dead, it stops by itself (exit 1, saying why), so a
// supervisor starts it again as a new server.
TEST(ClusterTest, AServerResumedAfterItWasDeclaredDeadStopsByItself) {
  ClusterConfig config = Config(3, 2);
  config.set_heartbeat_interval_ms(100);
  config.set_heartbeat_timeout_ms(1000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Worker> w0, w1;
  ASSERT_TRUE(ConnectTwoWithTensor(**cluster, 3000, w0, w1));
  const pid_t paused = (*cluster)->server_pid(1);
  ASSERT_EQ(kill(paused, SIGSTOP), 0);
  auto client = SchedulerClient::Create((*cluster)->scheduler_address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto a_server_dead = [&] {
    auto status = (*client)->Status(absl::Seconds(5));
    return status.ok() && absl::c_any_of(status->shard_map().servers(), [](const ServerInfo& s) { return s.dead(); });
  };
  for (int t = 0; t < 200 && !a_server_dead(); ++t) absl::SleepFor(absl::Milliseconds(50));
  const bool declared = a_server_dead();
  ASSERT_EQ(kill(paused, SIGCONT), 0);
  ASSERT_TRUE(declared) << "the paused server was never declared dead";

  std::optional<int> code = (*cluster)->WaitForServerExit(1, absl::Seconds(10));
  ASSERT_TRUE(code.has_value()) << "the server declared dead still runs 10 s after it was resumed";
  EXPECT_EQ(*code, 1);
}

// A 3-server job (replication 2) started with --drain-on-stop 60 whose two
// workers defined a 3000-float tensor; server process 1 is frozen (SIGSTOP),
// so a drain's moves cannot start (they wait for every live server to serve
// the drain's epoch), and server process 2 gets SIGTERM: it asks for its
// drain, which the scheduler accepts.
class StalledDrainOnStop {
 public:
  void Start(int heartbeat_timeout_ms) {
    ClusterConfig config = Config(3, 2);
    config.set_heartbeat_interval_ms(100);
    config.set_heartbeat_timeout_ms(heartbeat_timeout_ms);
    auto cluster = TestCluster::Start(config, {"--drain-on-stop", "60"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(ConnectTwoWithTensor(*cluster_, 3000, w0_, w1_));
    ASSERT_EQ(kill(cluster_->server_pid(1), SIGSTOP), 0);
    stopped_ = absl::Now();
    stop_ = std::thread([this] { code_ = cluster_->StopServer(2, absl::Seconds(60)); });
    auto client = SchedulerClient::Create(cluster_->scheduler_address());
    ASSERT_TRUE(client.ok());
    for (int t = 0; t < 100 && !AServerDrains(**client); ++t) absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(AServerDrains(**client)) << "the SIGTERMed server did not ask for its drain";
  }
  // The workers leave: the job is over.
  void EndTheJob() {
    w0_.reset();
    w1_.reset();
  }
  // How long server process 2 took to stop after its SIGTERM; its exit code.
  absl::Duration WaitForTheStop(int* code) {
    stop_.join();
    *code = code_;
    return absl::Now() - stopped_;
  }
  ~StalledDrainOnStop() {
    if (stop_.joinable()) stop_.join();
    if (cluster_) kill(cluster_->server_pid(1), SIGCONT);
  }

 private:
  static bool AServerDrains(SchedulerClient& client) {
    auto status = client.Status(absl::Seconds(5));
    if (!status.ok()) return false;
    for (const ServerInfo& s : status->shard_map().servers()) {
      if (s.draining()) return true;
    }
    return false;
  }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Worker> w0_, w1_;
  std::thread stop_;
  absl::Time stopped_;
  int code_ = -1;
};

TEST(ClusterTest, ADrainOnStopServerStopsOnceTheJobIsOverNotAfterTheDrainsTime) {
  // The whole job torn down while the drain waits (a deleted deployment):
  // nothing is left to hand its copies to, so it stops then.
  StalledDrainOnStop job;
  ASSERT_NO_FATAL_FAILURE(job.Start(120000));
  job.EndTheJob();
  int code = -1;
  EXPECT_LT(job.WaitForTheStop(&code), absl::Seconds(20));
  EXPECT_EQ(code, 0);
}

TEST(ClusterTest, ADrainOnStopServerWhoseDrainTheSchedulerEndsStopsThenNotAfterTheDrainsTime) {
  // The frozen server is declared dead: the drain would leave one server
  // for replication 2, so the scheduler ends it, and the copies would only
  // come back to the server that waits to stop.
  StalledDrainOnStop job;
  ASSERT_NO_FATAL_FAILURE(job.Start(2000));
  int code = -1;
  EXPECT_LT(job.WaitForTheStop(&code), absl::Seconds(20));
  EXPECT_EQ(code, 0);
}

TEST(ClusterTest, AServerStoppedWithSigtermWhileTheSchedulerIsDownLeavesWhatItHeldToTheFailover) {
  // The scheduler cannot be told, so nothing fails server 0 over now. Its
  // partitions have backups: it answers nothing (as a crashed server), and
  // once the scheduler is back and declares it dead, worker 0 re-sends what
  // it held to the new primaries instead of failing on "shutting down".
  ClusterConfig config = Config(2, 2);
  config.set_heartbeat_interval_ms(100);
  config.set_heartbeat_timeout_ms(2000);
  config.set_request_timeout_ms(60000);
  auto cluster = TestCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<Worker> w0, w1;
  const int n = 3000;
  ASSERT_TRUE(ConnectTwoWithTensor(**cluster, n, w0, w1));
  std::vector<float> g0(n, 1.0f), g1(n, 3.0f), out0(n), out1(n);
  auto h0 = w0->PushPull("w", g0, absl::MakeSpan(out0));  // held: worker 1 has not pushed
  ASSERT_TRUE(h0.ok());
  absl::SleepFor(absl::Milliseconds(300));
  (*cluster)->KillScheduler();
  ASSERT_EQ((*cluster)->StopServer(0), 0);
  ASSERT_TRUE((*cluster)->RestartScheduler().ok());
  auto h1 = w1->PushPull("w", g1, absl::MakeSpan(out1));
  ASSERT_TRUE(h1.ok());
  absl::Status s1 = w1->Wait(*h1, absl::Seconds(30));
  absl::Status s0 = w0->Wait(*h0, absl::Seconds(30));
  ASSERT_TRUE(s0.ok()) << s0;  // not "server 0 is shutting down"
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(out1[0], -0.5f * 2.0f);  // mean gradient 2, lr 0.5
  EXPECT_EQ(out0, out1);
}

TEST(ClusterTest, AMessageThatReachedAServerBeforeItRegisteredIsAnswered) {
  // Before 2026-11-25 a server bound its port with the usual config's socket
  // limits, registered, and bound it again with those of a config that has
  // its own (here partition_bytes 1024), dropping what had reached it in
  // between. Primaries send a server that takes a dead one's place its copies
  // as soon as it registered: the copies lost so were never confirmed and
  // their partitions completed no round again (`shardps local --servers 2
  // --replace --kill server:1@15 --set partition_bytes=16384`: 43 of 61
  // copies never arrived and the workers timed out).
  auto cluster = TestCluster::Start(Config(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Connect(**cluster, 0);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->DefineTensors({Tensor("w", 8)}).ok());  // the server below joins a running job
  (*cluster)->KillScheduler();
  auto port = FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string address = absl::StrCat("tcp://127.0.0.1:", *port);
  ASSERT_TRUE((*cluster)->AddServer({"--listen", address}).ok());
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 10000);
  socket.connect(address);
  DataHeader request;
  request.set_protocol_version(kProtocolVersion);
  request.set_op(PULL);
  request.set_partition_id(0);
  request.set_request_id(77);
  request.set_dtype(FLOAT32);
  request.set_num_elements(8);
  socket.send(zmq::buffer(request.SerializeAsString()), zmq::send_flags::none);
  absl::SleepFor(absl::Seconds(1));  // in the server's queue, unread while it waits for the scheduler
  ASSERT_TRUE((*cluster)->RestartScheduler().ok());
  zmq::message_t answer;
  ASSERT_TRUE(socket.recv(answer).has_value()) << "the request was dropped";
  DataHeader h;
  ASSERT_TRUE(h.ParseFromArray(answer.data(), answer.size()));
  EXPECT_EQ(h.request_id(), 77u) << h.ShortDebugString();
}

TEST(ClusterTest, CApiTrainsAStep) {
  auto cluster = TestCluster::Start(Config(1, 1));
  ASSERT_TRUE(cluster.ok());
  shardps_worker* w = nullptr;
  char err[256] = "";
  ASSERT_EQ(shardps_worker_create((*cluster)->scheduler_address().c_str(), 0, 10.0, &w, err, sizeof(err)), 0) << err;
  const int64_t shape[] = {2, 3};
  ASSERT_EQ(shardps_declare_tensor(w, "w", shape, 2, err, sizeof(err)), 0);
  ASSERT_EQ(shardps_define_done(w, err, sizeof(err)), 0) << err;
  float grad[6] = {1, 1, 1, 1, 1, 1}, out[6];
  uint64_t h;
  ASSERT_EQ(shardps_push_pull(w, "w", grad, out, 6, &h, err, sizeof(err)), 0) << err;
  ASSERT_EQ(shardps_wait(w, h, 10.0, err, sizeof(err)), 0) << err;
  EXPECT_EQ(out[5], -0.5f);
  EXPECT_NE(shardps_push(w, "w", grad, 5, &h, err, sizeof(err)), 0);
  EXPECT_THAT(std::string(err), HasSubstr("has 5 elements"));
  EXPECT_NE(shardps_pull(w, nullptr, out, 6, &h, err, sizeof(err)), 0);
  shardps_worker_destroy(w);
}

}  // namespace
}  // namespace shardps
