#include "worker/worker.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>

#include <glog/logging.h>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/endpoint.h"
#include "common/heartbeat_log.h"
#include "common/names.h"
#include "common/optimizer.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "compression/codec_policy.h"
#include "compression/error_feedback.h"
#include "common/scheduler_client.h"
#include "common/scheduler_refusal.h"
#include "worker/data_channel.h"

namespace shardps {
namespace {

// Per-partition state of the worker: codecs and, in sum-only mode, the
// pulled aggregate and the optimizer state. Touched by the caller building a
// request and by the I/O thread answering it, never both at once (one
// request per partition in flight).
struct PartitionState {
  compression::PartitionCodecs codecs;
  std::vector<float> aggregate;
  std::vector<float> optimizer_state;
  // Sum-only with Adam's variance frozen (1-bit Adam): the frozen divisor d
  // and this worker's momentum in units of d, both set by the answer side
  // right after the last uncompressed round and published by `divisor_ready`;
  // then d is only read and `momentum` belongs to the caller (Encode).
  std::vector<float> divisor;
  std::vector<float> momentum;
  std::atomic<bool> divisor_ready{false};
  // Sum-only: the rounds this worker took part in without a gradient
  // (SkipRound); guarded by WorkerImpl::mu_. Its optimizer's own step count
  // is the round less these, as on the servers.
  uint64_t skipped = 0;
};

// How a tensor is cut and where its pieces live (from the shard map).
struct TensorRoute {
  uint64_t num_elements = 0;
  std::vector<PartitionInfo> partitions;
  std::vector<uint64_t> rounds_pushed;  // per partition; guarded by WorkerImpl::mu_
  std::vector<std::unique_ptr<PartitionState>> states;
};

class WorkerImpl : public Worker {
 public:
  WorkerImpl(std::shared_ptr<SchedulerClient> scheduler, const WorkerOptions& options, RegisterResponse reg,
             CurveKeyPair curve_keys)
      : scheduler_(std::move(scheduler)), options_(options), curve_keys_(std::move(curve_keys)),
        node_id_(reg.node_id()), config_(reg.config()), live_servers_(config_.num_servers()) {
    rejoin_.round = reg.rejoin_round();
    for (const BarrierPass& b : reg.passed_barriers()) {
      rejoin_.passed_barriers[b.name()].assign(b.live_ranks().begin(), b.live_ranks().end());
      barrier_passes_[b.name()] = b.generation();
    }
    if (options_.control_timeout <= absl::ZeroDuration()) {
      options_.control_timeout = absl::Milliseconds(config_.rendezvous_timeout_ms());
    }
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~WorkerImpl() override {
    watch_.reset();  // its callbacks use the channel
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    heartbeat_.join();
    Leave();
  }

  const ClusterConfig& config() const override { return config_; }
  uint32_t rank() const override { return options_.rank; }
  uint32_t num_servers() const override {
    absl::MutexLock lock(&mu_);
    return live_servers_;
  }
  const Rejoin& rejoin() const override { return rejoin_; }
  absl::Duration request_timeout() const override { return absl::Milliseconds(config_.request_timeout_ms()); }

  absl::Status DefineTensors(const std::vector<TensorSpec>& tensors, absl::Duration timeout) override {
    DefineTensorsRequest request;
    request.set_node_id(node_id_);
    for (const TensorSpec& t : tensors) {
      SHARDPS_RETURN_IF_ERROR(CheckName("tensor name", t.name()));
      SHARDPS_RETURN_IF_ERROR(CheckName(absl::StrCat("codec of tensor '", t.name(), "'"), t.codec()));
      *request.add_tensors() = t;
    }
    absl::StatusOr<ShardMap> map;
    SHARDPS_RETURN_IF_ERROR(AskUntilDeadline(timeout, [&](absl::Duration left) {
      map = scheduler_->DefineTensors(request, left);  // the same tensors again: the same map
      return map.status();
    }));
    absl::Status s = AdoptShardMap(*map);
    if (!s.ok() || watch_ != nullptr) return s;
    // Outside mu_: the watch's callbacks take it.
    FollowMembership(*map, Channel());
    watch_ = scheduler_->WatchShardMap(
        node_id_, [this](const ShardMap& m) { FollowMembership(m, Channel()); },
        [this](const absl::Status& s) {
          LOG_EVERY_N(WARNING, 20) << "worker " << options_.rank << ": " << s << " (training goes on; reconnecting)";
        });
    return absl::OkStatus();
  }

  // Builds the routes and the data channel of the first shard map; a later
  // call with the same epoch is a no-op.
  absl::Status AdoptShardMap(const ShardMap& m) {
    const ShardMap* map = &m;
    absl::MutexLock lock(&mu_);
    // Defined already: the scheduler checked the tensors are the same; later
    // epochs reach this worker through its watch (FollowMembership).
    if (channel_ != nullptr) return absl::OkStatus();
    std::vector<DataChannel::ServerEndpoint> addresses(map->servers_size());
    for (const ServerInfo& s : map->servers()) {
      if (s.index() >= addresses.size()) return absl::InternalError("shard map has a bad server index");
      addresses[s.index()] = {s.data_address(), s.curve_public_key(), s.sealed_data()};
    }
    if (absl::Status s = SetUpCompression(); !s.ok()) return s;
    // Built aside and adopted only when complete: a failure leaves no half state.
    absl::flat_hash_map<std::string, TensorRoute> routes;
    for (const PartitionInfo& p : map->partitions()) {
      const TensorSpec& t = map->tensors(p.tensor());
      TensorRoute& route = routes[t.name()];
      route.num_elements += p.num_elements();
      route.partitions.push_back(p);
      // A cluster restored from a checkpoint continues at its round, a
      // rejoined worker at its join round.
      route.rounds_pushed.push_back(std::max<uint64_t>(config_.checkpoint().restore_round(), rejoin_.round));
      auto state = std::make_unique<PartitionState>();
      auto codecs = compression::CodecsForPartition(config_, t.name(), p.num_elements(), t.codec());
      if (!codecs.ok()) return codecs.status();
      state->codecs = *std::move(codecs);
      if (sum_only()) {
        state->aggregate.resize(p.num_elements());
        state->optimizer_state.resize(optimizer_->state_slots() * p.num_elements());
      }
      route.states.push_back(std::move(state));
    }
    auto channel = DataChannel::Create(addresses, options_.rank, curve_keys_.public_key.empty() ? nullptr : &curve_keys_,
                                       {absl::Milliseconds(config_.heartbeat_interval_ms()),
                                        absl::Milliseconds(config_.heartbeat_timeout_ms()),
                                        absl::Milliseconds(SilentConnectionMs(config_))});
    if (!channel.ok()) return channel.status();
    routes_ = std::move(routes);
    channel_ = *std::move(channel);
    epoch_ = map->epoch();
    live_servers_ = LiveServers(*map);
    return absl::OkStatus();
  }

  absl::Status InitTensor(const std::string& name, absl::Span<const float> values, absl::Duration timeout) override {
    auto handle = Start(INIT, name, values.data(), values.size(), nullptr, 0, "InitTensor");
    if (!handle.ok()) return handle.status();
    return channel_->Wait(*handle, timeout);
  }

  absl::Status Barrier(const std::string& name, std::vector<uint32_t>* live_ranks, absl::Duration timeout) override {
    SHARDPS_RETURN_IF_ERROR(CheckName("barrier name", name));
    BarrierRequest request;
    request.set_node_id(node_id_);
    request.set_name(name);
    {
      // A call asked again after the scheduler died is answered at once if
      // the barrier passed meanwhile (the others went on past it).
      absl::MutexLock lock(&mu_);
      request.set_passes_seen(barrier_passes_[name]);
    }
    BarrierResponse response;
    SHARDPS_RETURN_IF_ERROR(AskUntilDeadline(timeout, [&](absl::Duration left) {
      return scheduler_->Barrier(request, left, &response);
    }));
    {
      absl::MutexLock lock(&mu_);
      ++barrier_passes_[name];
    }
    if (live_ranks != nullptr) live_ranks->assign(response.live_workers().begin(), response.live_workers().end());
    return absl::OkStatus();
  }

  // Runs an idempotent control call with the time left of `timeout` (0: the
  // control timeout), again while the scheduler cannot be reached (one that
  // died mid-call and restarted resumes from its state; a dropped connection
  // reconnects), until the deadline.
  absl::Status AskUntilDeadline(absl::Duration timeout, absl::FunctionRef<absl::Status(absl::Duration)> call) {
    const absl::Time deadline = absl::Now() + (timeout > absl::ZeroDuration() ? timeout : options_.control_timeout);
    for (;;) {
      absl::Status s = call(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      if (!absl::IsUnavailable(s) || absl::Now() >= deadline) return s;
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  absl::StatusOr<Handle> Push(const std::string& name, absl::Span<const float> gradient) override {
    return Start(PUSH, name, gradient.data(), gradient.size(), nullptr, 0, "Push");
  }

  absl::StatusOr<Handle> SkipRound(const std::string& name) override {
    if (!RoundBased(config_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SkipRound of '", name, "': this cluster (consistency ", Consistency_Name(config_.consistency()),
          ") applies pushes on arrival, so no round waits for a frozen parameter: push nothing for it"));
    }
    return Start(PUSH, name, nullptr, 0, nullptr, 0, "SkipRound", std::nullopt, Answer::kWeights,
                 /*no_gradient=*/true);
  }

  absl::StatusOr<Handle> Pull(const std::string& name, absl::Span<float> weights) override {
    return Start(PULL, name, nullptr, 0, weights.data(), weights.size(), "Pull");
  }

  absl::StatusOr<Handle> PushPull(const std::string& name, absl::Span<const float> gradient,
                                  absl::Span<float> weights) override {
    return Start(PUSH_PULL, name, gradient.data(), gradient.size(), weights.data(), weights.size(), "PushPull");
  }

  absl::StatusOr<Handle> PushPullMeanGradient(const std::string& name, absl::Span<const float> gradient,
                                              absl::Span<float> mean_gradient) override {
    if (!sum_only()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "PushPullMeanGradient of '", name, "': the cluster's update_mode is not sum_only, so servers answer with "
          "weights, not gradients"));
    }
    return Start(PUSH_PULL, name, gradient.data(), gradient.size(), mean_gradient.data(), mean_gradient.size(),
                 "PushPullMeanGradient", std::nullopt, Answer::kMeanGradient);
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

  absl::StatusOr<size_t> WaitAny(absl::Span<const Handle> handles, absl::Duration timeout,
                                 absl::Status* status) override {
    DataChannel* channel = Channel();
    if (channel == nullptr) return absl::FailedPreconditionError("WaitAny before DefineTensors");
    return channel->WaitAny(handles, timeout, status);
  }

  absl::StatusOr<uint64_t> WeightsVersion(const std::string& name) const override {
    absl::MutexLock lock(&mu_);
    auto it = routes_.find(name);
    if (channel_ == nullptr || it == routes_.end()) {
      return absl::NotFoundError(absl::StrCat("weights version: unknown tensor '", name, "'"));
    }
    uint64_t version = UINT64_MAX;
    for (const PartitionInfo& p : it->second.partitions) version = std::min(version, channel_->weights_version(p.id()));
    return version == UINT64_MAX ? 0 : version;
  }

  WorkerStats stats() const override {
    absl::MutexLock lock(&mu_);
    WorkerStats s;
    if (channel_ != nullptr) {
      s.bytes_pushed = channel_->bytes_sent();
      s.bytes_pulled = channel_->bytes_received();
      s.requests = channel_->requests_sent();
      s.connection_breaks = channel_->connection_breaks();
      s.requests_resent = channel_->requests_resent();
      for (const auto& [partition, acked] : channel_->acked_pushes()) {
        s.acked_pushes[partition] = acked.count;
        s.acked_push_digests[partition] = acked.digest;
      }
    }
    for (const auto& [name, route] : routes_) {
      for (uint64_t rounds : route.rounds_pushed) s.steps = std::max(s.steps, rounds);
    }
    return s;
  }

 private:
  // What a sum-only PUSH_PULL's answer becomes: the configured optimizer's
  // step on the caller's weights, or the mean gradient for the caller's own.
  enum class Answer { kWeights, kMeanGradient };

  // Builds and submits one request per partition (or only partition
  // `only`, whose extent the spans then cover).
  absl::StatusOr<Handle> Start(Op op, const std::string& name, const float* in, size_t in_n, float* out,
                               size_t out_n, absl::string_view verb, std::optional<size_t> only = std::nullopt,
                               Answer answer = Answer::kWeights, bool no_gradient = false) {
    // Rounds are numbered and sent under one lock, so two threads pushing
    // the same tensor cannot put round r+1 on the wire before round r.
    absl::MutexLock send_lock(&send_mu_);
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
      if (sends && op != INIT) {
        // Refused before any partition's momentum or residual moves.
        for (size_t i = first; i < last; ++i) {
          const PartitionState& state = *route.states[i];
          if (!Preconditioned(state, route.rounds_pushed[i])) continue;
          if (absl::Status s = CheckDivisor(state, route.partitions[i].id(), route.rounds_pushed[i]); !s.ok()) {
            return s;
          }
        }
      }
      if (no_gradient && sum_only() && config_.optimizer().freeze_variance_after() > 0) {
        for (size_t i = first; i < last; ++i) {
          if (route.states[i]->codecs.push == nullptr) continue;
          return absl::FailedPreconditionError(absl::StrCat(
              what, ": sum-only 1-bit Adam (optimizer.freeze_variance_after with a compressed tensor) counts "
              "rounds to decide when a partition's pushes become momenta: push zeros for a frozen parameter"));
        }
      }
      requests.reserve(last - first);
      for (size_t i = first; i < last; ++i) {
        const PartitionInfo& p = route.partitions[i];
        DataChannel::Request r;
        r.server = p.server();
        r.header.set_op(op);
        r.header.set_partition_id(p.id());
        r.header.set_round(route.rounds_pushed[i]);
        r.header.set_epoch(epoch_);
        r.header.set_worker_incarnation(node_id_);
        r.header.set_dtype(FLOAT32);
        r.header.set_num_elements(p.num_elements());
        r.header.set_no_gradient(no_gradient);
        PartitionState& state = *route.states[i];
        if (sends) {
          const float* grad = in + (p.offset() - base);
          compression::WireCodec wire;
          if (op != INIT) {
            wire = compression::RoundCodec(config_, state.codecs, compression::Direction::kPush, r.header.round());
          }
          if (!wire.raw()) {
            absl::Status s = Encode(state, p, r.header.round(), wire, grad, &r);
            if (!s.ok()) return s;
          } else {
            r.payload = grad;
          }
        }
        if (receives) SetAnswer(state, op, answer, out + (p.offset() - base), p.num_elements(), &r);
        requests.push_back(std::move(r));
      }
      // Only once every request is built: a failed encode owes no round.
      if (op == PUSH || op == PUSH_PULL) {
        for (size_t i = first; i < last; ++i) {
          ++route.rounds_pushed[i];
          if (no_gradient) ++route.states[i]->skipped;
        }
      }
    }
    if (op == PUSH || op == PUSH_PULL) {
      // The weights this gradient was computed on: servers measure its
      // staleness from them (async and ssp learning rates).
      for (DataChannel::Request& r : requests) r.header.set_based_on(channel_->weights_version(r.header.partition_id()));
    }
    return channel_->Submit(std::move(requests), std::move(what));
  }

  bool sum_only() const { return config_.update_mode() == SUM_ONLY; }

  absl::Status SetUpCompression() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status s = compression::ValidateCompressionConfig(config_); !s.ok()) return s;
    if (sum_only()) {
      auto optimizer = Optimizer::Create(config_.optimizer());
      if (!optimizer.ok()) return optimizer.status();
      optimizer_ = *std::move(optimizer);
    }
    return absl::OkStatus();
  }

