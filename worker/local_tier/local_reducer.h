// LocalReducer: the worker's local first tier. Merges the D per-device
// gradient buffers of one worker into a single host buffer (the one that is
// compressed and pushed), and broadcasts one host buffer (the pulled weights)
// back to all D devices. The local tier is always synchronous across devices:
// each call returns when its result is complete.
//
// Float operation order (a bitwise oracle reproduces it): for every element i
//   acc = in[0][i]; acc = acc + in[1][i]; ...; acc = acc + in[D-1][i]
// (IEEE float adds in device order 0..D-1, no FMA, no reassociation), then for
// MergeOp::kAverage one float multiply acc = acc * (1.0f / float(D)), with
// 1.0f / float(D) rounded to float once. MergeOp::kSum does no multiply. CPU
// and the default CUDA path (peer copies + sum kernel) give bitwise equal
// results; the optional NCCL path does not (NCCL picks its own order).
//
// Calls take a sub-range [offset, offset + len) of the device buffers so a
// caller can pipeline per partition. MergeEncode does that itself: for a list
// of ranges it merges, applies error feedback and encodes with the push codec
// where the devices are (on device 0's GPU for CUDA), and only the payload
// reaches the host; range k is copied to the host and handed on while range
// k+1 is merged and encoded. DecodeBroadcast is its pull-side twin. Staging memory (pinned host, device
// scratch) is allocated on first use for a size and reused after: a steady
// stream of calls allocates nothing.
//
// Ownership: borrows its devices, which must outlive it. Owns its threads and
// staging memory. Thread safety: Merge/Broadcast may be called from any
// thread; calls are serialised (each is internally parallel).
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "compression/codec.h"
#include "compression/codec_params.h"
#include "compression/error_feedback.h"
#include "worker/local_tier/device.h"

namespace shardps {

enum class MergeOp {
  kSum,      // out = in[0] + ... + in[D-1]
  kAverage,  // out = (in[0] + ... + in[D-1]) * (1.0f / D)
};

struct LocalReducerOptions {
  // CPU: threads summing chunks, including the calling thread.
  // Default 0 = std::thread::hardware_concurrency().
  int num_threads = 0;
  // CUDA: use NCCL reduce/broadcast when the build has NCCL. Default false:
  // NCCL's summation order differs from device order, so results are not
  // bitwise equal to the CPU oracle for D > 2; needs distinct GPU ordinals.
  bool use_nccl = false;
  // Codec of MergeEncode payloads. Default none: the merged fp32 values.
  std::optional<compression::CodecParams> push_codec;
  // MergeEncode keeps what the push codec dropped, one residual per range
  // key, and adds it to the next merge of that key (EF-SGD without momentum
  // or warm-up). CUDA residuals live on device 0. Default false.
  bool error_feedback = false;
  // Codec of DecodeBroadcast payloads. Default none: fp32 values.
  std::optional<compression::CodecParams> pull_codec;
};

// One range (e.g. a partition) of a MergeEncode call.
struct EncodeRange {
  // The D buffers to merge (one per device, as Merge's inputs); borrowed.
  absl::Span<const DeviceBuffer* const> inputs;
  size_t offset = 0;          // First value, in every input buffer.
  size_t length = 0;          // Values.
  uint64_t seed = 0;          // Codec seed (e.g. compression::CodecSeed).
  uint64_t residual_key = 0;  // Whose error-feedback residual to use.
};

// Receives range `index`'s payload, in host memory the reducer owns (pinned
// for CUDA). It stays valid and unmodified until the next MergeEncode call or
// the reducer's destruction, so it can be sent without a copy. A non-OK
// status stops MergeEncode, which returns it.
using PayloadSink =
    absl::FunctionRef<absl::Status(size_t index, absl::Span<const uint8_t> payload)>;

class LocalReducer {
 public:
  // Creates a reducer for `devices` (all of one kind, D >= 1). Device 0 is the
  // root where CUDA merges happen. InvalidArgument for an empty or mixed list;
  // FailedPrecondition when NCCL is requested but unavailable.
  static absl::StatusOr<std::unique_ptr<LocalReducer>> Create(std::vector<Device*> devices,
                                                              LocalReducerOptions options = {});
  virtual ~LocalReducer() = default;
  LocalReducer(const LocalReducer&) = delete;
  LocalReducer& operator=(const LocalReducer&) = delete;

