#include "nereus/transport/cuda.hpp"

#include "../base/cuda_device.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda_ipc.hpp"
#include "fp8_quantize.hpp"
#include "strided_copy.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"

namespace nereus {

namespace {

using detail::cuda_error;

/// The CUDA device a pointer's memory is on; -1 for host memory.
int gpu_of(std::uint64_t p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(p)) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "invalid value" of a plain host pointer
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

/// This machine's boot id: processes that share it can open each other's IPC handles.
std::string boot_id() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  return id.empty() ? "unknown-boot" : id;
}

/// The CUDA driver's cuMemGetAddressRange, through the runtime (no link to libcuda): the
/// allocation holding a pointer. Null when the driver lacks it.
using GetAddressRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
GetAddressRange address_range_function() {
  static const GetAddressRange fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return GetAddressRange{nullptr};
    }
    return reinterpret_cast<GetAddressRange>(p);
  }();
  return fn;
}

class CudaTransport final : public Transport {
 public:
  CudaTransport(asio::any_io_executor ex, CudaTransportOptions o) : io_(std::move(ex)), o_(o) {
    if (o_.streams_per_gpu == 0) o_.streams_per_gpu = 1;
  }
  ~CudaTransport() override {
    for (auto& [gpu, streams] : streams_)
      for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
  std::string_view name() const override { return "cuda"; }
  Capabilities capabilities() const override { return {true, true, false, true, {MemoryKind::cuda}, false}; }

  std::byte* alloc_host(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc (staging)");
    const std::lock_guard lock(host_mu_);
    host_[reinterpret_cast<std::uint64_t>(p)] = bytes;
    return static_cast<std::byte*>(p);
  }
  void free_host(std::byte* memory) override {
    {
      const std::lock_guard lock(host_mu_);
      host_.erase(reinterpret_cast<std::uint64_t>(memory));
    }
    cudaFreeHost(memory);
  }

  /// Any region of CUDA device memory: an arena (a whole allocation), or part of one (a
  /// framework's tensor). The key names the allocation holding it, whose handle it is.
  Registration register_memory(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::cuda)
      throw Error("cuda transport: device " + std::to_string(region.device) + "'s region is " +
                  std::string(to_string(region.kind)) + " memory; it registers cuda memory only");
    const std::string what = "cuda transport: device " + std::to_string(region.device) + "'s region";
    const int gpu = gpu_of(reinterpret_cast<std::uint64_t>(region.base));
    if (gpu < 0) throw Error(what + " is not CUDA device memory (cudaMalloc)");
    check(cudaSetDevice(gpu), "cudaSetDevice");  // the driver call below asks the current context
    const GetAddressRange range = address_range_function();
    if (!range) throw Error(what + ": the CUDA driver has no cuMemGetAddressRange (to find the allocation holding it)");
    CUdeviceptr allocation = 0;
    std::size_t allocation_size = 0;
    const auto at = reinterpret_cast<CUdeviceptr>(region.base);
    if (range(&allocation, &allocation_size, at) != CUDA_SUCCESS)
      throw Error(what + " is not in a CUDA allocation (cuMemGetAddressRange failed)");
    if (at + region.size > allocation + allocation_size)
      throw Error(what + " (" + std::to_string(region.size) + " bytes) runs past the end of its CUDA allocation; IPC shares one allocation at a time");
    detail::IpcKey k;
    k.pid = static_cast<std::uint32_t>(::getpid());
    k.base = at;
    k.size = region.size;
    k.allocation = allocation;
    cudaIpcMemHandle_t handle{};
    static_assert(sizeof handle == detail::IpcKey::kHandleBytes);
    check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(allocation)),
          "cudaIpcGetMemHandle (memory from cudaMalloc can be shared; stream-ordered pools and virtual memory "
          "management, e.g. PyTorch's expandable segments, cannot)");
    std::memcpy(k.handle.data(), &handle, sizeof handle);
    return {region, k.encode(), 0};
  }

  std::vector<std::byte> address() const override {
    const std::string id = "cuda-ipc " + boot_;
    return {reinterpret_cast<const std::byte*>(id.data()), reinterpret_cast<const std::byte*>(id.data()) + id.size()};
  }

  Status connect(PeerId peer, std::span<const std::byte> address) override {
    const std::string id(reinterpret_cast<const char*>(address.data()), address.size());
    if (!id.starts_with("cuda-ipc "))
      return {StatusCode::invalid, "cuda transport: peer " + std::to_string(peer) + "'s address is not a cuda-ipc address"};
    if (id.substr(9) != boot_)
      return {StatusCode::not_supported, "cuda transport: peer " + std::to_string(peer) +
                                              " runs on another machine (boot id " + id.substr(9) +
                                              "); CUDA IPC reaches processes of this machine only"};
    connected_.insert(peer);
    return Status::ok();
  }

  /// The key says which region it is (`base` and `size`, when given, must agree with it).
  Status add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key, std::uint64_t base = 0,
                           std::uint64_t size = 0) override {
    const std::string what = "cuda transport: device " + std::to_string(remote_device) + " of peer " + std::to_string(peer);
    if (!connected_.contains(peer)) return {StatusCode::invalid, "cuda transport: peer " + std::to_string(peer) + " is not connected"};
    const std::optional<detail::IpcKey> k = detail::IpcKey::decode(key);
    if (!k) return {StatusCode::invalid, what + ": the remote key is not a cuda IPC key"};
    if (size != 0 && (base != k->base || size != k->size))
      return {StatusCode::invalid, what + ": the region's bounds differ from its key's"};
    return regions_.add(peer, remote_device, *k, static_cast<std::uint32_t>(::getpid()));
  }

  asio::awaitable<Status> post(DescriptorList list) override {
    if (list.op == Op::get) {
      if (Status st = to_mapped(list); !st) co_return st;
    } else if (list.op != Op::copy) {
      co_return Status{StatusCode::not_supported, "cuda transport: copies and gets only (no puts or tagged messages)"};
    }
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
  /// Enqueues every segment on one stream of the destination's GPU (the source's when the
  /// destination is host staging); returns the event recorded after them. Throws Error.
  cudaEvent_t enqueue(const DescriptorList& list) {
    int dst_gpu = gpu_of(list.segments.front().dst), src_gpu = gpu_of(list.segments.front().src);
    // One side may be host staging (alloc_host: page-locked, so the copy stays async).
    if ((dst_gpu < 0 && src_gpu < 0) || ((dst_gpu < 0 || src_gpu < 0) && !pinned(list)))
      throw Error("cuda transport: device " + std::to_string(list.local_device) + "'s list is not in CUDA device memory");
    // Strided runs within one GPU's memory go to the kernel, many per launch; across GPUs
    // and to or from host staging, the copy engines (cudaMemcpy2DAsync) move them.
    const bool one_gpu = o_.strided_kernel && dst_gpu >= 0 && dst_gpu == src_gpu;
    if (dst_gpu < 0) dst_gpu = src_gpu;
    if (src_gpu < 0) src_gpu = dst_gpu;
    check(cudaSetDevice(dst_gpu), "cudaSetDevice");
    // Peer access is an optimisation: a cudaMemcpyDefault copy between GPUs works without
    // it (the driver stages it), so a pair that cannot have it copies all the same. Tried
    // once per pair; its error is cleared, never thrown.
    if (src_gpu != dst_gpu && peers_.insert({dst_gpu, src_gpu}).second) {
      const cudaError_t e = o_.inject_no_peer_access ? cudaErrorPeerAccessUnsupported : cudaDeviceEnablePeerAccess(src_gpu, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
        log(LogLevel::debug, "cuda", "GPU {} has no peer access to GPU {} ({}): copies go through the driver's staging", dst_gpu,
            src_gpu, cuda_error(e));
      cudaGetLastError();
    }
    cudaStream_t s = stream(dst_gpu);
    std::vector<Segment> runs;
    std::size_t enqueued = 0;
    try {
      for (const Segment& g : list.segments) {
        void* dst = reinterpret_cast<void*>(g.dst);
        const void* src = reinterpret_cast<const void*>(g.src);
        if (o_.inject_enqueue_failure_after && enqueued == o_.inject_enqueue_failure_after)
          check(cudaErrorInvalidValue, "an injected enqueue failure");
        if (g.count <= 1)
          check(cudaMemcpyAsync(dst, src, g.bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
        else if (one_gpu)
          runs.push_back(g);
        else
          check(cudaMemcpy2DAsync(dst, g.dst_stride, src, g.src_stride, g.bytes, g.count, cudaMemcpyDefault, s),
                "cudaMemcpy2DAsync");
        ++enqueued;
      }
      check(static_cast<cudaError_t>(detail::launch_strided_copies(runs, s)), "the strided-copy kernel");
    } catch (...) {
      // Segments already on the stream still write their destinations: drain them before
      // the error reaches a caller who may then free those buffers.
      cudaStreamSynchronize(s);
      cudaGetLastError();
      throw;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (cudaError_t r = cudaEventRecord(e, s); r != cudaSuccess) {
      cudaEventDestroy(e);
      check(r, "cudaEventRecord");
    }
    return e;
  }

  /// Whether the list's host side (if any) lies in staging this transport allocated.
  bool pinned(const DescriptorList& list) const {
    const std::lock_guard lock(host_mu_);
    for (const Segment& g : list.segments)
      for (const std::uint64_t side : {g.src, g.dst}) {
        if (gpu_of(side) >= 0) continue;
        auto it = host_.upper_bound(side);
        if (it == host_.begin() || side >= std::prev(it)->first + std::prev(it)->second) return false;
      }
    return true;
  }

  /// Rewrites a get's source addresses (the peer's) as the mapping's here.
  Status to_mapped(DescriptorList& list) const {
    if (!regions_.knows(list.peer, list.remote_device))
      return {StatusCode::invalid, "cuda transport: no region of device " + std::to_string(list.remote_device) + " of peer " +
                                       std::to_string(list.peer) + " was added"};
    for (Segment& g : list.segments) {
      const std::uint64_t span = (g.count > 1 ? (g.count - 1) * g.src_stride : 0) + g.bytes;
      const std::optional<std::uint64_t> here = regions_.translate(list.peer, list.remote_device, g.src, span);
      if (!here)
        return {StatusCode::invalid, "cuda transport: a get reads outside the registered regions of device " +
                                         std::to_string(list.remote_device) + " of peer " + std::to_string(list.peer)};
      g.src = *here;
    }
    return Status::ok();
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

  asio::any_io_executor io_;
  CudaTransportOptions o_;
  std::map<int, std::vector<cudaStream_t>> streams_;
  std::map<int, std::size_t> next_;
  std::set<std::pair<int, int>> peers_;  // (dst gpu, src gpu) with peer access enabled
  std::string boot_ = boot_id() + (o_.machine.empty() ? "" : "/" + o_.machine);
  std::set<PeerId> connected_;
  // Peers' regions: their allocations opened by CUDA IPC, closed with the transport.
  detail::IpcRegions regions_{[](const detail::IpcKey& k, std::byte*& mapped) {
                                cudaIpcMemHandle_t h{};
                                std::memcpy(&h, k.handle.data(), sizeof h);
                                void* p = nullptr;
                                if (const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
                                    e != cudaSuccess) {
                                  cudaGetLastError();
                                  return Status{StatusCode::io_error, "cuda transport: cudaIpcOpenMemHandle failed: " + cuda_error(e)};
                                }
                                mapped = static_cast<std::byte*>(p);
                                return Status::ok();
                              },
                              [](std::byte* mapped) { cudaIpcCloseMemHandle(mapped); }};
  mutable std::mutex host_mu_;
  std::map<std::uint64_t, std::size_t> host_;  // page-locked staging: base → bytes
};

}  // namespace

void quantize_fp8_on_gpu(int gpu, const fp8::Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out,
                         std::int64_t out_stride, float* scales, std::int64_t scale_stride) {
  auto fail = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("FP8 quantize on the GPU: ") + what + ": " + cuda_error(e));
  };
  fail(cudaSetDevice(gpu), "cudaSetDevice");
  detail::Fp8QuantizeArgs a = detail::fp8_quantize_args(region, bo, bi, out, out_stride, scales, scale_stride, nullptr);
  const auto blocks = static_cast<std::size_t>(((region.rows + bo - 1) / bo) * ((region.cols + bi - 1) / bi));
  fail(cudaMalloc(reinterpret_cast<void**>(&a.amax), std::max<std::size_t>(1, blocks) * sizeof(int)), "cudaMalloc of the amax scratch");
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = static_cast<cudaError_t>(detail::launch_fp8_quantize(a, stream));
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(a.amax);
  fail(e, "the quantize kernels");
}

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
  return make_cuda_transport(io.get_executor(), std::move(options));
}

std::unique_ptr<Transport> make_cuda_transport(asio::any_io_executor ex, CudaTransportOptions options) {
  return std::make_unique<CudaTransport>(std::move(ex), std::move(options));
}

}  // namespace nereus
