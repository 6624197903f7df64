// The C ABI's own contract: named codes, the version, and no C++ exception
// crossing the boundary. Calls against a live cluster are in
// tests/cluster_test.cc (CApiTrainsAStep) and tests/install_test.sh.
#include "worker/c_api.h"

#include <cstdlib>
#include <new>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

// TSan's runtime defines operator new itself, so it cannot be replaced there:
// the two tests that need the fault injection skip in the TSan tree.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHARDPS_CANNOT_REPLACE_NEW 1
#endif
#endif

#ifdef SHARDPS_CANNOT_REPLACE_NEW
#define SKIP_WITHOUT_ALLOCATION_FAULTS() GTEST_SKIP() << "operator new cannot be replaced under TSan"
#else
#define SKIP_WITHOUT_ALLOCATION_FAULTS()
#endif

// Fault injection: while set, every operator new on this thread throws
// std::bad_alloc, as under memory exhaustion. Other threads (gRPC's, gtest's)
// are unaffected.
thread_local bool fail_allocations = false;

class AllocationsFail {
 public:
  AllocationsFail() { fail_allocations = true; }
  ~AllocationsFail() { fail_allocations = false; }
};

}  // namespace

#ifndef SHARDPS_CANNOT_REPLACE_NEW
void* operator new(std::size_t size) {
  if (fail_allocations) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// Deletes to match: the default ones free with std::free in libstdc++, but
// ASan's check that memory from malloc is not given to operator delete.
// (GCC cannot tell that this operator new is the one that used malloc.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // SHARDPS_CANNOT_REPLACE_NEW

namespace {

using ::testing::HasSubstr;

TEST(CApiTest, ExceptionBecomesInternalStatusWithItsMessage) {
  SKIP_WITHOUT_ALLOCATION_FAULTS();
  shardps_worker* w = nullptr;
  char err[256] = "";
  int rc;
  {
    AllocationsFail scope;
    rc = shardps_worker_create("127.0.0.1:1", 0, 1.0, &w, err, sizeof(err));
  }
  EXPECT_EQ(rc, SHARDPS_INTERNAL);
  EXPECT_THAT(std::string(err), HasSubstr("exception in shardps_worker_create"));
  EXPECT_THAT(std::string(err), HasSubstr("bad_alloc"));
  EXPECT_EQ(w, nullptr);
}

TEST(CApiTest, ExceptionMessageIsTruncatedToTheBuffer) {
  SKIP_WITHOUT_ALLOCATION_FAULTS();
  shardps_worker* w = nullptr;
  char err[8];
  int rc;
  {
    AllocationsFail scope;
    rc = shardps_worker_create("127.0.0.1:1", 0, 1.0, &w, err, sizeof(err));
  }
  EXPECT_EQ(rc, SHARDPS_INTERNAL);
  EXPECT_EQ(std::string(err), "excepti");
}

TEST(CApiTest, NullArgumentsAreInvalidArgument) {
  char err[64] = "";
  EXPECT_EQ(shardps_worker_create(nullptr, 0, 1.0, nullptr, err, sizeof(err)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err), HasSubstr("scheduler_address is NULL"));
  EXPECT_EQ(shardps_wait(nullptr, 1, 1.0, nullptr, 0), SHARDPS_INVALID_ARGUMENT);
}

TEST(CApiTest, EveryDeclareEntryRefusesANullWorker) {
  const int64_t shape[] = {2};
  char err[64] = "";
  EXPECT_EQ(shardps_declare_tensor(nullptr, "w", shape, 1, err, sizeof(err)), SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err), HasSubstr("worker is NULL"));
  EXPECT_EQ(shardps_declare_tensor_dtype(nullptr, "w", shape, 1, SHARDPS_FLOAT16, err, sizeof(err)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err), HasSubstr("worker is NULL"));
  EXPECT_EQ(shardps_declare_tensor_codec(nullptr, "w", shape, 1, SHARDPS_FLOAT32, "fp16", err, sizeof(err)),
            SHARDPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(err), HasSubstr("worker is NULL"));
}

TEST(CApiTest, VersionIsTheProjectVersion) { EXPECT_STREQ(shardps_version(), SHARDPS_EXPECTED_VERSION); }

TEST(CApiTest, StatusNamesMatchCodes) {
  EXPECT_STREQ(shardps_status_name(SHARDPS_OK), "OK");
  EXPECT_STREQ(shardps_status_name(SHARDPS_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_STREQ(shardps_status_name(SHARDPS_INTERNAL), "INTERNAL");
  EXPECT_STREQ(shardps_status_name(SHARDPS_UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(shardps_status_name(17), "UNKNOWN_CODE");
  EXPECT_STREQ(shardps_status_name(-1), "UNKNOWN_CODE");
}

}  // namespace
