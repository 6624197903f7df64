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
// caller can pipeline per partition. Staging memory (pinned host, device
// scratch) is allocated on first use for a size and reused after: a steady
// stream of calls allocates nothing.
//
// Ownership: borrows its devices, which must outlive it. Owns its threads and
// staging memory. Thread safety: Merge/Broadcast may be called from any
// thread; calls are serialised (each is internally parallel).
#ifndef SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_
#define SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
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
};

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

 protected:
  explicit LocalReducer(std::vector<Device*> devices) : devices_(std::move(devices)) {}

  Device& device(int d) const { return *devices_[d]; }

  // Merge / Broadcast after argument checks, with calls serialised.
  virtual absl::Status DoMerge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                               absl::Span<float> out, MergeOp op) = 0;
  virtual absl::Status DoBroadcast(absl::Span<const float> in,
                                   absl::Span<DeviceBuffer* const> outputs, size_t offset) = 0;

 private:
  template <typename Buffer>
  absl::Status CheckBuffers(absl::Span<Buffer* const> buffers, size_t offset, size_t len) const;

  const std::vector<Device*> devices_;
  absl::Mutex call_mu_;  // Serialises Merge/Broadcast (staging is shared).
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_LOCAL_REDUCER_H_
