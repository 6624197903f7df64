#include "worker/worker.h"

#include <optional>
#include <thread>

#include <glog/logging.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/protocol.h"
#include "common/scheduler_client.h"
#include "worker/data_channel.h"

namespace shardps {
namespace {

// How a tensor is cut and where its pieces live (from the shard map).
struct TensorRoute {
  uint64_t num_elements = 0;
  std::vector<PartitionInfo> partitions;
  std::vector<uint64_t> rounds_pushed;  // per partition; guarded by WorkerImpl::mu_
};

class WorkerImpl : public Worker {
 public:
  WorkerImpl(std::unique_ptr<SchedulerClient> scheduler, const WorkerOptions& options, RegisterResponse reg)
      : scheduler_(std::move(scheduler)), options_(options), node_id_(reg.node_id()), config_(reg.config()) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~WorkerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    heartbeat_.join();
  }

  const ClusterConfig& config() const override { return config_; }
  uint32_t rank() const override { return options_.rank; }

  absl::Status DefineTensors(const std::vector<TensorSpec>& tensors) override {
    DefineTensorsRequest request;
    request.set_node_id(node_id_);
    for (const TensorSpec& t : tensors) *request.add_tensors() = t;
    auto map = scheduler_->DefineTensors(request, options_.control_timeout);
    if (!map.ok()) return map.status();
    absl::MutexLock lock(&mu_);
    if (channel_ != nullptr) {
      if (map->epoch() == epoch_) return absl::OkStatus();
      return absl::UnimplementedError("shard map changed after tensors were defined");
    }
    std::vector<std::string> addresses(map->servers_size());
    for (const ServerInfo& s : map->servers()) {
      if (s.index() >= addresses.size()) return absl::InternalError("shard map has a bad server index");
      addresses[s.index()] = s.data_address();
    }
    auto channel = DataChannel::Create(addresses, options_.rank);
    if (!channel.ok()) return channel.status();
    channel_ = *std::move(channel);
    epoch_ = map->epoch();
    for (const PartitionInfo& p : map->partitions()) {
      const TensorSpec& t = map->tensors(p.tensor());
      TensorRoute& route = routes_[t.name()];
      route.num_elements += p.num_elements();
      route.partitions.push_back(p);
      route.rounds_pushed.push_back(0);
    }
    return absl::OkStatus();
  }

  absl::Status InitTensor(const std::string& name, absl::Span<const float> values, absl::Duration timeout) override {
    auto handle = Start(INIT, name, values.data(), values.size(), nullptr, 0, "InitTensor");
    if (!handle.ok()) return handle.status();
    return channel_->Wait(*handle, timeout);
  }

  absl::Status Barrier(const std::string& name) override {
    BarrierRequest request;
    request.set_node_id(node_id_);
    request.set_name(name);
    return scheduler_->Barrier(request, options_.control_timeout);
  }

  absl::StatusOr<Handle> Push(const std::string& name, absl::Span<const float> gradient) override {
    return Start(PUSH, name, gradient.data(), gradient.size(), nullptr, 0, "Push");
  }

  absl::StatusOr<Handle> Pull(const std::string& name, absl::Span<float> weights) override {
    return Start(PULL, name, nullptr, 0, weights.data(), weights.size(), "Pull");
  }

  absl::StatusOr<Handle> PushPull(const std::string& name, absl::Span<const float> gradient,
                                  absl::Span<float> weights) override {
    return Start(PUSH_PULL, name, gradient.data(), gradient.size(), weights.data(), weights.size(), "PushPull");
  }

  absl::StatusOr<std::vector<PartitionExtent>> Partitions(const std::string& name) const override {
    absl::MutexLock lock(&mu_);
    auto it = routes_.find(name);
    if (it == routes_.end()) return absl::NotFoundError(absl::StrCat("Partitions: unknown tensor '", name, "'"));
    std::vector<PartitionExtent> out;
    for (const PartitionInfo& p : it->second.partitions) out.push_back({p.offset(), p.num_elements(), p.server()});
    return out;
  }

  absl::StatusOr<Handle> PushPullPartition(const std::string& name, size_t index, absl::Span<const float> gradient,
                                           absl::Span<float> weights) override {
    return Start(PUSH_PULL, name, gradient.data(), gradient.size(), weights.data(), weights.size(),
                 "PushPullPartition", index);
  }

