#include "worker/local_tier/local_reducer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/local_tier/local_cpu_reducer.h"
#include "worker/local_tier/local_cuda_reducer.h"

namespace shardps {

absl::StatusOr<std::unique_ptr<LocalReducer>> LocalReducer::Create(std::vector<Device*> devices,
                                                                   LocalReducerOptions options) {
  if (devices.empty()) return absl::InvalidArgumentError("LocalReducer needs at least one device");
  for (Device* device : devices) {
    if (device == nullptr || device->kind() != devices[0]->kind()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LocalReducer devices must all be ", DeviceKindName(devices[0]->kind()), " devices"));
    }
  }
  auto reducer = devices[0]->kind() == DeviceKind::kCpu
                     ? CpuLocalReducer::Create(std::move(devices), options)
                     : CreateCudaLocalReducer(std::move(devices), options);
  if (!reducer.ok()) return reducer.status();
  SHARDPS_RETURN_IF_ERROR((*reducer)->InitCodecs(options));
  return reducer;
}

absl::Status LocalReducer::InitCodecs(const LocalReducerOptions& options) {
  if (options.push_codec.has_value()) {
    SHARDPS_ASSIGN_OR_RETURN(push_codec_, compression::CreateCodec(*options.push_codec));
    if (options.error_feedback) {
      SHARDPS_ASSIGN_OR_RETURN(feedback_, compression::ErrorFeedback::Create(*options.push_codec));
    }
  }
  SHARDPS_ASSIGN_OR_RETURN(pull_codec_, compression::CreateCodec(options.pull_codec.value_or(
                                            compression::CodecParams{})));
  return absl::OkStatus();
}

size_t LocalReducer::PayloadBytes(size_t length) const {
  if (feedback_ != nullptr) return feedback_->MaxEncodedBytes(length);
  return push_codec_ ? push_codec_->EncodedBytes(length) : length * sizeof(float);
}

size_t LocalReducer::PlanPayloads(absl::Span<const EncodeRange> ranges) {
  payload_offsets_.clear();
  size_t total = 0;
  for (const EncodeRange& range : ranges) {
    payload_offsets_.push_back(total);
    total += (PayloadBytes(range.length) + 255) / 256 * 256;
  }
  return total;
}

template <typename Buffer>
absl::Status LocalReducer::CheckBuffers(absl::Span<Buffer* const> buffers, size_t offset,
                                        size_t len) const {
  if (buffers.size() != devices_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", buffers.size(), " buffers for ", devices_.size(), " devices"));
  }
  for (size_t d = 0; d < buffers.size(); ++d) {
    if (buffers[d] == nullptr || &buffers[d]->device() != devices_[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer ", d, " does not live on ", devices_[d]->name()));
    }
    if (offset > buffers[d]->size() || len > buffers[d]->size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", offset + len,
                                                     ") exceeds buffer ", d, " of ",
                                                     buffers[d]->size(), " floats"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalReducer::Merge(absl::Span<const DeviceBuffer* const> inputs, size_t offset,
                                 absl::Span<float> out, MergeOp op) {
  absl::Status valid = CheckBuffers(inputs, offset, out.size());
  if (!valid.ok() || out.empty()) return valid;
  absl::MutexLock lock(&call_mu_);
  return DoMerge(inputs, offset, out, op);
}

absl::Status LocalReducer::Broadcast(absl::Span<const float> in,
                                     absl::Span<DeviceBuffer* const> outputs, size_t offset) {
  absl::Status valid = CheckBuffers(outputs, offset, in.size());
  if (!valid.ok() || in.empty()) return valid;
  absl::MutexLock lock(&call_mu_);
  return DoBroadcast(in, outputs, offset);
}

absl::Status LocalReducer::MergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op,
                                       PayloadSink sink) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    absl::Status valid = CheckBuffers(ranges[i].inputs, ranges[i].offset, ranges[i].length);
    if (valid.ok() && ranges[i].length == 0) valid = absl::InvalidArgumentError("empty range");
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("MergeEncode range ", i, ": ", valid.message()));
    }
  }
  absl::MutexLock lock(&call_mu_);
  return DoMergeEncode(ranges, op, sink);
}

absl::Status LocalReducer::DecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed,
                                           size_t length, bool accumulate,
                                           absl::Span<DeviceBuffer* const> outputs, size_t offset) {
  absl::Status valid = CheckBuffers(outputs, offset, length);
  if (!valid.ok() || length == 0) return valid;
  absl::MutexLock lock(&call_mu_);
  return DoDecodeBroadcast(payload, seed, length, accumulate, outputs, offset);
}

absl::Status LocalReducer::DoMergeEncode(absl::Span<const EncodeRange> ranges, MergeOp op,
                                         PayloadSink sink) {
  host_payloads_.resize(PlanPayloads(ranges));
  for (size_t i = 0; i < ranges.size(); ++i) {
    const EncodeRange& r = ranges[i];
    uint8_t* payload = host_payloads_.data() + payload_offsets_[i];
    const size_t bytes = PayloadBytes(r.length);
    if (push_codec_ == nullptr) {  // Merge straight into the payload: no second copy.
      SHARDPS_RETURN_IF_ERROR(
          DoMerge(r.inputs, r.offset, absl::MakeSpan(reinterpret_cast<float*>(payload), r.length), op));
    } else {
      host_values_.resize(r.length);
      SHARDPS_RETURN_IF_ERROR(DoMerge(r.inputs, r.offset, absl::MakeSpan(host_values_), op));
      absl::Span<uint8_t> out(payload, bytes);
      SHARDPS_ASSIGN_OR_RETURN(size_t written,
                               feedback_ ? feedback_->Encode(r.residual_key, host_values_, r.seed, out)
                                         : push_codec_->Encode(host_values_, r.seed, out));
      if (written != bytes) {
        return absl::InternalError(absl::StrCat("MergeEncode: ", push_codec_->params().name, " wrote ",
                                                written, " bytes, expected ", bytes));
      }
    }
    SHARDPS_RETURN_IF_ERROR(sink(i, absl::MakeConstSpan(payload, bytes)));
  }
  return absl::OkStatus();
}

absl::Status LocalReducer::DoDecodeBroadcast(absl::Span<const uint8_t> payload, uint64_t seed,
                                             size_t length, bool accumulate,
                                             absl::Span<DeviceBuffer* const> outputs,
                                             size_t offset) {
  host_values_.resize(length);
  absl::Span<float> values = absl::MakeSpan(host_values_);
  if (accumulate) {
    SHARDPS_RETURN_IF_ERROR(outputs[0]->CopyToHost(offset, values));
    SHARDPS_RETURN_IF_ERROR(pull_codec_->DecodeAdd(payload, seed, values));
  } else {
    SHARDPS_RETURN_IF_ERROR(pull_codec_->Decode(payload, seed, values));
  }
  return DoBroadcast(values, outputs, offset);
}

}  // namespace shardps
