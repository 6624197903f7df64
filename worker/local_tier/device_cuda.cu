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

}  // namespace shardps
