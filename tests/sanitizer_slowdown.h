// How much slower this test binary's tree runs than a plain build, so tests
// that judge liveness by the clock (heartbeat timeouts, failure detection)
// give their nodes time in proportion. Sanitizers slow every process of a
// multi-process test (the daemons are built in the same tree): ThreadSanitizer
// by 5-15x, AddressSanitizer by about 2-3x. On a plain build it is 1, so the
// timeouts the tests check are the ones a user configures.
#ifndef SHARDPS_TESTS_SANITIZER_SLOWDOWN_H_
#define SHARDPS_TESTS_SANITIZER_SLOWDOWN_H_

namespace shardps {

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHARDPS_TEST_SLOWDOWN 10
#elif __has_feature(address_sanitizer)
#define SHARDPS_TEST_SLOWDOWN 3
#endif
#endif
#if !defined(SHARDPS_TEST_SLOWDOWN) && defined(__SANITIZE_THREAD__)
#define SHARDPS_TEST_SLOWDOWN 10
#endif
#if !defined(SHARDPS_TEST_SLOWDOWN) && defined(__SANITIZE_ADDRESS__)
#define SHARDPS_TEST_SLOWDOWN 3
#endif
#ifndef SHARDPS_TEST_SLOWDOWN
#define SHARDPS_TEST_SLOWDOWN 1
#endif

inline constexpr int kTestSlowdown = SHARDPS_TEST_SLOWDOWN;

}  // namespace shardps

#endif  // SHARDPS_TESTS_SANITIZER_SLOWDOWN_H_
