// GPU figures, each measured in the same run (benches/gpu/run.sh prints them with the GPU
// suite's outcome): the GPU's own cudaMemcpy device-to-device bandwidth, and a reshard
// between logical devices carved out of the GPUs present (llama-3.1-8b tp=8 → tp=2,dp=4,
// weights only) through the executor and the cuda transport; the same llama-3.2-1b reshard
// with every link an NCCL message (the nccl transport, one rank per GPU present) against
// raw ncclSend/ncclRecv of the same bytes in one group, on the same ranks; the first
// reshard with its strided runs copied by Nereus's kernel and by cudaMemcpy2DAsync. One JSON line.
// Exits 77 when no CUDA device is present. --smoke: fewer runs, to check that it runs.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#define NEREUS_BENCH_NCCL 1
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nereus/base/device.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/model.hpp"
#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/nccl.hpp"

using namespace nereus;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// cudaMemcpy device-to-device of `bytes` on GPU 0, GB/s (10^9 B/s) of bytes copied.
double memcpy_d2d_gbps(std::size_t bytes, int repeat) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) throw Error("cudaMalloc for the D2D baseline failed");
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("D2D baseline: ") + what + " failed: " + cudaGetErrorString(e));
  };
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<double> secs;
  for (int i = 0; i <= repeat; ++i) {
    const auto t0 = clock_type::now();
    check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (i > 0) secs.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());  // the first warms up
  }
  cudaFree(a);
  cudaFree(b);
  return static_cast<double>(bytes) / median(secs) / 1e9;
}

/// Runs `asio` work to completion.
template <class T>
T run(asio::io_context& io, asio::awaitable<T> a) {
  std::optional<T> out;
  std::exception_ptr err;
  asio::co_spawn(io, std::move(a), [&](std::exception_ptr e, T v) {
    err = e;
    if (!e) out = std::move(v);
  });
  io.restart();
  io.run();
  if (err) std::rethrow_exception(err);
  return std::move(*out);
}

/// `via_nccl`: every link an NCCL message (remote_links), else cuda copies; `kernel`:
/// strided runs on one GPU by the strided-copy kernel, else one cudaMemcpy2DAsync each.
json reshard(const std::string& model, const std::string& from, const std::string& to, int repeat, int gpus, bool via_nccl = false,
             bool kernel = true) {
  auto m = load_model(model);
  const auto src = Collection::from_spec(m, "s", parse_collection_spec(from), false);
  const auto dst = Collection::from_spec(m, "t", parse_collection_spec(to), false);
  const ReshardPlan plan = plan_reshard(src, dst);
  const auto transfers = plan.transfers();
  const auto sizes = buffer_extents(transfers);
  std::map<DeviceId, std::uint64_t> per_device;
  for (const auto& [key, bytes] : sizes) per_device[key.device] += (bytes + 4095) / 4096 * 4096;
  std::map<DeviceId, std::unique_ptr<Device>> devices;
  for (const auto& [d, bytes] : per_device)
    devices[d] = make_device({MemoryKind::cuda, d, bytes + (1 << 20), nullptr, static_cast<int>(d) % gpus});
  std::vector<DeviceBuffer> buffers;
  BufferTable table;
  for (const auto& [key, bytes] : sizes) {
    buffers.push_back(devices[key.device]->allocate(bytes, "bench"));
    cudaMemset(buffers.back().data(), key.side == kTargetSide ? 0 : 0x5a, bytes);
    table.bind(key, {reinterpret_cast<std::uint64_t>(buffers.back().data()), bytes, 0, MemoryKind::cuda});
  }
  cudaDeviceSynchronize();
  asio::io_context io;
  CudaTransportOptions co;
  co.strided_kernel = kernel;
  auto cuda = make_cuda_transport(io, co);
  std::unique_ptr<Transport> nccl;
  ExecutorOptions eo;
  if (via_nccl) {
    NcclTransportOptions no;
    for (const auto& [d, dev] : devices) no.devices.push_back(d);
    no.owner_of = [](DeviceId) { return PeerId{0}; };
    no.gpu_of = [gpus](DeviceId d) { return static_cast<int>(d) % gpus; };
    nccl = make_nccl_transport(io, std::move(no));
    if (Status st = nccl->connect(0, nccl->address()); !st) throw Error(st.message());
    eo.remote_links = true;
  }
  Executor ex(*cuda, nccl.get(), [](DeviceId) { return PeerId{0}; }, eo);
  const BoundTransition bound = ex.bind(transfers, plan.target(), table);
  std::vector<double> secs;
  std::uint64_t copied = 0;
  for (int i = 0; i <= repeat; ++i) {
    const ExecutionReport r = run(io, ex.run(bound));
    if (i > 0) secs.push_back(r.seconds);  // the first run warms streams and peer access up
    copied = r.link_bytes + r.local_bytes;
  }
  const double s = median(secs);
  return {{"model", model}, {"from", from}, {"to", to}, {"logical_devices", devices.size()}, {"gpus", gpus},
          {"seconds_median", s}, {"moved_bytes", plan.summary().moved_bytes},
          {"gbps", static_cast<double>(plan.summary().moved_bytes) / s / 1e9}, {"copied_bytes", copied},
          {"copy_gbps", static_cast<double>(copied) / s / 1e9}};
}

