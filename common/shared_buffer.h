// A reference-counted float buffer that ZeroMQ can send without copying.
//
// The owner holds one reference; each in-flight zero-copy message holds
// another, released by ZeroMQ's I/O thread when the bytes are on the wire.
// `unique()` tells the owner whether it may write in place (copy-on-write
// otherwise). Reference counting is thread-safe; the contents are not.
#ifndef SHARDPS_COMMON_SHARED_BUFFER_H_
#define SHARDPS_COMMON_SHARED_BUFFER_H_

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>

#include <zmq.hpp>

namespace shardps {

class SharedBuffer {
 public:
  // A zero-filled buffer of `n` floats, 64-byte aligned, with one reference.
  static SharedBuffer* Create(size_t n);
  static void Ref(SharedBuffer* b) { b->refs_.fetch_add(1, std::memory_order_relaxed); }
  static void Unref(SharedBuffer* b);

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(float); }
  bool unique() const { return refs_.load(std::memory_order_acquire) == 1; }

  // A message whose payload is this buffer, without a copy; holds a reference
  // until ZeroMQ has sent it.
  zmq::message_t ZeroCopyMessage() { return ZeroCopyMessage(bytes()); }
  // The same for the first `bytes` bytes (encoded payloads stored here).
  // REQUIRES: bytes <= this->bytes().
  zmq::message_t ZeroCopyMessage(size_t bytes);
  uint8_t* byte_data() { return reinterpret_cast<uint8_t*>(data_); }

 private:
  SharedBuffer() = default;
  std::atomic<int> refs_{1};
  size_t n_ = 0;
  float* data_ = nullptr;
};

// Owning handle: drops its reference when destroyed.
struct SharedBufferUnref {
  void operator()(SharedBuffer* b) const { SharedBuffer::Unref(b); }
};
using SharedBufferPtr = std::unique_ptr<SharedBuffer, SharedBufferUnref>;

}  // namespace shardps

#endif  // SHARDPS_COMMON_SHARED_BUFFER_H_