  // The error-feedback wrapper of a push codec spec (one per spec; each keeps
  // one residual per partition).
  absl::StatusOr<compression::ErrorFeedback*> Feedback(const std::string& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = feedback_.find(spec);
    if (it != feedback_.end()) return it->second.get();
    auto params = compression::ParseCodecSpec(spec);
    if (!params.ok()) return params.status();
    compression::ErrorFeedbackOptions options;
    if (params->name == "topk") {
      options.momentum = config_.compression().momentum();
      options.warmup_calls = static_cast<int>(config_.compression().warmup_steps());
    }
    auto feedback = compression::ErrorFeedback::Create(*params, options);
    if (!feedback.ok()) return feedback.status();
    return (feedback_[spec] = *std::move(feedback)).get();
  }

  // 1-bit Adam in sum-only mode. Once Adam's variance is frozen, its update
  // is w -= lr * (m / c1) / d with a fixed d (the same on every worker, since
  // all apply the same aggregates), and m is linear in the gradients: the
  // mean of per-worker momenta m_w = b1 m_w + (1 - b1) g_w / d, all started
  // from m / d, is exactly the momentum of the mean gradient in units of d.
  // So a compressed round carries this worker's m_w, the servers sum them,
  // and the worker steps by lr * (sum / W) / c1. Momentum is smoother than a
  // gradient, so a sign or 2-bit code of it loses less; and in units of d
  // the compression error costs every weight the same, lr * error, where in
  // gradient units it would cost lr * error / d, unbounded where d is tiny.
  bool Preconditioned(const PartitionState& state, uint64_t round) const {
    return sum_only() && state.codecs.push != nullptr && !compression::RoundUncompressed(config_, round) &&
           optimizer_->VarianceFrozenAt(round);
  }

