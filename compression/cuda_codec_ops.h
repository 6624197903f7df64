// GPU versions of every codec, declared without CUDA headers so callers stay
// plain C++. Implemented in cuda_codec_ops.cu when the build has CUDA
// (SHARDPS_WITH_CUDA=1); otherwise every call returns Unimplemented and
// CudaDeviceAvailable() is false.
//
// Memory: all buffers are caller-owned DEVICE memory, 4-byte aligned. `stream`
// is a cudaStream_t (nullptr = legacy default stream). Payloads are the exact
// wire formats of the CPU codecs (DESIGN_NOTES.md) and, for the same input and
// seed, bit-identical to them; so is the residual of the fused error feedback
// (equal to ErrorFeedback without momentum/warm-up). Thread-safe like the
// CUDA runtime: concurrent calls need distinct workspaces.
#ifndef SHARDPS_COMPRESSION_CUDA_CODEC_OPS_H_
#define SHARDPS_COMPRESSION_CUDA_CODEC_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec_params.h"

namespace shardps::compression {

// True when this build has the CUDA kernels and cudaGetDeviceCount() > 0.
bool CudaDeviceAvailable();

// Device workspace bytes CudaEncode/CudaDecode need for n values.
absl::StatusOr<size_t> CudaWorkspaceBytes(const CodecParams& params, size_t n);

// Encodes n floats `in` into `out` (out_bytes >= the codec's EncodedBytes(n))
// and returns the payload size. With a non-null `residual` (n floats) error
// feedback is fused into the same pass: v = in + residual is encoded and
// residual = v - decode(v). topk synchronises `stream` once (it reads the
// candidate count); the other codecs only enqueue work.
absl::StatusOr<size_t> CudaEncode(const CodecParams& params, const float* in, size_t n,
                                  float* residual, uint64_t seed, uint8_t* out, size_t out_bytes,
                                  void* workspace, size_t workspace_bytes, void* stream);

// out = (accumulate ? out + : ) decode(in[0, in_bytes)) for n values.
// Validates like Codec::Decode (synchronising `stream` to read the verdict)
// and leaves `out` untouched on InvalidArgument.
absl::Status CudaDecode(const CodecParams& params, const uint8_t* in, size_t in_bytes,
                        uint64_t seed, float* out, size_t n, bool accumulate, void* workspace,
                        size_t workspace_bytes, void* stream);

// Median device throughput of CudaEncode/CudaDecode on n random floats and of a
// device-to-device copy of the same n*4 bytes, in GB/s of fp32 input.
struct CudaCodecTiming {
  double compress_gbps = 0;
  double decompress_gbps = 0;
  double copy_gbps = 0;
};
absl::StatusOr<CudaCodecTiming> CudaBenchCodec(const CodecParams& params, size_t n, int iters);

}  // namespace shardps::compression

#endif  // SHARDPS_COMPRESSION_CUDA_CODEC_OPS_H_
