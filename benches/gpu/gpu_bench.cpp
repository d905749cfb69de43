// GPU figures, each measured in the same run (benches/gpu/run.sh prints them with the GPU
// suite's outcome): the GPU's own cudaMemcpy device-to-device bandwidth, and a reshard
// between logical devices carved out of the GPUs present (llama-3.1-8b tp=8 → tp=2,dp=4,
// weights only) through the executor and the cuda transport. One JSON line. Exits 77 when
// no CUDA device is present. --smoke: tiny-llama, to check that it runs.
#include <cuda_runtime_api.h>

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

json reshard(const std::string& model, const std::string& from, const std::string& to, int repeat, int gpus) {
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
  auto cuda = make_cuda_transport(io);
  Executor ex(*cuda, nullptr, [](DeviceId) { return PeerId{0}; });
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
    if (!smoke) out["llama_3_1_8b_tp8_to_tp2_dp4"] = reshard("llama-3.1-8b", "tp=8,pp=1,dp=1", "tp=2,pp=1,dp=4", 3, gpus);
    // Cross-process (CUDA IPC) reshards: run.sh runs `nereus bench transition --transport cuda`.
    out["nccl"] = gpus >= 2 ? "not measured: the NCCL transport is not built yet"
                            : "not measurable: NCCL refuses two ranks on one GPU";
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s\n", json{{"error", e.what()}}.dump().c_str());
    return 1;
  }
}
