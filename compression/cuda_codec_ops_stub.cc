// Stand-in for cuda_codec_ops.cu in builds without nvcc: no device, and every
// operation reports Unimplemented.
#include "compression/cuda_codec_ops.h"

namespace shardps::compression {
namespace {
absl::Status NoCuda() { return absl::UnimplementedError("ShardPS was built without CUDA"); }
}  // namespace

bool CudaDeviceAvailable() { return false; }

absl::StatusOr<size_t> CudaWorkspaceBytes(const CodecParams&, size_t) { return NoCuda(); }

absl::StatusOr<size_t> CudaEncode(const CodecParams&, const float*, size_t, float*, uint64_t,
                                  uint8_t*, size_t, void*, size_t, void*) {
  return NoCuda();
}

absl::Status CudaDecode(const CodecParams&, const uint8_t*, size_t, uint64_t, float*, size_t,
                        bool, void*, size_t, void*) {
  return NoCuda();
}

absl::StatusOr<CudaCodecTiming> CudaBenchCodec(const CodecParams&, size_t, int) {
  return NoCuda();
}

}  // namespace shardps::compression