  absl::Status CheckDivisor(const PartitionState& state, uint64_t partition_id, uint64_t round) const {
    if (state.divisor_ready.load(std::memory_order_acquire)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "partition ", partition_id, ": round ", round, " is compressed in the units of Adam's variance frozen after ",
        config_.optimizer().freeze_variance_after(),
        " rounds, but that round's aggregate was not applied here yet (wait for each PushPull before the next)"));
  }

  // Compresses one partition's gradient with `wire` into an owned frame of
  // `r`; error feedback only for the partition's own push codec.
  absl::Status Encode(PartitionState& state, const PartitionInfo& p, uint64_t round,
                      const compression::WireCodec& wire, const float* grad, DataChannel::Request* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t n = p.num_elements();
    const uint64_t seed = compression::CodecSeed(p.id(), round);
    auto in = absl::MakeConstSpan(grad, n);
    if (Preconditioned(state, round)) {
      if (absl::Status s = CheckDivisor(state, p.id(), round); !s.ok()) return s;
      const float b1 = config_.optimizer().beta1();
      const float* d = state.divisor.data();
      float* m = state.momentum.data();
      for (size_t i = 0; i < n; ++i) m[i] = d[i] > 0.0f ? b1 * m[i] + (1.0f - b1) * (grad[i] / d[i]) : 0.0f;
      in = absl::MakeConstSpan(state.momentum);
    }
    compression::ErrorFeedback* feedback = nullptr;
    size_t max_bytes = wire.codec->EncodedBytes(n);
    if (config_.compression().error_feedback() && wire.codec == state.codecs.push.get()) {
      auto f = Feedback(wire.spec);
      if (!f.ok()) return f.status();
      feedback = *f;
      max_bytes = feedback->MaxEncodedBytes(n);
    }
    zmq::message_t frame(max_bytes);
    auto out = absl::MakeSpan(frame.data<uint8_t>(), max_bytes);
    auto written = feedback ? feedback->Encode(p.id(), in, seed, out) : wire.codec->Encode(in, seed, out);
    if (!written.ok()) return written.status();
    r->encoded = *written == max_bytes ? std::move(frame) : zmq::message_t(frame.data(), *written);
    r->header.set_codec(wire.spec);
    return absl::OkStatus();
  }

