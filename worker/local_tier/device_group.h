// DeviceGroup: the worker's local first tier in the training step. A worker
// drives D devices; after each device wrote its gradients, one Round()
//   - merges the D device gradients of each partition (MergeOp::kAverage)
//     with LocalReducer::MergeEncode, straight into the reducer's host staging
//     (pinned for CUDA), and issues PushPullPartition from there, so partition
//     k is on the wire while partition k+1 is merged (no second host copy);
//   - then waits for the partitions in the order they were issued and
//     broadcasts each pulled partition into the D devices' weight buffers.
// Exactly one push per partition per round leaves the worker, whatever D is.
// Tensors go in a priority order fixed at Create (e.g. the layers the next
// forward pass needs first).
//
// The merged gradient is (g_0 + g_1 + ... + g_{D-1}) * (1.0f / D) in float,
// device order (see local_reducer.h), so a deterministic sync cluster stays
// bitwise reproducible by a single-process reference.
//
// Memory: every buffer (per device: one gradient and one weight buffer per
// tensor; per tensor: one host weight buffer; handle list) is allocated by
// Create. Round() and Pull() allocate nothing in this
// class (the reducer reuses its staging after the first call).
//
// Ownership: owns the devices, the reducer and all buffers; borrows the
// Worker, which must outlive it. Thread safety: not thread-safe; one thread
// calls Round()/Pull() at a time, and device buffers must not be written
// while a call runs.
#ifndef SHARDPS_WORKER_LOCAL_TIER_DEVICE_GROUP_H_
#define SHARDPS_WORKER_LOCAL_TIER_DEVICE_GROUP_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/local_tier/device.h"
#include "worker/local_tier/local_reducer.h"
#include "worker/worker.h"

namespace shardps {

// One tensor the group pushes and pulls (already declared to the Worker).
struct GroupTensor {
  std::string name;
  size_t num_elements = 0;
};

struct DeviceGroupOptions {
  // Order in which tensors are merged and pushed, as indices into the tensor
  // list (a permutation). Default empty = the order of the tensor list.
  std::vector<size_t> priority;
  // Passed to LocalReducer::Create. Default: all cores, no NCCL (bitwise).
  // No push_codec: the Worker encodes what the group pushes.
  LocalReducerOptions reducer;
};

class DeviceGroup {
 public:
  // Creates the group for `devices` (D >= 1, one kind) and `tensors`, whose
  // partitions it reads from `worker`.
  // REQUIRES: worker.DefineTensors() has returned for these tensors.
  // InvalidArgument for no devices, no tensors, a size that differs from the
  // shard map, a priority that is not a permutation or a reducer push_codec;
  // NotFound for a tensor
  // the worker does not know; ResourceExhausted when buffers cannot be had.
  static absl::StatusOr<std::unique_ptr<DeviceGroup>> Create(
      Worker& worker, std::vector<std::unique_ptr<Device>> devices, std::vector<GroupTensor> tensors,
      DeviceGroupOptions options = {});
  ~DeviceGroup();
  DeviceGroup(const DeviceGroup&) = delete;
  DeviceGroup& operator=(const DeviceGroup&) = delete;

  int num_devices() const { return static_cast<int>(devices_.size()); }
  size_t num_tensors() const { return tensors_.size(); }
  Device& device(int d) const { return *devices_[d]; }

  // Where device d writes its gradient of tensor t before Round().
  DeviceBuffer& gradient(int d, size_t t) const { return *slots_[d].gradients[t]; }
  // Where Round()/Pull() leave tensor t's weights for device d.
  DeviceBuffer& weights(int d, size_t t) const { return *slots_[d].weights[t]; }
  // Host copy of tensor t's weights from the latest Round()/Pull().
  absl::Span<const float> host_weights(size_t t) const { return host_[t].weights; }

  // One synchronous round as described above. Returns the first error (a
  // merge, a push that could not be issued, a Wait that timed out after
  // `timeout` per partition, a broadcast); every issued request is waited for
  // before returning, so no buffer is still borrowed by the Worker.
  absl::Status Round(absl::Duration timeout);

  // Pulls every tensor whole and broadcasts it to every device (start-up,
  // before evaluation). Same error contract as Round(). With update_mode
  // SUM_ONLY a pull returns the servers' initial weights: call it at start-up
  // only; Round() then updates the host weights in place (they persist
  // between rounds, as the Worker requires) and broadcasts them.
  absl::Status Pull(absl::Duration timeout);

 private:
  // One partition of one tensor, in push order.
  struct Step {
    size_t tensor = 0;
    size_t partition = 0;
    size_t offset = 0;
    size_t length = 0;
  };
  struct HostTensor {
    std::vector<float> weights;  // pulled weights, broadcast from here
  };
  struct DeviceSlot {
    std::vector<std::unique_ptr<DeviceBuffer>> gradients;  // per tensor
    std::vector<std::unique_ptr<DeviceBuffer>> weights;    // per tensor
  };

  DeviceGroup(Worker& worker, std::vector<std::unique_ptr<Device>> devices, std::vector<GroupTensor> tensors);

  absl::Status Allocate();
  absl::Status PlanSteps(const std::vector<size_t>& order);
  // Waits for handles_[0, issued) in order; broadcasts each partition whose
  // wait succeeded while `status` is still ok. Returns the first error.
  absl::Status WaitAndBroadcast(size_t issued, absl::Duration timeout, absl::Status status);

  Worker& worker_;
  std::vector<std::unique_ptr<Device>> devices_;
  const std::vector<GroupTensor> tensors_;
  std::unique_ptr<LocalReducer> reducer_;  // Borrows devices_: declared after them.
  std::vector<DeviceSlot> slots_;          // Per device; buffers borrow devices_.
  std::vector<HostTensor> host_;           // Per tensor.
  std::vector<Step> steps_;                // Every partition, in push order.
  std::vector<EncodeRange> ranges_;        // Per step: what MergeEncode merges.
  // Scratch reused by every call: per-tensor buffer lists and handles.
  std::vector<std::vector<const DeviceBuffer*>> gradient_lists_;
  std::vector<std::vector<DeviceBuffer*>> weight_lists_;
  std::vector<Worker::Handle> handles_;
};

}  // namespace shardps

#endif  // SHARDPS_WORKER_LOCAL_TIER_DEVICE_GROUP_H_
