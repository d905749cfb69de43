#include "nereus/transport/cuda.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {

std::string cuda_error(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

/// The CUDA device a pointer's memory is on; -1 for host memory.
int gpu_of(std::uint64_t p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(p)) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "invalid value" of a plain host pointer
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

class CudaTransport final : public Transport {
 public:
  CudaTransport(asio::io_context& io, CudaTransportOptions o) : io_(io), o_(o) {
    if (o_.streams_per_gpu == 0) o_.streams_per_gpu = 1;
  }
  ~CudaTransport() override {
    for (auto& [gpu, streams] : streams_)
      for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
  std::string_view name() const override { return "cuda"; }
  Capabilities capabilities() const override { return {true, false, false, true, {MemoryKind::cuda}, false}; }
  Registration register_memory(const MemoryRegion& region) override { return {region, {}, 0}; }

  asio::awaitable<Status> post(DescriptorList list) override {
    if (list.op != Op::copy) co_return Status{StatusCode::not_supported, "cuda transport: copies inside this process only"};
    if (list.segments.empty()) co_return Status::ok();
    cudaEvent_t done = nullptr;
    try {
      done = enqueue(list);
    } catch (const Error& e) {
      co_return Status{StatusCode::io_error, e.what()};
    }
    asio::steady_timer t(io_);
    bool cancelled = false;
    cudaError_t st = cudaErrorNotReady;
    while ((st = cudaEventQuery(done)) == cudaErrorNotReady) {
      t.expires_after(o_.poll);
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      // The copy runs on regardless: wait for it (its bytes land in our buffers), then say so.
      if (ec) cancelled = true;
      co_await asio::this_coro::reset_cancellation_state();
    }
    cudaEventDestroy(done);
    if (st != cudaSuccess) co_return Status{StatusCode::io_error, "cuda copy failed: " + cuda_error(st)};
    if (cancelled) co_return Status{StatusCode::cancelled, "cuda copy cancelled (it had started and ran to its end)"};
    co_return Status::ok();
  }

 private:
  /// Enqueues every segment on one stream of the destination's GPU; returns the event
  /// recorded after them. Throws Error.
  cudaEvent_t enqueue(const DescriptorList& list) {
    const int dst_gpu = gpu_of(list.segments.front().dst), src_gpu = gpu_of(list.segments.front().src);
    if (dst_gpu < 0 || src_gpu < 0)
      throw Error("cuda transport: device " + std::to_string(list.local_device) + "'s list is not in CUDA device memory");
    check(cudaSetDevice(dst_gpu), "cudaSetDevice");
    if (src_gpu != dst_gpu && peers_.insert({dst_gpu, src_gpu}).second) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(src_gpu, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) check(e, "cudaDeviceEnablePeerAccess");
      cudaGetLastError();
    }
    cudaStream_t s = stream(dst_gpu);
    for (const Segment& g : list.segments) {
      void* dst = reinterpret_cast<void*>(g.dst);
      const void* src = reinterpret_cast<const void*>(g.src);
      if (g.count <= 1)
        check(cudaMemcpyAsync(dst, src, g.bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
      else
        check(cudaMemcpy2DAsync(dst, g.dst_stride, src, g.src_stride, g.bytes, g.count, cudaMemcpyDefault, s),
              "cudaMemcpy2DAsync");
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (cudaError_t r = cudaEventRecord(e, s); r != cudaSuccess) {
      cudaEventDestroy(e);
      check(r, "cudaEventRecord");
    }
    return e;
  }

  cudaStream_t stream(int gpu) {
    auto& pool = streams_[gpu];
    if (pool.empty())
      for (unsigned i = 0; i < o_.streams_per_gpu; ++i) {
        cudaStream_t s = nullptr;
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        pool.push_back(s);
      }
    return pool[next_[gpu]++ % pool.size()];
  }

  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("cuda transport: ") + what + " failed: " + cuda_error(e));
  }

  asio::io_context& io_;
  CudaTransportOptions o_;
  std::map<int, std::vector<cudaStream_t>> streams_;
  std::map<int, std::size_t> next_;
  std::set<std::pair<int, int>> peers_;  // (dst gpu, src gpu) with peer access enabled
};

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Transport> make_cuda_transport(asio::io_context& io, CudaTransportOptions options) {
  return std::make_unique<CudaTransport>(io, options);
}

}  // namespace nereus