  // How an answer's payload reaches `out` (n floats): copied (raw weights),
  // decoded (compressed weights), or, in sum-only mode, decoded into the
  // aggregate and applied to `out` by this worker's optimizer.
  void SetAnswer(PartitionState& state, Op op, Answer kind, float* out, size_t n, DataChannel::Request* r) {
    const bool aggregate = sum_only() && op == PUSH_PULL;
    const bool delta = compression::PullsWeightDeltas(config_, state.codecs);
    if (!aggregate && (state.codecs.pull == nullptr || sum_only() || (delta && op == PULL))) {
      r->out = out;
      return;
    }
    const bool mean = aggregate && kind == Answer::kMeanGradient;
    const uint64_t skipped = state.skipped;  // before this round
    r->on_answer = [this, &state, out, n, aggregate, delta, mean, skipped](
                       const DataHeader& answer, const zmq::message_t& payload) -> absl::Status {
      if (aggregate && answer.no_gradient()) {
        // No worker pushed a gradient to the round: no step, a zero mean.
        if (mean) std::fill(out, out + n, 0.0f);
        return absl::OkStatus();
      }
      // Nor a weight delta: the weights held in `out` are the round's.
      if (delta && answer.no_gradient() && payload.size() == 0) return absl::OkStatus();
      // The mean over the workers whose gradients the aggregate sums.
      const uint32_t contributors = answer.contributors() > 0 ? answer.contributors() : config_.num_workers();
      const float scale = 1.0f / static_cast<float>(contributors);
      // The aggregate of a warm-up round comes back in the warm-up codec.
      const compression::WireCodec wire =
          aggregate && answer.completed_rounds() > 0
              ? compression::RoundCodec(config_, state.codecs, compression::Direction::kAggregate,
                                        answer.completed_rounds() - 1)
              : compression::WireCodec{state.codecs.pull.get(), state.codecs.pull_spec};
      const bool raw = wire.raw();
      const std::string& expected = wire.spec;
      if (answer.codec() != expected || answer.num_elements() != n) {
        return absl::DataLossError(absl::StrCat("answer encoded as '", answer.codec(), "' with ",
                                                answer.num_elements(), " elements; expected '", expected,
                                                "' with ", n));
      }
      float* target = aggregate ? state.aggregate.data() : out;
      if (raw) {
        if (payload.size() != n * sizeof(float)) return absl::DataLossError("answer payload has the wrong size");
        std::memcpy(target, payload.data(), payload.size());
      } else {
        // The server encodes with the seed of the rounds completed when it
        // answers. A weight delta is added to the weights held in `out`, as
        // the server adds it to its mirror of them.
        const auto bytes = absl::MakeConstSpan(payload.data<uint8_t>(), payload.size());
        const uint64_t seed = compression::CodecSeed(answer.partition_id(), answer.completed_rounds());
        absl::Status s = delta ? wire.codec->DecodeAdd(bytes, seed, absl::MakeSpan(target, n))
                               : wire.codec->Decode(bytes, seed, absl::MakeSpan(target, n));
        if (!s.ok()) return s;
      }
      if (aggregate) {
        if (answer.completed_rounds() == 0) return absl::DataLossError("aggregate answer before any round");
        const uint64_t round = answer.completed_rounds() - 1;
        if (mean) {
          if (Preconditioned(state, round)) {
            return absl::FailedPreconditionError("the aggregate is of Adam momenta (optimizer.freeze_variance_after "
                                                 "with compression), not gradients");
          }
          const float* agg = state.aggregate.data();
          for (size_t i = 0; i < n; ++i) out[i] = agg[i] * scale;
          return absl::OkStatus();
        }
        if (Preconditioned(state, round)) {
          if (absl::Status s = CheckDivisor(state, answer.partition_id(), round); !s.ok()) return s;
          // The aggregate is the sum of the workers' momenta in units of d.
          const float b1 = config_.optimizer().beta1();
          const float step = optimizer_->LearningRate(round) /
                             (1.0f - std::pow(b1, static_cast<float>(round + 1)));
          const float* d = state.divisor.data();
          const float* agg = state.aggregate.data();
          for (size_t i = 0; i < n; ++i) {
            if (d[i] > 0.0f) out[i] -= step * (agg[i] * scale);
          }
          return absl::OkStatus();
        }
        optimizer_->Apply(round, scale, state.aggregate.data(), out, state.optimizer_state.data(), n, 1.0f, skipped);
        if (!state.divisor_ready.load(std::memory_order_relaxed) && Preconditioned(state, round + 1)) {
          // v is final and the next round is compressed: it needs d and the
          // momentum in units of d.
          state.divisor.resize(n);
          state.momentum.resize(n);
          optimizer_->FrozenDivisor(state.optimizer_state.data(), n, state.divisor.data());
          const float* m = state.optimizer_state.data();
          for (size_t i = 0; i < n; ++i) {
            state.momentum[i] = state.divisor[i] > 0.0f ? m[i] / state.divisor[i] : 0.0f;
          }
          state.divisor_ready.store(true, std::memory_order_release);
        }
      }
      return absl::OkStatus();
    };
  }

