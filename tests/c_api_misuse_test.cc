// The C ABI used the way a careless or hostile caller would: every mistake
// must come back as a status naming what was wrong, never a crash, a hang or
// an abort of the host process. Run under ASan by
// `tools/test.sh --sanitize address -R CApi`.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/c_api_test_cluster.h"
#include "tests/sanitizer_slowdown.h"
#include "worker/c_api.h"

namespace shardps {
namespace {

using ::testing::HasSubstr;

// CApiClusterTest's worker, with tensor "w" defined on demand.
class CApiMisuseTest : public CApiClusterTest {
 protected:
  // Declares float32 "w" of n elements and defines it.
  void Define(int64_t n) {
    ASSERT_EQ(shardps_declare_tensor(w_, "w", &n, 1, err_, sizeof(err_)), SHARDPS_OK) << err_;
    ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  }
  std::string Err() const { return err_; }
  // In a forked child: exits 0 if a call with the parent's worker is refused
  // and its destroy (of the child's copy only, and a writer of the live set)
  // returns.
  [[noreturn]] void ChildIsRefusedTheParentsWorker() {
    char err[256] = "";
    uint32_t rank = 0;
    const int rc = shardps_rank(w_, &rank, err, sizeof(err));
    shardps_worker_destroy(w_);
    _exit(rc == SHARDPS_FAILED_PRECONDITION && std::strstr(err, "forked from it, cannot use it") ? 0 : 1);
  }
};

TEST_F(CApiMisuseTest, EveryNullPointerIsRefusedByName) {
  Define(8);
  float buf[8] = {};
  uint64_t h = 0;
  size_t count = 0;
  const int64_t shape[] = {8};
  EXPECT_EQ(shardps_worker_create(nullptr, 0, 1.0, &w_, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("scheduler_address"));
  EXPECT_EQ(shardps_worker_create("127.0.0.1:1", 0, 1.0, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_declare_tensor(w_, nullptr, shape, 1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_declare_tensor(w_, "x", nullptr, 1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done(nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done_timeout(nullptr, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_reset_declared(nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_init_tensor(w_, nullptr, buf, 8, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_init_tensor(w_, "w", nullptr, 8, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_barrier(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_barrier_timeout(nullptr, "b", 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  for (shardps_worker* w : {static_cast<shardps_worker*>(nullptr), w_}) {
    const char* name = w == nullptr ? "w" : nullptr;
    EXPECT_EQ(shardps_push(w, name, buf, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_pull(w, name, buf, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_skip_round(w, name, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_push_pull(w, name, buf, buf, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_push_pull_typed(w, name, buf, buf, 32, SHARDPS_FLOAT32, &h, err_, sizeof(err_)),
              SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_push_pull_mean_gradient(w, name, buf, buf, 8, &h, err_, sizeof(err_)),
              SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_push_pull_partition(w, name, 0, buf, buf, 8, &h, err_, sizeof(err_)),
              SHARDPS_INVALID_ARGUMENT);
    EXPECT_EQ(shardps_partitions(w, name, nullptr, 0, &count, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  }
  EXPECT_EQ(shardps_push(w_, "w", nullptr, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_push(w_, "w", buf, 8, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("handle"));
  EXPECT_EQ(shardps_pull(w_, "w", nullptr, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_push_pull_partition(w_, "w", 0, buf, nullptr, 8, &h, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait(nullptr, 1, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  size_t done = 0;
  EXPECT_EQ(shardps_wait_any(w_, nullptr, 2, 1.0, &done, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait_any(w_, nullptr, 0, 1.0, &done, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_partitions(w_, "w", nullptr, 8, &count, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_partitions(w_, "w", nullptr, 0, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  uint32_t u = 0;
  int i = 0;
  shardps_worker_stats stats;
  EXPECT_EQ(shardps_rank(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_world_size(nullptr, &u, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_num_servers(nullptr, &u, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_consistency(nullptr, &i, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_update_mode(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_rejoin_round(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_fail(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_fail(nullptr, "boom", err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_rejoin_passed_barrier(w_, nullptr, &i, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_rejoin_passed_barrier(w_, "init", nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_stats(w_, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_stats(nullptr, &stats, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_config_text(w_, nullptr, 1 << 20, &count, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_config_text(w_, nullptr, 0, nullptr, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  char field[8];
  EXPECT_EQ(shardps_config_field(w_, nullptr, field, sizeof(field), &count, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_config_field(w_, "consistency", nullptr, 1 << 20, &count, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_config_field(nullptr, "consistency", field, sizeof(field), &count, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  // No message buffer at all, or one of zero bytes: still a code.
  EXPECT_EQ(shardps_define_done(nullptr, nullptr, 0), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done(nullptr, err_, 0), SHARDPS_INVALID_ARGUMENT);
  shardps_worker_destroy(nullptr);
}

TEST_F(CApiMisuseTest, BadSizesAndUnknownTensorsAreRefusedByName) {
  Define(8);
  std::vector<float> buf(16);
  uint64_t h = 0;
  EXPECT_EQ(shardps_push(w_, "w", buf.data(), 4, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("'w'"));
  EXPECT_EQ(shardps_push(w_, "w", buf.data(), 0, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_pull(w_, "w", buf.data(), 16, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_push_pull(w_, "w", buf.data(), buf.data(), SIZE_MAX, &h, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_push(w_, "nope", buf.data(), 8, &h, err_, sizeof(err_)), SHARDPS_NOT_FOUND);
  EXPECT_THAT(Err(), HasSubstr("'nope'"));
  EXPECT_EQ(shardps_push_pull_typed(w_, "nope", buf.data(), buf.data(), 32, SHARDPS_FLOAT32, &h, err_,
                                    sizeof(err_)),
            SHARDPS_NOT_FOUND);
  EXPECT_EQ(shardps_push_pull_typed(w_, "w", buf.data(), buf.data(), 32, 99, &h, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_push_pull_partition(w_, "w", 5, buf.data(), buf.data(), 8, &h, err_, sizeof(err_)),
            SHARDPS_OUT_OF_RANGE);
  EXPECT_EQ(shardps_push_pull_partition(w_, "w", SIZE_MAX, buf.data(), buf.data(), 8, &h, err_, sizeof(err_)),
            SHARDPS_OUT_OF_RANGE);
  EXPECT_EQ(shardps_init_tensor(w_, "w", buf.data(), 3, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_init_tensor(w_, "nope", buf.data(), 8, 1.0, err_, sizeof(err_)), SHARDPS_NOT_FOUND);
  size_t count = 0;
  EXPECT_EQ(shardps_partitions(w_, "nope", nullptr, 0, &count, err_, sizeof(err_)), SHARDPS_NOT_FOUND);
}

TEST_F(CApiMisuseTest, UnknownAndSpentHandlesAreRefused) {
  Define(8);
  float grad[8] = {}, out[8] = {};
  uint64_t h = 0;
  EXPECT_EQ(shardps_wait(w_, 12345, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait(w_, 0, 0.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait(w_, UINT64_MAX, -1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  ASSERT_EQ(shardps_push_pull(w_, "w", grad, out, 8, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(shardps_wait(w_, h, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("already waited on"));
  // The same handle twice in one wait_any: the first completes it, nothing crashes.
  ASSERT_EQ(shardps_push_pull(w_, "w", grad, out, 8, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
  const uint64_t twice[] = {h, h};
  size_t done = 9;
  EXPECT_EQ(shardps_wait_any(w_, twice, 2, 10.0, &done, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_LT(done, 2u);
  EXPECT_EQ(shardps_wait_any(w_, twice, 2, 1.0, &done, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(done, 2u);
}

TEST_F(CApiMisuseTest, ZeroNegativeAndOddTimeoutsReturn) {
  Define(8);
  EXPECT_EQ(shardps_define_done_timeout(w_, 0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done_timeout(w_, -1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done_timeout(w_, std::nan(""), err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_barrier_timeout(w_, "b", -5, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  float grad[8] = {}, out[8] = {};
  for (double timeout : {0.0, -1.0, std::nan("")}) {
    uint64_t h = 0;
    ASSERT_EQ(shardps_push_pull(w_, "w", grad, out, 8, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
    const int rc = shardps_wait(w_, h, timeout, err_, sizeof(err_));
    EXPECT_TRUE(rc == SHARDPS_OK || rc == SHARDPS_DEADLINE_EXCEEDED) << timeout << ": " << rc << " " << err_;
  }
}

TEST_F(CApiMisuseTest, CallsBeforeDefineDoneAreRefused) {
  float buf[8] = {};
  uint64_t h = 0;
  size_t count = 0;
  EXPECT_EQ(shardps_push(w_, "w", buf, 8, &h, err_, sizeof(err_)), SHARDPS_FAILED_PRECONDITION);
  EXPECT_THAT(Err(), HasSubstr("before DefineTensors"));
  EXPECT_EQ(shardps_push_pull_partition(w_, "w", 0, buf, buf, 8, &h, err_, sizeof(err_)),
            SHARDPS_FAILED_PRECONDITION);
  EXPECT_EQ(shardps_init_tensor(w_, "w", buf, 8, 1.0, err_, sizeof(err_)), SHARDPS_FAILED_PRECONDITION);
  EXPECT_NE(shardps_partitions(w_, "w", nullptr, 0, &count, err_, sizeof(err_)), SHARDPS_OK);
  const int64_t shape[] = {8};
  ASSERT_EQ(shardps_declare_tensor(w_, "w", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  // Declared but not defined: typed push knows the dtype, the cluster does not know the tensor.
  EXPECT_NE(shardps_push_pull_typed(w_, "w", buf, buf, 32, SHARDPS_FLOAT32, &h, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_define_done(w_, nullptr, 0), SHARDPS_OK);
}

TEST_F(CApiMisuseTest, BadDeclarationsFailDefineDoneByName) {
  const int64_t negative[] = {-4}, huge[] = {int64_t{1} << 30, int64_t{1} << 30}, ok[] = {8};
  auto define_fails = [&](const char* name, const int64_t* shape, size_t ndim, const char* says) {
    ASSERT_EQ(shardps_reset_declared(w_, err_, sizeof(err_)), SHARDPS_OK);
    ASSERT_EQ(shardps_declare_tensor(w_, name, shape, ndim, err_, sizeof(err_)), SHARDPS_OK) << err_;
    EXPECT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT) << name;
    EXPECT_THAT(Err(), HasSubstr(says)) << name;
  };
  define_fails("neg", negative, 1, "dimension -4");
  define_fails("huge", huge, 2, "too large");
  define_fails("scalar", ok, 0, "no shape");
  define_fails("", ok, 1, "empty name");
  // The same name twice.
  ASSERT_EQ(shardps_reset_declared(w_, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor(w_, "d", ok, 1, err_, sizeof(err_)), SHARDPS_OK);
  ASSERT_EQ(shardps_declare_tensor(w_, "d", ok, 1, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("declared twice"));
}

TEST_F(CApiMisuseTest, TheLargestTensorAllowedIsRefusedBeforeAnyServerAllocatesIt) {
  const int64_t shape[] = {int64_t{1} << 40};
  ASSERT_EQ(shardps_declare_tensor(w_, "big", shape, 1, err_, sizeof(err_)), SHARDPS_OK);
  EXPECT_EQ(shardps_define_done_timeout(w_, 20.0, err_, sizeof(err_)), SHARDPS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(Err(), HasSubstr("max_model_bytes"));
  EXPECT_THAT(Err(), HasSubstr("'big'"));
}

TEST_F(CApiMisuseTest, ManyThreadsOnOneWorkerEachGetTheirAnswers) {
  Define(1000);
  constexpr int kThreads = 8, kRounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> grad(1000, 0.0f), out(1000);
      char err[256];
      for (int r = 0; r < kRounds; ++r) {
        uint64_t h[3];
        size_t done = 0;
        int rc = shardps_push_pull(w_, "w", grad.data(), out.data(), 1000, &h[0], err, sizeof(err));
        if (rc == SHARDPS_OK) rc = shardps_wait(w_, h[0], 30.0, err, sizeof(err));
        if (rc == SHARDPS_OK) rc = shardps_pull(w_, "w", out.data(), 1000, &h[1], err, sizeof(err));
        if (rc == SHARDPS_OK) rc = shardps_wait_any(w_, &h[1], 1, 30.0, &done, err, sizeof(err));
        if (rc != SHARDPS_OK) {
          ++failures;
          ADD_FAILURE() << "thread " << t << " round " << r << ": " << err;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(CApiMisuseTest, NonUtf8NamesAreRefusedWhenDeclaredNamingTheByte) {
  const int64_t shape[] = {8};
  const char bad[] = {'w', static_cast<char>(0xff), static_cast<char>(0xfe), 0};
  EXPECT_EQ(shardps_declare_tensor(w_, bad, shape, 1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("tensor name 'w\\xff\\xfe' is not UTF-8 (byte 1"));
  const char surrogate[] = {'s', static_cast<char>(0xed), static_cast<char>(0xa0), static_cast<char>(0x80), 0};
  EXPECT_EQ(shardps_declare_tensor(w_, surrogate, shape, 1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_declare_tensor_codec(w_, "c", shape, 1, SHARDPS_FLOAT32, bad, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("codec of tensor 'c'"));
  EXPECT_EQ(shardps_barrier_timeout(w_, bad, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("barrier name"));
  // Nothing was declared: the worker defines its tensors as if none of that happened.
  ASSERT_EQ(shardps_declare_tensor(w_, "\xc3\xa9t\xc3\xa9", shape, 1, err_, sizeof(err_)), SHARDPS_OK) << err_;
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
}

TEST_F(CApiMisuseTest, OverlongNamesAreRefusedWhenDeclared) {
  const int64_t shape[] = {8};
  const std::string name(8 << 20, 'n');
  EXPECT_EQ(shardps_declare_tensor(w_, name.c_str(), shape, 1, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("is 8388608 bytes long; at most 4096"));
  EXPECT_EQ(shardps_barrier(w_, name.c_str(), err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  Define(8);
}

TEST_F(CApiMisuseTest, CallsOnADestroyedWorkerAreRefused) {
  Define(8);
  shardps_worker* gone = w_;
  shardps_worker_destroy(gone);
  w_ = nullptr;
  shardps_worker_destroy(gone);  // twice: ignored
  float buf[8] = {};
  uint64_t h = 0;
  uint32_t rank = 0;
  EXPECT_EQ(shardps_rank(gone, &rank, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(Err(), HasSubstr("shardps_rank: worker 0x"));
  EXPECT_THAT(Err(), HasSubstr("is not a live worker"));
  EXPECT_EQ(shardps_push_pull(gone, "w", buf, buf, 8, &h, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_wait(gone, 1, 1.0, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_define_done(gone, err_, sizeof(err_)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_EQ(shardps_declare_tensor(reinterpret_cast<shardps_worker*>(buf), "w", nullptr, 0, err_, sizeof(err_)),
            SHARDPS_INVALID_ARGUMENT)
      << "a pointer that never was a worker";
}

TEST_F(CApiMisuseTest, AForkedChildIsRefusedTheParentsWorkerAndLeavesItAlone) {
  Define(8);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) ChildIsRefusedTheParentsWorker();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  float grad[8] = {}, out[8] = {};
  uint64_t h = 0;
  ASSERT_EQ(shardps_push_pull(w_, "w", grad, out, 8, &h, err_, sizeof(err_)), SHARDPS_OK) << err_;
  EXPECT_EQ(shardps_wait(w_, h, 10.0, err_, sizeof(err_)), SHARDPS_OK) << err_;
}

// The live set's lock, held by another thread at the moment of a fork, stayed
// held in the child for good: the child's destroy of the parent's worker (or
// any call, had that thread been adding or removing) waited forever. Two
// threads take it all the time, as a reader (a call) and as a writer (a
// destroy); every child must still be refused at once and leave.
TEST_F(CApiMisuseTest, ForksWhileOtherThreadsUseTheLibraryLeaveNoChildStuck) {
  Define(8);
  // The destroys below each log a warning (not a live worker): thousands.
  const int min_log_level = FLAGS_minloglevel;
  FLAGS_minloglevel = google::GLOG_ERROR;
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  busy.emplace_back([&] {
    uint32_t rank;
    char err[128];
    while (!stop.load()) shardps_rank(w_, &rank, err, sizeof(err));
  });
  busy.emplace_back([&] {
    int not_a_worker;
    while (!stop.load()) shardps_worker_destroy(reinterpret_cast<shardps_worker*>(&not_a_worker));
  });
  int stuck = 0, refused = 0;
  for (int i = 0; i < 100; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) ChildIsRefusedTheParentsWorker();
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10 * kTestSlowdown);
    pid_t r;
    while ((r = waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (r == 0) {
      ++stuck;
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
    } else {
      refused += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
  }
  stop = true;
  for (std::thread& t : busy) t.join();
  FLAGS_minloglevel = min_log_level;
  EXPECT_EQ(stuck, 0) << "children that did not exit within 10 s";
  EXPECT_EQ(refused, 100);
}

TEST(CApiDestroyTest, DestroyWhileAnotherThreadWaitsLetsTheWaitReturn) {
  TwoWorkers job(SyncSgd(0.5f));
  ASSERT_TRUE(job.ok());
  job.Define("w", 4);
  char err[256] = "";
  float grad[4] = {1, 1, 1, 1}, out[4] = {};
  uint64_t h = 0;
  // Sync: rank 0's round cannot complete while rank 1 does not push.
  ASSERT_EQ(shardps_push_pull(job.w[0], "w", grad, out, 4, &h, err, sizeof(err)), SHARDPS_OK) << err;
  std::atomic<int> rc{-1};
  std::thread waiter([&] { rc = shardps_wait(job.w[0], h, 2.0, err, sizeof(err)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  shardps_worker_destroy(job.w[0]);
  waiter.join();
  job.w[0] = nullptr;
  EXPECT_EQ(rc.load(), SHARDPS_DEADLINE_EXCEEDED) << err;
}

TEST_F(CApiMisuseTest, ManyThreadsDeclaringAtOnceDeclareEveryTensor) {
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t shape[] = {4};
      char err[256];
      for (int i = 0; i < 50; ++i) {
        const std::string name = "t" + std::to_string(t) + "." + std::to_string(i);
        EXPECT_EQ(shardps_declare_tensor(w_, name.c_str(), shape, 1, err, sizeof(err)), SHARDPS_OK) << err;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(shardps_define_done(w_, err_, sizeof(err_)), SHARDPS_OK) << err_;
  size_t count = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(shardps_partitions(w_, ("t" + std::to_string(t) + ".49").c_str(), nullptr, 0, &count, err_,
                                 sizeof(err_)),
              SHARDPS_OUT_OF_RANGE)
        << err_;
    EXPECT_EQ(count, 1u);
  }
}

TEST(CApiWaitTest, TwoThreadsWaitingOnOneHandleGetOneAnswerAndOneRefusal) {
  // Before the refusal, the thread that completed the handle freed the state
  // the other was still reading (the process died of SIGILL).
  TwoWorkers job(SyncSgd(0.5f));
  ASSERT_TRUE(job.ok());
  job.Define("w", 4);
  float grad[4] = {1, 1, 1, 1}, out0[4] = {}, out1[4] = {};
  uint64_t h0 = 0, h1 = 0;
  char err[256] = "";
  // Sync: rank 0's round completes once rank 1 pushes, while both threads wait on it.
  ASSERT_EQ(shardps_push_pull(job.w[0], "w", grad, out0, 4, &h0, err, sizeof(err)), SHARDPS_OK) << err;
  int rc[2] = {-1, -1};
  char why[2][256] = {"", ""};
  std::thread a([&] { rc[0] = shardps_wait(job.w[0], h0, 10.0, why[0], sizeof(why[0])); });
  std::thread b([&] {
    size_t done = 0;
    rc[1] = shardps_wait_any(job.w[0], &h0, 1, 10.0, &done, why[1], sizeof(why[1]));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(shardps_push_pull(job.w[1], "w", grad, out1, 4, &h1, err, sizeof(err)), SHARDPS_OK) << err;
  EXPECT_EQ(shardps_wait(job.w[1], h1, 10.0, err, sizeof(err)), SHARDPS_OK) << err;
  a.join();
  b.join();
  EXPECT_THAT((std::vector<int>{rc[0], rc[1]}),
              ::testing::UnorderedElementsAre(SHARDPS_OK, SHARDPS_ABORTED))
      << why[0] << " / " << why[1];
  EXPECT_EQ(out0[0], -0.5f);
}

// The scheduler of `cluster` SIGKILLed half a second from now, while the
// caller blocks in a call (join the thread after it).
std::thread KillSchedulerSoon(TestCluster& cluster) {
  return std::thread([&cluster] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(cluster.scheduler_pid(), SIGKILL);
  });
}

TEST(CApiSchedulerLossTest, ARendezvousBlockedWhenTheSchedulerIsKilledReturnsNamingIt) {
  ClusterConfig two_workers;
  two_workers.set_num_workers(2);
  auto cluster = TestCluster::Start(two_workers);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Rank 1 never registers; the scheduler dies while rank 0 waits for it.
  std::thread killer = KillSchedulerSoon(**cluster);
  shardps_worker* w = nullptr;
  char why[256] = "";
  const int rc = shardps_worker_create((*cluster)->scheduler_address().c_str(), 0, 5.0, &w, why, sizeof(why));
  killer.join();
  EXPECT_NE(rc, SHARDPS_OK);
  EXPECT_EQ(w, nullptr);
  EXPECT_THAT(std::string(why), HasSubstr("scheduler " + (*cluster)->scheduler_address())) << why;
}

TEST(CApiSchedulerLossTest, ABarrierBlockedWhenTheSchedulerIsKilledReturnsNamingIt) {
  TwoWorkers job{ClusterConfig()};
  ASSERT_TRUE(job.ok());
  // Rank 1 never enters the barrier; the scheduler dies while rank 0 waits in it.
  std::thread killer = KillSchedulerSoon(job.cluster());
  char why[256] = "";
  const int rc = shardps_barrier_timeout(job.w[0], "b", 5.0, why, sizeof(why));
  killer.join();
  EXPECT_NE(rc, SHARDPS_OK);
  EXPECT_THAT(std::string(why), HasSubstr("scheduler " + job.cluster().scheduler_address())) << why;
}

}  // namespace
}  // namespace shardps
