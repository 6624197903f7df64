// FuzzInput: reads a fuzzer's byte string as a sequence of small values.
// Running out of bytes is not an error: every read then returns zeros or an
// empty span, so a harness never reads past the input.
#ifndef SHARDPS_TESTS_FUZZ_FUZZ_INPUT_H_
#define SHARDPS_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <google/protobuf/stubs/logging.h>

namespace shardps::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // Little-endian, `bytes` of them (at most 8).
  uint64_t Int(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }
  // The next `n` bytes, or fewer at the end of the input.
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  // A field of the form [u16 length][bytes].
  std::string Field() { return Bytes(Int(2)); }
  std::string Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Drops protobuf's own log lines (e.g. one per string field of invalid UTF-8
// that a fuzzed message holds): they cost more than the run itself.
inline void QuietProtobufLogs() {
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
}

// Ends the run with `what` when a harness's invariant does not hold (libFuzzer
// records the input as a crash).
inline void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: invariant violated: %s\n", what);
  std::abort();
}

}  // namespace shardps::fuzz

#endif  // SHARDPS_TESTS_FUZZ_FUZZ_INPUT_H_