  // Tells the scheduler this worker is alive (shown by `shardps status`).
  void HeartbeatLoop() {
    const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
    HeartbeatLog log(absl::StrCat("worker ", options_.rank), interval,
                     absl::Milliseconds(config_.heartbeat_timeout_ms()));
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), interval)) {
      HeartbeatRequest request;
      request.set_node_id(node_id_);
      mu_.Unlock();
      const WorkerStats s = stats();
      NodeCounters* c = request.mutable_counters();
      c->set_steps(s.steps);
      c->set_bytes_in(s.bytes_pulled);
      c->set_bytes_out(s.bytes_pushed);
      c->set_requests(s.requests);
      if (auto late = log.Sending(absl::Now())) LOG(WARNING) << *late;
      auto r = scheduler_->Heartbeat(request, interval);
      const std::optional<std::string> told = log.Answered(r.status(), absl::Now());
      if (absl::IsFailedPrecondition(r.status())) {
        // Declared dead (e.g. it stalled past the heartbeat timeout): the job
        // went on without it, so nothing it sends may count any more.
        LOG(ERROR) << "worker " << options_.rank << ": " << r.status();
        if (DataChannel* channel = Channel()) {
          channel->FailAll(absl::FailedPreconditionError(absl::StrCat("this worker (rank ", options_.rank, ") ",
                                                                      r.status().message())));
        }
      } else if (told) {
        LOG(WARNING) << *told;
      }
      mu_.Lock();
    }
  }

  // The last heartbeat: the scheduler removes this worker from the job now
  // (sync rounds and barriers go on without it) instead of declaring it dead
  // once its heartbeats stop. Bounded by one heartbeat interval (at most 2 s):
  // a scheduler that does not answer then finds it silent, as before.
  void SetLeavingError(const std::string& error) override {
    // UTF-8, as a proto3 string must be: the scheduler drops a heartbeat
    // that is not (the leave lost), and keeps 4096 bytes of it.
    std::string kept = ToUtf8(error, 4096);
    absl::MutexLock lock(&mu_);
    leaving_error_ = std::move(kept);
  }

  void Leave() {
    std::string error;
    {
      absl::MutexLock lock(&mu_);
      error = leaving_error_;
    }
    if (!error.empty()) LOG(ERROR) << "worker " << options_.rank << " leaves the job on an error: " << error;
    absl::Status s = SayLeaving(*scheduler_, node_id_, config_, error);
    if (!s.ok() && !absl::IsFailedPrecondition(s)) {  // FailedPrecondition: no longer a member anyway
      LOG(WARNING) << "worker " << options_.rank << ": could not tell the scheduler it leaves (" << s
                   << "); it will be declared dead after heartbeat_timeout_ms";
    }
  }

  static uint32_t LiveServers(const ShardMap& map) {
    return static_cast<uint32_t>(
        std::count_if(map.servers().begin(), map.servers().end(), [](const ServerInfo& s) { return !s.dead(); }));
  }

  DataChannel* Channel() {
    absl::MutexLock lock(&mu_);
    return channel_.get();
  }

  // Fails the requests to servers the scheduler declared dead, naming them.
  void FollowMembership(const ShardMap& map, DataChannel* channel) {
    if (channel == nullptr) return;
    // Partitions whose primary moved (a backup promoted): route new requests
    // there and re-send the waiting ones with their request ids.
    absl::flat_hash_map<uint64_t, uint32_t> moved;
    // Under send_mu_, as Start builds and submits: a request built with the
    // old routes is in the channel before Reroute looks, or it is built with
    // the new ones. One submitted in between would reach the old primary
    // after the re-send, and a primary that handed its role off leaves it
    // unanswered for the worker to re-send, which then never comes.
    int resent = 0;
    {
      absl::MutexLock send_lock(&send_mu_);
      bool older;  // than the map the routes and node ids below came from
      {
        absl::MutexLock lock(&mu_);
        older = map.epoch() < epoch_;
      }
      // Servers that joined the job as more than it had: connected before
      // any route can name them, in index order.
      std::vector<const ServerInfo*> joined;
      const size_t known_servers = channel->servers();
      for (const ServerInfo& s : map.servers()) {
        if (s.index() >= known_servers) joined.push_back(&s);
      }
      std::sort(joined.begin(), joined.end(), [](auto* a, auto* b) { return a->index() < b->index(); });
      for (const ServerInfo* s : joined) {
        if (absl::Status r = channel->Readdress(s->index(), {s->data_address(), s->curve_public_key(), s->sealed_data()});
            !r.ok()) {
          LOG(ERROR) << "worker " << options_.rank << ": " << r;
        } else {
          LOG(INFO) << "worker " << options_.rank << ": server " << s->index() << " (" << s->data_address()
                    << ") joined the job at shard map epoch " << map.epoch();
        }
      }
      // What is queued for a dead server goes before the routes change, with
      // send_mu_ held: a request submitted after the drop but built with the
      // old routes would wait in the new connection's queue for a
      // replacement at the dead server's address, behind its own re-sent and
      // answered copy, and be sent from a buffer its caller reused. The same
      // holds for a server replaced in maps this worker skipped (the map
      // declaring it dead among them): another process at its index, perhaps
      // at its address, gets none of the old one's queue, and what waits for
      // it is sent to the new one below.
      std::vector<uint32_t> replaced;
      for (const ServerInfo& s : map.servers()) {
        if (s.dead()) channel->DropQueued(s.index());
        if (older || s.node_id() == 0) continue;
        if (server_process_.size() <= s.index()) server_process_.resize(s.index() + 1, 0);
        uint64_t& known = server_process_[s.index()];
        if (!s.dead() && known != 0 && known != s.node_id()) {
          replaced.push_back(s.index());
          channel->DropQueued(s.index());
          if (absl::Status r = channel->Readdress(s.index(), {s.data_address(), s.curve_public_key(), s.sealed_data()});
              !r.ok()) {
            LOG(ERROR) << "worker " << options_.rank << ": " << r;
          }
        }
        known = s.node_id();
      }
      {
        absl::MutexLock lock(&mu_);
        absl::flat_hash_map<uint64_t, uint32_t> primary_of;
        for (const PartitionInfo& p : map.partitions()) primary_of[p.id()] = p.server();
        for (auto& [name, route] : routes_) {
          for (PartitionInfo& p : route.partitions) {
            auto it = primary_of.find(p.id());
            if (it == primary_of.end() || it->second == p.server() || map.epoch() <= epoch_) continue;
            p.set_server(it->second);
            moved[p.id()] = it->second;
          }
        }
        if (map.epoch() >= epoch_) live_servers_ = LiveServers(map);
        epoch_ = std::max(epoch_, map.epoch());
      }
      // One pass: a request moved to a replaced server is sent there once.
      if (!moved.empty() || !replaced.empty()) resent = channel->Reroute(moved, map.epoch(), replaced);
      for (uint32_t server : replaced) {
        LOG(WARNING) << "worker " << options_.rank << ": server " << server << " was replaced by another process "
                     << "in shard maps this worker skipped; what waited for it is sent to the new one again";
      }
      // Refused from here on, before a request with the routes just left can
      // be queued for them (a partition with no live replica stays routed
      // to its dead server).
      for (const ServerInfo& s : map.servers()) {
        if (!s.dead()) continue;
        // Once per death: every later map lists it dead too.
        if (reported_dead_.insert(absl::StrCat(s.node_id(), " ", s.data_address(), " ", s.dead_reason())).second) {
          // An error only where partitions are left on it (no live replica):
          // otherwise they failed over, or it was drained of them.
          const bool holds = absl::c_any_of(map.partitions(), [&s](const PartitionInfo& p) { return p.server() == s.index(); });
          LOG_IF(ERROR, holds) << "worker " << options_.rank << ": server " << s.index() << " (" << s.data_address()
                               << ") is out of the job at shard map epoch " << map.epoch() << ": " << s.dead_reason()
                               << "; partitions it was the primary of have no live replica";
          LOG_IF(WARNING, !holds) << "worker " << options_.rank << ": server " << s.index() << " ("
                                  << s.data_address() << ") is out of the job at shard map epoch " << map.epoch()
                                  << ": " << s.dead_reason() << "; its partitions are served by the others";
        }
        channel->FailServer(s.index(), absl::UnavailableError(absl::StrCat(
                                           "server ", s.index(), " was declared dead by the scheduler at shard map "
                                           "epoch ", map.epoch(), " (", s.dead_reason(), "); its partitions have no "
                                           "live replica")));
      }
    }
    if (!moved.empty() || resent > 0) {
      LOG(WARNING) << "worker " << options_.rank << ": "
                   << Counted(moved.size(), "partition moved to its backup", "partitions moved to their backups")
                   << " at shard map epoch " << map.epoch() << "; re-sent "
                   << Counted(resent, "waiting request", "waiting requests");
    }
    for (const ServerInfo& s : map.servers()) {
      if (s.dead()) continue;
      // A server that took a dead one's place: its index's new address.
      if (absl::Status r = channel->Readdress(s.index(), {s.data_address(), s.curve_public_key(), s.sealed_data()}); !r.ok()) {
        LOG(ERROR) << "worker " << options_.rank << ": " << r;
      }
    }
  }

  const std::shared_ptr<SchedulerClient> scheduler_;
  WorkerOptions options_;  // control_timeout resolved at construction
  // Registered with the scheduler; secured servers admit only such keys.
  // Empty: security off (a fresh pair per socket, should a server use CURVE).
  const CurveKeyPair curve_keys_;
  const uint64_t node_id_;
  const ClusterConfig config_;
  Rejoin rejoin_;  // set at construction
  // Held from numbering a request to handing it to the channel.
  absl::Mutex send_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // By server index: the scheduler's id of the process serving it, as the
  // last map said (ServerInfo.node_id; 0: not known).
  std::vector<uint64_t> server_process_ ABSL_GUARDED_BY(send_mu_);
  // The dead servers this worker has logged (process, address and reason).
  absl::flat_hash_set<std::string> reported_dead_ ABSL_GUARDED_BY(send_mu_);
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Live servers of the newest map (num_servers()); the config's until the first.
  uint32_t live_servers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TensorRoute> routes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DataChannel> channel_;  // set once under mu_, then read-only
  std::unique_ptr<Optimizer> optimizer_;  // sum-only mode; set once with channel_
  absl::flat_hash_map<std::string, std::unique_ptr<compression::ErrorFeedback>> feedback_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string leaving_error_ ABSL_GUARDED_BY(mu_);  // SetLeavingError
  // By barrier name: the passes this process has seen (BarrierRequest.passes_seen).
  absl::flat_hash_map<std::string, uint64_t> barrier_passes_ ABSL_GUARDED_BY(mu_);
  std::thread heartbeat_;
  // From the first successful DefineTensors on; set by the thread that
  // defines (DefineTensors is not called concurrently with itself).
  std::unique_ptr<SchedulerClient::Watch> watch_;
};

}  // namespace