  absl::Status Wait(Handle handle, absl::Duration timeout) override {
    DataChannel* channel;
    {
      absl::MutexLock lock(&mu_);
      channel = channel_.get();
    }
    if (channel == nullptr) return absl::FailedPreconditionError("Wait before DefineTensors");
    return channel->Wait(handle, timeout);
  }

  WorkerStats stats() const override {
    absl::MutexLock lock(&mu_);
    WorkerStats s;
    if (channel_ != nullptr) {
      s.bytes_pushed = channel_->bytes_sent();
      s.bytes_pulled = channel_->bytes_received();
      s.requests = channel_->requests_sent();
    }
    return s;
  }

 private:
  // Builds and submits one request per partition (or only partition
  // `only`, whose extent the spans then cover).
  absl::StatusOr<Handle> Start(Op op, const std::string& name, const float* in, size_t in_n, float* out,
                               size_t out_n, absl::string_view verb, std::optional<size_t> only = std::nullopt) {
    std::vector<DataChannel::Request> requests;
    std::string what;
    {
      absl::MutexLock lock(&mu_);
      if (channel_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(verb, " before DefineTensors"));
      auto it = routes_.find(name);
      if (it == routes_.end()) return absl::NotFoundError(absl::StrCat(verb, ": unknown tensor '", name, "'"));
      TensorRoute& route = it->second;
      size_t first = 0, last = route.partitions.size();
      uint64_t expected = route.num_elements, base = 0;
      if (only) {
        if (*only >= route.partitions.size()) {
          return absl::OutOfRangeError(absl::StrCat(verb, " of '", name, "': partition ", *only, " of ",
                                                    route.partitions.size()));
        }
        first = *only;
        last = first + 1;
        expected = route.partitions[first].num_elements();
        base = route.partitions[first].offset();
      }
      const bool sends = in != nullptr || op == INIT;
      const bool receives = op == PULL || op == PUSH_PULL;
      if (sends && in_n != expected) {
        return absl::InvalidArgumentError(absl::StrCat(verb, " of '", name, "': gradient has ", in_n,
                                                       " elements, expected ", expected));
      }
      if (receives && out_n != expected) {
        return absl::InvalidArgumentError(absl::StrCat(verb, " of '", name, "': output has ", out_n,
                                                       " elements, expected ", expected));
      }
      what = absl::StrCat(verb, " of '", name, "' (round ", route.rounds_pushed[first], ")");
      requests.reserve(last - first);
      for (size_t i = first; i < last; ++i) {
        const PartitionInfo& p = route.partitions[i];
        DataChannel::Request r;
        r.server = p.server();
        r.header.set_op(op);
        r.header.set_partition_id(p.id());
        r.header.set_round(route.rounds_pushed[i]);
        if (op == PUSH || op == PUSH_PULL) ++route.rounds_pushed[i];
        r.header.set_epoch(epoch_);
        r.header.set_dtype(FLOAT32);
        r.header.set_num_elements(p.num_elements());
        if (sends) r.payload = in + (p.offset() - base);
        if (receives) r.out = out + (p.offset() - base);
        requests.push_back(std::move(r));
      }
    }
    return channel_->Submit(std::move(requests), std::move(what));
  }

  // Tells the scheduler this worker is alive (shown by `shardps status`).
  void HeartbeatLoop() {
    const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), interval)) {
      HeartbeatRequest request;
      request.set_node_id(node_id_);
      mu_.Unlock();
      auto r = scheduler_->Heartbeat(request, interval);
      if (!r.ok()) {
        LOG_EVERY_N(WARNING, 10) << "worker " << options_.rank << ": " << r.status();
      }
      mu_.Lock();
    }
  }

  const std::unique_ptr<SchedulerClient> scheduler_;
  const WorkerOptions options_;
  const uint64_t node_id_;
  const ClusterConfig config_;
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, TensorRoute> routes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DataChannel> channel_;  // set once under mu_, then read-only
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options) {
  auto scheduler = SchedulerClient::Create(options.scheduler_address);
  if (!scheduler.ok()) return scheduler.status();
  RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(WORKER);
  request.set_rank(options.rank);
  request.set_host(options.host);
  auto registered = (*scheduler)->Register(request, options.rendezvous_timeout);
  if (!registered.ok()) return registered.status();
  return std::unique_ptr<Worker>(new WorkerImpl(*std::move(scheduler), options, *std::move(registered)));
}

}  // namespace shardps
