#include "common/shared_buffer.h"

#include <cstdlib>
#include <new>

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
  return zmq::message_t(
      data_, bytes, [](void*, void* hint) { Unref(static_cast<SharedBuffer*>(hint)); }, this);
}

}  // namespace shardps