  int num_devices() const { return static_cast<int>(devices_.size()); }
  DeviceKind kind() const { return devices_[0]->kind(); }

  // out[i] = merge of inputs[d][offset + i] over d, for i in [0, out.size()),
  // in the float order documented above.
  // REQUIRES: inputs[d] lives on device d; all prior writes to it completed.
  // InvalidArgument on a wrong count, device or range.
  absl::Status Merge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                     absl::Span<float> out, MergeOp op = MergeOp::kSum);

  // outputs[d][offset + i] = in[i] for every device d, i in [0, in.size()).
  // REQUIRES: outputs[d] lives on device d. InvalidArgument otherwise.
  absl::Status Broadcast(absl::Span<const float> in, absl::Span<DeviceBuffer* const> outputs,
                         size_t offset);

  // For each range in order: merges the inputs over it as Merge does, adds
  // the range's residual (with error_feedback), encodes with push_codec (or
  // keeps the fp32 bytes), and calls sink(index, payload). The payload is the
  // exact bytes the CPU codec produces for the merged values; CUDA copies only
  // it to the host. Returns the first error (a device, a range, the sink).
  // REQUIRES: as Merge; a residual key keeps its length.
  absl::Status MergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op, PayloadSink sink);

  // outputs[d][offset + i] = v[i] (or += v[i] with `accumulate`), v the
  // `length` values `payload` decodes to with pull_codec (fp32 without one),
  // for every device d. CUDA copies the payload to device 0, decodes there and
  // copies the result to the other devices. InvalidArgument for a malformed
  // payload, before any output changes.
  // REQUIRES: with `accumulate`, the outputs hold equal values in the range.
  absl::Status DecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed, size_t length,
                               bool accumulate, absl::Span<DeviceBuffer* const> outputs,
                               size_t offset);

  // Bytes MergeEncode's payload takes for `length` values.
  size_t PayloadBytes(size_t length) const;

 protected:
  explicit LocalReducer(std::vector<Device*> devices) : devices_(std::move(devices)) {}

  Device& device(int d) const { return *devices_[d]; }

  // Merge / Broadcast after argument checks, with calls serialised.
  virtual absl::Status DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                               absl::Span<float> out, MergeOp op) = 0;
  virtual absl::Status DoBroadcast(absl::Span<const float> in,
                                   absl::Span<DeviceBuffer* const> outputs, size_t offset) = 0;
  // MergeEncode / DecodeBroadcast after argument checks, calls serialised.
  // The defaults merge to host memory with DoMerge and run the CPU codecs.
  virtual absl::Status DoMergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op,
                                     PayloadSink sink);
  virtual absl::Status DoDecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed,
                                         size_t length, bool accumulate,
                                         absl::Span<DeviceBuffer* const> outputs, size_t offset);

  // Creates the CPU codecs the options name (the CUDA reducer sizes payloads
  // with them). Called once by the factories. InvalidArgument for bad params.
  absl::Status InitCodecs(const LocalReducerOptions& options);
  const compression::CodecParams* push_params() const {
    return push_codec_ ? &push_codec_->params() : nullptr;
  }
  const compression::CodecParams& pull_params() const { return pull_codec_->params(); }
  bool error_feedback() const { return feedback_ != nullptr; }
  // Lays out the ranges' payloads in one staging area (each start 256-byte
  // aligned) into payload_offsets(); returns its total size.
  size_t PlanPayloads(absl::Span<const EncodeRange> ranges);
  const std::vector<size_t>& payload_offsets() const { return payload_offsets_; }

 private:
  template <typename Buffer>
  absl::Status CheckBuffers(absl::Span<Buffer* const> buffers, size_t offset, size_t len) const;

  const std::vector<Device*> devices_;
  absl::Mutex call_mu_;  // Serialises every call (staging is shared).
  std::unique_ptr<compression::Codec> push_codec_;  // Null: fp32 payloads.
  std::unique_ptr<compression::Codec> pull_codec_;  // "none" without a pull codec.
  std::unique_ptr<compression::ErrorFeedback> feedback_;  // With error_feedback.
  std::vector<size_t> payload_offsets_;  // Per range of the current call.
  std::vector<uint8_t> host_payloads_;   // Default DoMergeEncode's staging.
  std::vector<float> host_values_;       // Default paths' merged/decoded values.
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_
