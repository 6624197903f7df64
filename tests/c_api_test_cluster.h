// Fixtures of the C ABI's tests against a real cluster
// (tests/c_api_cluster_test.cc, tests/c_api_misuse_test.cc).
#ifndef SHARDPS_TESTS_C_API_TEST_CLUSTER_H_
#define SHARDPS_TESTS_C_API_TEST_CLUSTER_H_

#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "worker/c_api.h"

namespace shardps {

// One worker of a job with 2 servers; partitions of 256 floats.
class CApiClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig config;
    config.set_num_servers(2);
    config.set_num_workers(1);
    config.set_consistency(ASYNC);
    config.set_partition_bytes(1024);
    config.mutable_optimizer()->set_learning_rate(0.5f);
    auto cluster = TestCluster::Start(config);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_EQ(shardps_worker_create(cluster_->scheduler_address().c_str(), 0, 20.0, &w_, err_, sizeof(err_)),
              SHARDPS_OK)
        << err_;
  }
  void TearDown() override { shardps_worker_destroy(w_); }

  std::unique_ptr<TestCluster> cluster_;
  shardps_worker* w_ = nullptr;
  char err_[256] = "";
};

// Sync SGD at `learning_rate`.
inline ClusterConfig SyncSgd(float learning_rate) {
  ClusterConfig config;
  config.set_consistency(SYNC);
  config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  config.mutable_optimizer()->set_learning_rate(learning_rate);
  return config;
}

// Two workers (ranks 0 and 1) of a cluster of one server running `config`.
class TwoWorkers {
 public:
  explicit TwoWorkers(ClusterConfig config) {
    config.set_num_servers(1);
    config.set_num_workers(2);
    auto cluster = TestCluster::Start(config);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return;
    cluster_ = *std::move(cluster);
    std::thread second([&] { Create(1); });
    Create(0);
    second.join();
  }
  ~TwoWorkers() {
    for (shardps_worker* x : w) shardps_worker_destroy(x);
  }
  bool ok() const { return w[0] != nullptr && w[1] != nullptr; }
  // Declares a float32 tensor of n elements on both and defines it.
  void Define(const char* name, int64_t n) {
    std::thread second([&] { DeclareAndDefine(1, name, n); });
    DeclareAndDefine(0, name, n);
    second.join();
  }

  shardps_worker* w[2] = {nullptr, nullptr};
  TestCluster& cluster() { return *cluster_; }

 private:
  void Create(uint32_t rank) {
    char err[256] = "";
    EXPECT_EQ(shardps_worker_create(cluster_->scheduler_address().c_str(), rank, 20.0, &w[rank], err, sizeof(err)),
              SHARDPS_OK)
        << err;
  }
  void DeclareAndDefine(int rank, const char* name, int64_t n) {
    char err[256] = "";
    EXPECT_EQ(shardps_declare_tensor(w[rank], name, &n, 1, err, sizeof(err)), SHARDPS_OK) << err;
    EXPECT_EQ(shardps_define_done(w[rank], err, sizeof(err)), SHARDPS_OK) << err;
  }

  std::unique_ptr<TestCluster> cluster_;
};

}  // namespace shardps

#endif  // SHARDPS_TESTS_C_API_TEST_CLUSTER_H_
