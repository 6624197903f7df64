#include <algorithm>
#include <chrono>
#include <vector>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "worker/local_tier/device_cuda.h"
#include "worker/local_tier/device_cuda_internal.h"

namespace shardps {
namespace {

// Device memory buffer; frees it on destruction. Copies run on the owning
// device's stream and return once complete.
class CudaBuffer : public DeviceBuffer {
 public:
  CudaBuffer(CudaDevice& device, float* data, size_t size)
      : DeviceBuffer(device, data, size), cuda_(device) {}
  ~CudaBuffer() override {
    ScopedCudaDevice scoped(cuda_.ordinal());
    cudaFree(data());  // Errors at teardown have no one to report to.
  }

  absl::Status CopyFromHost(absl::Span<const float> src, size_t offset) override {
    return Copy(data() + offset, src.data(), offset, src.size(), cudaMemcpyHostToDevice);
  }
  absl::Status CopyToHost(size_t offset, absl::Span<float> dst) const override {
    return Copy(dst.data(), data() + offset, offset, dst.size(), cudaMemcpyDeviceToHost);
  }
  absl::Status CopyFrom(const DeviceBuffer& src) override {
    absl::Status shape = CheckSameShape(src);
    if (!shape.ok() || size() == 0) return shape;
    ScopedCudaDevice scoped(cuda_.ordinal());
    if (!scoped.status().ok()) return scoped.status();
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(data(), cuda_.ordinal(), src.data(),
                                                     src.device().ordinal(), size() * sizeof(float),
                                                     cuda_.stream()));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_.stream()));
    return absl::OkStatus();
  }

 private:
  absl::Status Copy(float* to, const float* from, size_t offset, size_t len,
                    cudaMemcpyKind kind) const {
    absl::Status range = CheckRange(offset, len);
    if (!range.ok() || len == 0) return range;
    ScopedCudaDevice scoped(cuda_.ordinal());
    if (!scoped.status().ok()) return scoped.status();
    SHARDPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(to, from, len * sizeof(float), kind, cuda_.stream()));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_.stream()));
    return absl::OkStatus();
  }

  CudaDevice& cuda_;
};

}  // namespace

ScopedCudaDevice::ScopedCudaDevice(int ordinal) : status_(Enter(ordinal, &previous_)) {}

absl::Status ScopedCudaDevice::Enter(int ordinal, int* previous) {
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaGetDevice(previous));
  if (*previous != ordinal) SHARDPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return absl::OkStatus();
}

ScopedCudaDevice::~ScopedCudaDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

CudaDevice::CudaDevice(int ordinal, int index, cudaStream_t stream)
    : Device(DeviceKind::kCuda, index, ordinal,
             std::make_unique<DeviceThread>([ordinal] { cudaSetDevice(ordinal); })),
      stream_(stream) {}

CudaDevice::~CudaDevice() {
  ScopedCudaDevice scoped(ordinal());
  cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal, int index) {
  ScopedCudaDevice scoped(ordinal);
  if (!scoped.status().ok()) return scoped.status();
  cudaStream_t stream = nullptr;
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, index, stream));
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaDevice::Allocate(size_t num_floats) {
  ScopedCudaDevice scoped(ordinal());
  if (!scoped.status().ok()) return scoped.status();
  void* data = nullptr;
  const size_t bytes = (num_floats > 0 ? num_floats : 1) * sizeof(float);
  if (cudaMalloc(&data, bytes) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky-free allocation error.
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": cannot allocate ", bytes, " bytes of device memory"));
  }
  auto buffer = std::make_unique<CudaBuffer>(*this, static_cast<float*>(data), num_floats);
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, bytes, stream_));
  SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return std::unique_ptr<DeviceBuffer>(std::move(buffer));
}

CudaDevice& AsCudaDevice(Device& device) { return static_cast<CudaDevice&>(device); }

bool CudaBuilt() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, int index) {
  const int gpus = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= gpus) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", ordinal, " requested but ", gpus, " GPU(s) found"));
  }
  SHARDPS_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal, index));
  return std::unique_ptr<Device>(std::move(device));
}

namespace {

// Times `iters` device-to-host copies after one warm-up; `stream` on `ordinal`.
absl::StatusOr<double> TimePinnedCopies(void* host, const void* device, size_t bytes, int iters,
                                        cudaStream_t stream) {
  std::vector<double> seconds;
  for (int i = 0; i <= iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    SHARDPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
    SHARDPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const auto end = std::chrono::steady_clock::now();
    if (i > 0) seconds.push_back(std::chrono::duration<double>(end - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

absl::StatusOr<double> CudaPinnedToHostSeconds(int ordinal, size_t bytes, int iters) {
  if (bytes == 0 || iters < 1) {
    return absl::InvalidArgumentError("pinned copy: bytes and iters must be positive");
  }
  ScopedCudaDevice scoped(ordinal);
  SHARDPS_RETURN_IF_ERROR(scoped.status());
  void* device = nullptr;
  void* host = nullptr;
  cudaStream_t stream = nullptr;
  absl::StatusOr<double> result = absl::InternalError("pinned copy: not run");
  absl::Status setup = CudaStatus(cudaMalloc(&device, bytes), "cudaMalloc", __FILE__, __LINE__);
  if (setup.ok()) {
    setup = CudaStatus(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc", __FILE__, __LINE__);
  }
  if (setup.ok()) {
    setup = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
  result = setup.ok() ? TimePinnedCopies(host, device, bytes, iters, stream) : setup;
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (host != nullptr) cudaFreeHost(host);
  if (device != nullptr) cudaFree(device);
  return result;
}

}  // namespace shardps
