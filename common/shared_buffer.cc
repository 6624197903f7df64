#include "common/shared_buffer.h"

#include <cstdlib>
#include <new>

// ZeroMQ (not built with TSan) hands a zero-copy frame to its I/O thread,
// which calls the free function: in the TSan tree, say that this hand-over
// orders the buffer's writes before the release (tools/test.sh --sanitize).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#include <sanitizer/tsan_interface.h>
#define SHARDPS_HANDED_OVER(p) __tsan_release(p)
#define SHARDPS_TAKEN_OVER(p) __tsan_acquire(p)
#endif
#endif
#ifndef SHARDPS_HANDED_OVER
#define SHARDPS_HANDED_OVER(p) (void)(p)
#define SHARDPS_TAKEN_OVER(p) (void)(p)
#endif

namespace shardps {

SharedBuffer* SharedBuffer::Create(size_t n) {
  constexpr size_t kAlign = 64;
  size_t header = (sizeof(SharedBuffer) + kAlign - 1) / kAlign * kAlign;
  size_t bytes = header + (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  void* mem = std::aligned_alloc(kAlign, bytes);
  if (mem == nullptr) throw std::bad_alloc();
  auto* b = new (mem) SharedBuffer();
  b->n_ = n;
  b->data_ = reinterpret_cast<float*>(static_cast<char*>(mem) + header);
  std::memset(b->data_, 0, n * sizeof(float));
  return b;
}

void SharedBuffer::Unref(SharedBuffer* b) {
  if (b->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    b->~SharedBuffer();
    std::free(b);
  }
}

zmq::message_t SharedBuffer::ZeroCopyMessage(size_t bytes) {
  Ref(this);
  SHARDPS_HANDED_OVER(this);
  return zmq::message_t(
      data_, bytes,
      [](void*, void* hint) {
        SHARDPS_TAKEN_OVER(hint);
        Unref(static_cast<SharedBuffer*>(hint));
      },
      this);
}

}  // namespace shardps
