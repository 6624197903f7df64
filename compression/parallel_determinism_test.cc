// Multi-threaded kernels produce the same bytes as single-threaded ones.
#include "compression/codec.h"
#include "compression/codec_test_util.h"
#include "compression/kernel_thread_pool.h"
#include "gtest/gtest.h"

namespace shardps::compression {
namespace {

TEST(ParallelDeterminismTest, PayloadsAndDecodesAreBitIdentical) {
  const size_t n = (size_t{1} << 20) + 37;  // Parallel path, ragged tail.
  const auto x = RandomGradient(n, 81);
  for (const std::string& name : CodecNames()) {
    auto serial = MustCreate(name + ":threads=1");
    auto parallel = MustCreate(name + ":threads=0");
    ASSERT_NE(serial, nullptr);
    ASSERT_NE(parallel, nullptr);
    const auto a = MustEncode(*serial, x, 3);
    const auto b = MustEncode(*parallel, x, 3);
    ASSERT_TRUE(a == b) << name;
    const auto da = MustDecode(*serial, a, n, 3);
    const auto db = MustDecode(*parallel, a, n, 3);
    ASSERT_EQ(0, std::memcmp(da.data(), db.data(), n * sizeof(float))) << name;
  }
}

TEST(ParallelDeterminismTest, PoolRunsEveryTaskOnce) {
  KernelThreadPool pool(3);
  std::vector<int> hits(1000, 0);
  for (int round = 0; round < 20; ++round) {
    pool.ParallelFor(hits.size(), 0, [&](size_t i) { ++hits[i]; });
  }
  for (int h : hits) ASSERT_EQ(h, 20);
}

}  // namespace
}  // namespace shardps::compression
