#pragma once
// The `cuda` backend: copies between CUDA devices of this process — logical devices on
// one GPU, or different GPUs (peer access enabled on first use) — as cudaMemcpyAsync, and
// strided runs by the strided-copy kernel within one GPU (up to 64 per launch) or as one
// cudaMemcpy2DAsync each across GPUs, on a few streams per GPU; and gets from the
// CUDA memory of other processes on this node through CUDA IPC (see CUDA IPC below).
// One side of a copy may be host staging from alloc_host() (page-locked, so the copy
// stays asynchronous): how the executor stages GPU memory for a host-only remote
// transport (UCX without CUDA support) as two-sided messages.
// Completion reaches
// Asio without blocking the loop or running in a CUDA callback: each post records an
// event and its coroutine polls it on a short timer. A copy CUDA has started cannot be
// cancelled: a cancelled post waits for its copy, then reports the cancellation.
// Built when meson finds cudart; otherwise make_cuda_transport() throws an Error.
#include <chrono>
#include <memory>
#include <string>

#include "nereus/core/fp8.hpp"
#include "nereus/transport/transport.hpp"

namespace nereus {

struct CudaTransportOptions {
  unsigned streams_per_gpu = 4;                  ///< posts take them in turn
  std::chrono::microseconds poll{20};            ///< how often a post checks its event
  /// Added to this machine's boot id in address(): processes whose addresses differ do not
  /// reach each other by IPC. Benches emulate several machines on one with it (--nodes).
  std::string machine;
  /// Strided runs between memory of one GPU are copied by Nereus's kernel, up to 64 runs
  /// per launch (transport/strided_copy.hpp); false: one cudaMemcpy2DAsync per run, as
  /// between GPUs and host staging always (benches/gpu/gpu_bench compares the two).
  bool strided_kernel = true;
  /// Fault injection for the GPU suite: peer access reported unsupported for every pair,
  /// and a post that fails after this many segments are on its stream (0: never).
  bool inject_no_peer_access = false;
  std::size_t inject_enqueue_failure_after = 0;
};

/// Quantizes a region of GPU memory on GPU `gpu` into FP8 bytes and float32 scales
/// (sharding.md, "FP8"), bit for bit as fp8::quantize() does on the host, and waits for it:
/// the quantize pass of bf16 → FP8 units in GPU memory (UnitStore::quantize). Every pointer
/// is a GPU address. Throws Error on a CUDA failure, and in a build without CUDA.
void quantize_fp8_on_gpu(int gpu, const fp8::Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out,
                         std::int64_t out_stride, float* scales, std::int64_t scale_stride);

/// Whether this library was built with CUDA.
bool cuda_built();
/// CUDA devices present (0 without a driver, a GPU, or CUDA in this build).
int cuda_device_count();

/// CUDA IPC. register_memory() takes a whole cudaMalloc allocation (a cuda device's
/// arena, Device::arena()) or part of one (a framework's tensor in its caching allocator's
/// block), and returns as its remote key the region's bounds, the allocation holding it
/// (cuMemGetAddressRange, through the runtime's driver entry points) with its IPC handle,
/// and this process's id. address() is this machine's boot id: connect() refuses a peer
/// on another machine, since IPC handles open only there. add_remote_region() opens the
/// peer's allocation once however many of its regions it is given (cudaIpcOpenMemHandle,
/// peer access enabled lazily) — a key from this very process maps to its own memory,
/// which CUDA cannot open — and a get (Op::get) then copies from the mapping, its
/// addresses the peer's, checked against the region it reads. Handles are closed when
/// the transport goes. A
/// peer that exits frees its allocations: a get from it then fails or reads freed memory,
/// so its sources' processes must outlive a transition.
std::unique_ptr<Transport> make_cuda_transport(asio::io_context& io, CudaTransportOptions options = {});
/// The same on any executor (an embedded Job's).
std::unique_ptr<Transport> make_cuda_transport(asio::any_io_executor ex, CudaTransportOptions options = {});

}  // namespace nereus