const Worker::Rejoin& Worker::rejoin() const {
  static const Rejoin* const kFromTheStart = new Rejoin();
  return *kFromTheStart;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options) {
  std::shared_ptr<SchedulerClient> scheduler = options.scheduler_client;
  if (scheduler == nullptr) {
    auto created = SchedulerClient::Create(options.scheduler_address, options.security);
    if (!created.ok()) return created.status();
    scheduler = *std::move(created);
  }
  RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_role(WORKER);
  request.set_rank(options.rank);
  request.set_host(options.host.empty() ? LocalHostName() : options.host);
  CurveKeyPair curve_keys;
  if (options.security.enabled) {
    auto made = NewCurveKeyPair();
    if (!made.ok()) return made.status();
    curve_keys = *std::move(made);
    request.set_curve_public_key(curve_keys.public_key);
  }
  // A process started again for a rank whose previous one was killed (a pod
  // restarted, a script run again) waits, within the rendezvous timeout, for
  // the scheduler to declare that one dead, as it waits for the cluster.
  const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
  absl::StatusOr<RegisterResponse> registered;
  for (bool said = false;; said = true) {
    registered = scheduler->Register(request, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    // A rejoin's wait goes on: asking again shows the scheduler this process still reaches it.
    while (absl::IsAborted(registered.status()) && IsRejoinAskAgainRefusal(registered.status().message()) &&
           absl::Now() < deadline) {
      registered = scheduler->Register(request, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    }
    if (registered.ok() || !absl::IsAlreadyExists(registered.status()) ||
        !IsRankStillHeldRefusal(registered.status().message()) || absl::Now() + absl::Milliseconds(250) >= deadline) {
      break;
    }
    if (!said) {
      LOG(WARNING) << "worker " << options.rank << ": " << registered.status().message()
                   << "; waiting for that (up to the rendezvous timeout, "
                   << absl::FormatDuration(options.rendezvous_timeout) << ")";
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (absl::IsAborted(registered.status()) && IsRejoinAskAgainRefusal(registered.status().message())) {
    // The rendezvous timeout ended while the scheduler still waited: said as
    // a timeout, not as the scheduler's request to ask again.
    return absl::DeadlineExceededError(absl::StrCat(
        "worker rank ", options.rank, ": the scheduler at ", options.scheduler_address,
        " still waited for the servers' reports before this rank rejoins the running job when the rendezvous "
        "timeout (", absl::FormatDuration(options.rendezvous_timeout), ") ended; are the servers alive?"));
  }
  if (!registered.ok()) return registered.status();
  return std::unique_ptr<Worker>(
      new WorkerImpl(std::move(scheduler), options, *std::move(registered), std::move(curve_keys)));
}

}  // namespace shardps
