#include "cuda_device.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"

namespace nereus::detail {

std::string cuda_error(int code) {
  const auto e = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

namespace {

/// Makes `gpu` current for the calling thread; throws naming the logical device.
void use_gpu(DeviceId id, int gpu) {
  if (cudaError_t e = cudaSetDevice(gpu); e != cudaSuccess)
    throw Error("device " + std::to_string(id) + ": CUDA device " + std::to_string(gpu) + " is not usable: " + cuda_error(e));
}

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  ~CudaEvent() override { cudaEventDestroy(e_); }
  // Any answer but "not ready" ends the wait: an error is the queue's to report.
  bool ready() const override { return cudaEventQuery(e_) != cudaErrorNotReady; }

 private:
  cudaEvent_t e_;
};

class CudaQueue final : public DeviceQueue {
 public:
  CudaQueue(DeviceId id, int gpu) : id_(id), gpu_(gpu) {
    use_gpu(id, gpu);
    if (cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking); e != cudaSuccess)
      throw Error("device " + std::to_string(id) + ": cannot create a CUDA stream: " + cuda_error(e));
  }
  ~CudaQueue() override { cudaStreamDestroy(s_); }
  std::unique_ptr<DeviceEvent> record() override {
    use_gpu(id_, gpu_);
    cudaEvent_t e = nullptr;
    if (cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r != cudaSuccess)
      throw Error("device " + std::to_string(id_) + ": cannot create a CUDA event: " + cuda_error(r));
    if (cudaError_t r = cudaEventRecord(e, s_); r != cudaSuccess) {
      cudaEventDestroy(e);
      throw Error("device " + std::to_string(id_) + ": cannot record a CUDA event: " + cuda_error(r));
    }
    return std::make_unique<CudaEvent>(e);
  }
  void copy(std::byte* dst, const std::byte* src, std::size_t n) override {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s_); e != cudaSuccess)
      throw Error("device " + std::to_string(id_) + ": CUDA copy of " + std::to_string(n) + " bytes failed: " + cuda_error(e));
  }
  bool idle() const override { return cudaStreamQuery(s_) != cudaErrorNotReady; }
  void synchronize() override {
    if (cudaError_t e = cudaStreamSynchronize(s_); e != cudaSuccess)
      throw Error("device " + std::to_string(id_) + ": CUDA stream failed: " + cuda_error(e));
  }

 private:
  DeviceId id_;
  int gpu_;
  cudaStream_t s_ = nullptr;
};

std::byte* device_arena(const DeviceSpec& spec) {
  if (spec.capacity == 0) return nullptr;
  use_gpu(spec.id, spec.gpu);
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, spec.capacity); e != cudaSuccess)
    throw Error("device " + std::to_string(spec.id) + ": cudaMalloc of " + std::to_string(spec.capacity) + " bytes on CUDA device " +
                std::to_string(spec.gpu) + " failed: " + cuda_error(e));
  return static_cast<std::byte*>(p);
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceSpec& spec) : Device(spec.id, device_arena(spec), spec.capacity), gpu_(spec.gpu) {}
  ~CudaDevice() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (arena()) cudaFree(arena());
  }
  MemoryKind kind() const override { return MemoryKind::cuda; }
  int gpu() const override { return gpu_; }
  std::unique_ptr<DeviceQueue> make_queue() override { return std::make_unique<CudaQueue>(id(), gpu_); }
  std::unique_ptr<DeviceEvent> record_external(std::uintptr_t stream) override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    cudaEvent_t e = nullptr;
    cudaError_t r = cudaSetDevice(gpu_);
    if (r == cudaSuccess) r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r == cudaSuccess) r = cudaEventRecord(e, s);
    if (r == cudaSuccess) return std::make_unique<CudaEvent>(e);
    if (e) cudaEventDestroy(e);
    log(LogLevel::warn, "cuda", "device {}: cannot record an event on the framework's stream ({}); waiting for the stream", id(),
        cuda_error(r));
    cudaStreamSynchronize(s);  // ordered the slow way, but ordered
    cudaGetLastError();
    return nullptr;
  }
  // On the device's own non-blocking stream, waited for: a cudaMemcpy from pageable
  // memory returns once the bytes are staged, before the DMA lands, on the legacy stream
  // that Nereus's non-blocking copy streams do not wait for — a copy posted right after
  // could read the old bytes. Here the upload has landed when the call returns.
  void upload(std::byte* dst, const std::byte* host, std::size_t n) override { transfer(dst, host, n, "upload"); }
  void download(std::byte* host, const std::byte* src, std::size_t n) const override { transfer(host, src, n, "download"); }

 private:
  void transfer(void* dst, const void* src, std::size_t n, const char* what) const {
    if (n == 0) return;
    use_gpu(id(), gpu_);
    const std::lock_guard lock(mu_);
    if (!stream_)
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
        throw Error("device " + std::to_string(id()) + ": cannot create a CUDA stream: " + cuda_error(e));
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream_);
    const cudaError_t done = cudaStreamSynchronize(stream_);  // also after a failed enqueue: drain what started
    if (e == cudaSuccess) e = done;
    if (e != cudaSuccess)
      throw Error("device " + std::to_string(id()) + ": " + what + " of " + std::to_string(n) + " bytes failed: " + cuda_error(e));
  }

 public:

 private:
  int gpu_;
  mutable std::mutex mu_;  ///< fills and checks upload and download from several threads
  mutable cudaStream_t stream_ = nullptr;
};

}  // namespace

void cuda_copy(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n == 0) return;
  // The calling thread's stream, waited for, for the reason CudaDevice::transfer gives.
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cudaStreamPerThread);
  const cudaError_t done = cudaStreamSynchronize(cudaStreamPerThread);
  if (e == cudaSuccess) e = done;
  if (e != cudaSuccess)
    throw Error("a copy of " + std::to_string(n) + " bytes between host and GPU memory failed: " + cuda_error(e));
}

std::unique_ptr<Device> make_cuda_device(const DeviceSpec& spec) {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || spec.gpu < 0 || spec.gpu >= n)
    throw Error("device " + std::to_string(spec.id) + ": no CUDA device " + std::to_string(spec.gpu) + " (" +
                (e == cudaSuccess ? std::to_string(n) + " present" : cuda_error(e)) + ")");
  return std::make_unique<CudaDevice>(spec);
}

}  // namespace nereus::detail
