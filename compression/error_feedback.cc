#include "compression/error_feedback.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/kernel_util.h"

namespace shardps::compression {
namespace {

absl::Status CheckOptions(const CodecParams& params, const ErrorFeedbackOptions& o) {
  const bool topk = params.name == "topk";
  if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", o.momentum));
  }
  if (o.warmup_calls < 0 || o.warmup_calls > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_calls must be in [0, 10000], got ", o.warmup_calls));
  }
  if ((o.momentum > 0.0f || o.warmup_calls > 0) && !topk) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum correction and warm-up need codec topk, not ", params.name));
  }
  if (o.warmup_calls > 0 && !(o.warmup_start_ratio > 0.0f && o.warmup_start_ratio <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("warmup_start_ratio must be in (0, 1], got ",
                                                   o.warmup_start_ratio));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ErrorFeedback>> ErrorFeedback::Create(
    const CodecParams& params, const ErrorFeedbackOptions& options) {
  SHARDPS_RETURN_IF_ERROR(ValidateCodecParams(params));
  SHARDPS_RETURN_IF_ERROR(CheckOptions(params, options));
  std::vector<std::unique_ptr<Codec>> codecs;
  for (int i = 0; i < options.warmup_calls; ++i) {
    CodecParams step = params;
    const double progress = static_cast<double>(i) / options.warmup_calls;
    step.ratio = static_cast<float>(options.warmup_start_ratio *
                                    std::pow(params.ratio / options.warmup_start_ratio, progress));
    SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CreateCodec(step));
    codecs.push_back(std::move(codec));
  }
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CreateCodec(params));
  codecs.push_back(std::move(codec));
  return std::unique_ptr<ErrorFeedback>(new ErrorFeedback(std::move(codecs), options));
}

ErrorFeedback::ErrorFeedback(std::vector<std::unique_ptr<Codec>> codecs,
                             const ErrorFeedbackOptions& options)
    : codecs_(std::move(codecs)), options_(options) {}

size_t ErrorFeedback::MaxEncodedBytes(size_t n) const {
  size_t bytes = 0;
  for (const auto& codec : codecs_) bytes = std::max(bytes, codec->EncodedBytes(n));
  return bytes;
}

std::shared_ptr<ErrorFeedback::KeyState> ErrorFeedback::StateFor(uint64_t key) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<KeyState>& state = states_[key];
  if (state == nullptr) state = std::make_shared<KeyState>();
  return state;  // Shared: Reset() may drop the map entry while a call runs.
}

absl::StatusOr<size_t> ErrorFeedback::Encode(uint64_t key, absl::Span<const float> grad,
                                             uint64_t seed, absl::Span<uint8_t> out) {
  if (out.size() < MaxEncodedBytes(grad.size()) || grad.size() > Codec::kMaxElements) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback: output of ", out.size(),
                                                   " bytes, need ", MaxEncodedBytes(grad.size())));
  }
  const std::shared_ptr<KeyState> state = StateFor(key);
  KeyState& s = *state;
  absl::MutexLock lock(&s.mu);
  if (s.calls > 0 && s.residual.size() != grad.size()) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback key ", key, " holds ",
                                                   s.residual.size(), " values, got ", grad.size()));
  }
  const size_t step = std::min<size_t>(s.calls, codecs_.size() - 1);
  const Codec& codec = *codecs_[step];
  Accumulate(s, grad);
  SHARDPS_ASSIGN_OR_RETURN(size_t bytes, codec.Encode(s.residual, seed, out));
  SHARDPS_RETURN_IF_ERROR(SubtractDecoded(s, codec, out.subspan(0, bytes), seed));
  ++s.calls;
  return bytes;
}

void ErrorFeedback::Accumulate(KeyState& s, absl::Span<const float> grad) {
  const size_t n = grad.size();
  if (s.residual.size() != n) s.residual.assign(n, 0.0f);
  float* r = s.residual.data();
  if (options_.momentum == 0.0f) {
    ForEachChunk(n, kChunkElements, codec().params().num_threads, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) r[i] += grad[i];
    });
    return;
  }
  if (s.velocity.size() != n) s.velocity.assign(n, 0.0f);
  float* u = s.velocity.data();
  const float m = options_.momentum;
  ForEachChunk(n, kChunkElements, codec().params().num_threads, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      u[i] = m * u[i] + grad[i];
      r[i] += u[i];
    }
  });
}

absl::Status ErrorFeedback::SubtractDecoded(KeyState& s, const Codec& codec,
                                            absl::Span<const uint8_t> payload, uint64_t seed) {
  const size_t n = s.residual.size();
  thread_local std::vector<float> decoded;
  decoded.resize(n);
  float* d = decoded.data();
  SHARDPS_RETURN_IF_ERROR(codec.Decode(payload, seed, absl::MakeSpan(d, n)));
  float* r = s.residual.data();
  ForEachChunk(n, kChunkElements, codec.params().num_threads, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) r[i] -= d[i];
  });
  if (!s.velocity.empty()) {  // DGC: entries sent leave the velocity too (topk payload).
    const size_t count = LoadU32(payload.data());
    for (size_t j = 0; j < count; ++j) {
      const uint32_t index = LoadU32(payload.data() + 4 + 8 * j);
      s.velocity[index] = 0.0f;
      s.residual[index] = 0.0f;
    }
  }
  return absl::OkStatus();
}

std::vector<float> ErrorFeedback::Residual(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  auto it = states_.find(key);
  if (it == states_.end()) return {};
  absl::MutexLock key_lock(&it->second->mu);
  return it->second->residual;
}

ErrorFeedback::KeyCopy ErrorFeedback::Save(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  auto it = states_.find(key);
  if (it == states_.end()) return {};
  absl::MutexLock key_lock(&it->second->mu);
  return KeyCopy{it->second->residual, it->second->velocity, it->second->calls};
}

void ErrorFeedback::Restore(uint64_t key, KeyCopy copy) {
  if (copy.calls == 0) {
    Reset(key);
    return;
  }
  const std::shared_ptr<KeyState> state = StateFor(key);
  absl::MutexLock lock(&state->mu);
  state->residual = std::move(copy.residual);
  state->velocity = std::move(copy.velocity);
  state->calls = copy.calls;
}

void ErrorFeedback::Reset(uint64_t key) {
  absl::MutexLock lock(&mu_);
  states_.erase(key);
}

size_t ErrorFeedback::num_keys() const {
  absl::MutexLock lock(&mu_);
  return states_.size();
}

}  // namespace shardps::compression
