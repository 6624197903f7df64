// ErrorFeedback: compresses gradients with a Codec while carrying what the
// codec dropped over to the next call (EF-SGD), one residual per caller key
// (e.g. worker x partition). After Encode(key, g):
//     decode(payload) + residual_new == g + residual_old   (up to fp rounding)
// Options add DGC momentum correction and a ratio warm-up for topk.
//
// Owns the codec(s) and one residual (plus one velocity with momentum) per
// key; memory is bounded by the keys in use, buffers are reused, and steady
// state performs no allocation. Thread-safe: calls for different keys run
// concurrently, calls for one key are serialised.
#ifndef SHARDPS_COMPRESSION_ERROR_FEEDBACK_H_
#define SHARDPS_COMPRESSION_ERROR_FEEDBACK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "compression/codec.h"

namespace shardps::compression {

struct ErrorFeedbackOptions {
  // DGC momentum correction, topk only: u = momentum*u + g, the residual
  // accumulates u, and entries sent are cleared in both. 0 (default) = off.
  float momentum = 0.0f;
  // topk only: over a key's first warmup_calls calls the ratio decays
  // exponentially from warmup_start_ratio to the codec's ratio. 0 = off.
  int warmup_calls = 0;
  float warmup_start_ratio = 0.25f;
};

class ErrorFeedback {
 public:
  // InvalidArgument for bad params, or momentum/warm-up on a codec other than
  // topk, momentum outside [0, 1), warmup_calls outside [0, 10000].
  static absl::StatusOr<std::unique_ptr<ErrorFeedback>> Create(
      const CodecParams& params, const ErrorFeedbackOptions& options = {});

  // The codec the receiver decodes with (topk decodes warm-up payloads too).
  const Codec& codec() const { return *codecs_.back(); }
  // Payload bound for n values, warm-up included.
  size_t MaxEncodedBytes(size_t n) const;

  // Compresses grad + residual(key) into `out`, returns the payload size, and
  // keeps the remainder as the key's new residual. The first call for a key
  // fixes its length; InvalidArgument for another length (Reset first) or an
  // out smaller than MaxEncodedBytes(grad.size()); state is unchanged then.
  absl::StatusOr<size_t> Encode(uint64_t key, absl::Span<const float> grad, uint64_t seed,
                                absl::Span<uint8_t> out);

  // Copy of the key's residual (empty if the key is unknown).
  std::vector<float> Residual(uint64_t key) const;
  // A key's whole state, to carry it to another encoder (a re-created copy
  // of a server's partition): residual, velocity (momentum) and the calls
  // made (warm-up). All empty/0 if the key is unknown.
  struct KeyCopy {
    std::vector<float> residual, velocity;
    int64_t calls = 0;
  };
  KeyCopy Save(uint64_t key) const;
  // Replaces the key's state with `copy`; calls 0 drops it (Reset).
  void Restore(uint64_t key, KeyCopy copy);
  // Drops a key's state (e.g. when a partition moves away).
  void Reset(uint64_t key);
  size_t num_keys() const;

 private:
  struct KeyState {
    absl::Mutex mu;
    std::vector<float> residual ABSL_GUARDED_BY(mu);
    std::vector<float> velocity ABSL_GUARDED_BY(mu);
    int64_t calls ABSL_GUARDED_BY(mu) = 0;
  };

  ErrorFeedback(std::vector<std::unique_ptr<Codec>> codecs, const ErrorFeedbackOptions& options);
  std::shared_ptr<KeyState> StateFor(uint64_t key);
  // Updates residual/velocity with grad; the payload must come from `codec`.
  void Accumulate(KeyState& s, absl::Span<const float> grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  absl::Status SubtractDecoded(KeyState& s, const Codec& codec, absl::Span<const uint8_t> payload,
                               uint64_t seed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

  // codecs_[i] serves call i during warm-up; codecs_.back() afterwards.
  const std::vector<std::unique_ptr<Codec>> codecs_;
  const ErrorFeedbackOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<KeyState>> states_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_ERROR_FEEDBACK_H_