#ifdef NEREUS_BENCH_NCCL
/// Raw NCCL in this process, one rank per GPU (ncclCommInitAll): `bytes` sent from rank 0
/// to rank 1 % gpus (to itself on one GPU) as one ncclSend/ncclRecv pair in one group; the
/// median seconds of `repeat` after a warm-up. The same library the transport loads.
double raw_nccl_seconds(std::uint64_t bytes, int repeat, int gpus) {
  const char* env = std::getenv("NEREUS_NCCL_LIBRARY");
  void* lib = ::dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw Error("raw NCCL: cannot load the library");
  auto sym = [lib](const char* name) {
    void* f = ::dlsym(lib, name);
    if (!f) throw Error(std::string("raw NCCL: no ") + name);
    return f;
  };
  auto init_all = reinterpret_cast<decltype(&::ncclCommInitAll)>(sym("ncclCommInitAll"));
  auto group_start = reinterpret_cast<decltype(&::ncclGroupStart)>(sym("ncclGroupStart"));
  auto group_end = reinterpret_cast<decltype(&::ncclGroupEnd)>(sym("ncclGroupEnd"));
  auto send = reinterpret_cast<decltype(&::ncclSend)>(sym("ncclSend"));
  auto recv = reinterpret_cast<decltype(&::ncclRecv)>(sym("ncclRecv"));
  auto destroy = reinterpret_cast<decltype(&::ncclCommDestroy)>(sym("ncclCommDestroy"));
  const int peer = 1 % gpus, ranks = std::min(gpus, 2);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ranks));
  std::vector<int> list(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) list[static_cast<std::size_t>(r)] = r;
  if (init_all(comms.data(), ranks, list.data()) != ncclSuccess) throw Error("raw NCCL: ncclCommInitAll failed");
  void *a = nullptr, *b = nullptr;
  cudaStream_t sa = nullptr, sb = nullptr;
  cudaSetDevice(0);
  cudaMalloc(&a, bytes);
  cudaStreamCreate(&sa);
  cudaSetDevice(peer);
  cudaMalloc(&b, bytes);
  cudaStreamCreate(&sb);
  std::vector<double> secs;
  for (int i = 0; i <= repeat; ++i) {
    const auto t0 = clock_type::now();
    group_start();
    send(a, bytes, ncclUint8, peer, comms[0], sa);
    recv(b, bytes, ncclUint8, 0, comms[static_cast<std::size_t>(peer)], sb);
    if (group_end() != ncclSuccess) throw Error("raw NCCL: the group failed");
    cudaStreamSynchronize(sa);
    cudaStreamSynchronize(sb);
    if (i > 0) secs.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  for (ncclComm_t c : comms) destroy(c);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(sa);
  cudaStreamDestroy(sb);
  return median(secs);
}
#endif

/// The reshard through the nccl transport against raw NCCL of its moved bytes.
json nccl_figures(bool smoke, int gpus) {
#ifdef NEREUS_BENCH_NCCL
  // The same GPUs for both: one, or GPUs 0 and 1 (logical devices alternate between them).
  json t = reshard("llama-3.2-1b", "tp=4,pp=1,dp=1", "tp=2,pp=1,dp=2", smoke ? 1 : 5, std::min(gpus, 2), true);
  const auto moved = t["moved_bytes"].get<std::uint64_t>();
  const double raw = raw_nccl_seconds(moved, smoke ? 1 : 5, gpus);
  return {{"transport", t}, {"raw_seconds_median", raw}, {"raw_gbps", static_cast<double>(moved) / raw / 1e9},
          {"ratio_to_raw", raw / t["seconds_median"].get<double>()},
          {"ranks", std::min(gpus, 2)}, {"note", gpus >= 2 ? "GPU 0 to GPU 1" : "one GPU: sends to its own rank"}};
#else
  (void)smoke, (void)gpus;
  return "not built: no nccl.h";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::strcmp(argv[1], "--smoke") == 0;
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 77;
  }
  try {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    json out{{"gpu", p.name}, {"gpus", gpus}};
    const double d2d = memcpy_d2d_gbps(smoke ? (64u << 20) : (std::size_t{2} << 30), smoke ? 2 : 10);
    out["cudamemcpy_d2d_gbps"] = d2d;
    // One reshard's D2D bandwidth against the GPU's own (both: bytes copied per second).
    json small = reshard("llama-3.2-1b", "tp=4,pp=1,dp=1", "tp=2,pp=1,dp=2", smoke ? 1 : 5, gpus);
    small["ratio_to_cudamemcpy"] = small["copy_gbps"].get<double>() / d2d;
    out["reshard_d2d"] = small;
    // The same reshard with every strided run a cudaMemcpy2DAsync of its own.
    const json m2d = reshard("llama-3.2-1b", "tp=4,pp=1,dp=1", "tp=2,pp=1,dp=2", smoke ? 1 : 5, gpus, false, false);
    out["strided_kernel"] = {{"kernel_seconds_median", small["seconds_median"]}, {"memcpy2d_seconds_median", m2d["seconds_median"]},
                             {"speedup", m2d["seconds_median"].get<double>() / small["seconds_median"].get<double>()}};
    if (!smoke) out["llama_3_1_8b_tp8_to_tp2_dp4"] = reshard("llama-3.1-8b", "tp=8,pp=1,dp=1", "tp=2,pp=1,dp=4", 3, gpus);
    // Cross-process (CUDA IPC) reshards: run.sh runs `nereus bench transition --transport cuda`.
    try {
      out["nccl"] = nccl_figures(smoke, gpus);
    } catch (const std::exception& e) {
      out["nccl"] = {{"error", e.what()}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s\n", json{{"error", e.what()}}.dump().c_str());
    return 1;
  }
}
