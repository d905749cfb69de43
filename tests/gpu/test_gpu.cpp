// The GPU suite (meson suite `gpu`, not in CI): CUDA devices, their arenas and streams,
// and reshards between logical devices carved out of the GPUs present, moved by the cuda
// transport through the executor: sources patterned on the host and copied up, targets
// copied back, and every destination element compared with the source element the plan
// says it comes from. Exits 77 (skipped) when no CUDA device is present or CUDA is not built in.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "../job_cases.hpp"
#include "../run_async.hpp"
#include "../runtime_world.hpp"
#include "../test_util.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/job.hpp"
#include "nereus/core/job.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/nccl.hpp"
#include "nereus/transport/ucx.hpp"
#include "../../src/transport/cuda_ipc.hpp"
#include "../../src/transport/strided_copy.hpp"

using namespace nereus;
using testing::coll;
using testing::error_of;
using testing::run_on;

namespace {

/// The buffers of `host` mirrored on CUDA devices (logical device d on GPU d % gpus),
/// sources copied up from the host's.
struct CudaMirror {
  std::map<DeviceId, std::unique_ptr<Device>> devices;
  std::vector<DeviceBuffer> buffers;
  BufferTable table;

  CudaMirror(const testing::World& host, int gpus) {
    for (const auto& [key, b] : host.table.all()) {
      auto& dev = devices[key.device];
      if (!dev) dev = make_device({MemoryKind::cuda, key.device, 64 << 20, nullptr, static_cast<int>(key.device) % gpus});
      buffers.push_back(dev->allocate(b.bytes, "mirror"));
      REQUIRE(cudaMemcpy(buffers.back().data(), reinterpret_cast<const void*>(b.address), b.bytes,
                         cudaMemcpyHostToDevice) == cudaSuccess);
      table.bind(key, {reinterpret_cast<std::uint64_t>(buffers.back().data()), b.bytes, 0, MemoryKind::cuda});
    }
  }
  /// Copies every target buffer back over the host's.
  void download(testing::World& host) const {
    for (const auto& [key, b] : table.all())
      if (key.side == kTargetSide)
        REQUIRE(cudaMemcpy(reinterpret_cast<void*>(host.table.find(key)->address), reinterpret_cast<const void*>(b.address),
                           b.bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
};

/// An NCCL transport holding every rank of logical devices 0..devices-1 in this process
/// (device d on GPU d % gpus), connected to itself; null, with a message, where NCCL
/// cannot start here.
std::unique_ptr<Transport> one_process_nccl(asio::io_context& io, int devices, int gpus) {
  if (!nccl_built()) {
    MESSAGE("no NCCL in this build: skipped");
    return nullptr;
  }
  NcclTransportOptions no;
  for (DeviceId d = 0; d < devices; ++d) no.devices.push_back(d);
  no.owner_of = [](DeviceId) { return PeerId{0}; };
  no.gpu_of = [gpus](DeviceId d) { return static_cast<int>(d) % gpus; };
  std::unique_ptr<Transport> nccl;
  try {
    nccl = make_nccl_transport(io, no);
  } catch (const Error& e) {
    MESSAGE("nccl not measurable here: " << e.what());
    return nullptr;
  }
  REQUIRE(nccl->connect(0, nccl->address()).is_ok());
  return nccl;
}

}  // namespace

TEST_CASE("cuda device: a cudaMalloc arena with the host device's capacity accounting, streams and events") {
  auto d = make_device({MemoryKind::cuda, 3, 1 << 20, nullptr, 0});
  CHECK(d->kind() == MemoryKind::cuda);
  DeviceBuffer a = d->allocate(600 << 10, "a");
  CHECK(d->used() >= 600u << 10);
  CHECK(error_of([&] { d->allocate(600 << 10, "b"); }).find("device 3: cannot allocate") != std::string::npos);
  DeviceBuffer b = d->allocate(300 << 10, "b");
  REQUIRE(cudaMemset(a.data(), 0x5a, a.size()) == cudaSuccess);
  auto q = d->make_queue();
  q->copy(b.data(), a.data(), b.size());
  auto ev = q->record();
  q->synchronize();
  CHECK(ev->ready());
  CHECK(q->idle());
  std::vector<unsigned char> back(b.size());
  REQUIRE(cudaMemcpy(back.data(), b.data(), b.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 0x5a; }));
  CHECK(error_of([&] { make_device({MemoryKind::cuda, 9, 1 << 20, nullptr, 4096}); }).find("no CUDA device 4096") != std::string::npos);
}

TEST_CASE("cuda transport: reshards between logical devices land every element where the plan puts it") {
  const int gpus = cuda_device_count();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2,devices=4:5:6:7"},
           {"tp=2,pp=2,dp=1", "tp=4,pp=1,dp=1,devices=0:1:2:3"},  // kept buffers copy in place on one device
           {"tp=1,pp=2,dp=1", "tp=2,pp=1,dp=1,packing=fused,devices=1:0"}}) {
    CAPTURE(from);
    CAPTURE(to);
    const auto plan = plan_reshard(coll(from, true), coll(to, true));
    const auto transfers = plan.transfers();
    // Strided runs on one GPU by the kernel, and as one cudaMemcpy2DAsync each.
    for (const bool kernel : {true, false}) {
      CAPTURE(kernel);
      testing::World host;  // targets zero again: nothing of the other way's run is left
      host.bind_all(plan);
      host.pattern_sources();
      CudaMirror gpu(host, gpus);
      asio::io_context io;
      CudaTransportOptions co;
      co.strided_kernel = kernel;
      auto cuda = make_cuda_transport(io, co);
      ExecutorOptions opt;
      opt.chunk_bytes = 100000;  // several chunks a transfer
      Executor ex(*cuda, nullptr, [](DeviceId) { return PeerId{0}; }, opt);
      const BoundTransition bound = ex.bind(transfers, plan.target(), gpu.table);
      for (int run = 0; run < 2; ++run) {
        const auto report = run_on(io, ex.run(bound));
        CHECK(report.link_bytes == plan.summary().moved_bytes);
      }
      gpu.download(host);
      CHECK(testing::landed_as_planned(transfers, host.table));
    }
  }
}

TEST_CASE("strided-copy kernel: random runs in GPU memory land as a plain copy of each row would put them") {
  std::mt19937_64 rng(1206);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  const std::size_t src_bytes = 4 << 20, dst_bytes = 8 << 20;
  void *src_mem = nullptr, *dst_mem = nullptr;
  REQUIRE(cudaMalloc(&src_mem, src_bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&dst_mem, dst_bytes) == cudaSuccess);
  auto* src = static_cast<unsigned char*>(src_mem);
  auto* dst = static_cast<unsigned char*>(dst_mem);
  std::vector<unsigned char> host_src(src_bytes);
  for (auto& b : host_src) b = static_cast<unsigned char>(rng());
  REQUIRE(cudaMemcpy(src, host_src.data(), src_bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  for (int layout = 0; layout < 20; ++layout) {
    std::vector<unsigned char> want(dst_bytes, 0), got(dst_bytes);
    REQUIRE(cudaMemset(dst, 0, dst_bytes) == cudaSuccess);
    std::vector<Segment> runs;
    std::uint64_t dst_at = 0;
    for (std::size_t r = 0, n = pick(1, 200); r < n; ++r) {
      const std::uint64_t align = std::uint64_t{1} << pick(0, 4);
      const std::uint64_t bytes = align * pick(1, 4000 / align), count = pick(1, 16);
      const std::uint64_t src_stride = bytes + align * pick(0, 8), dst_stride = bytes + align * pick(0, 8);
      const std::uint64_t src_at = align * pick(0, (src_bytes - count * src_stride) / align);
      dst_at = (dst_at + align - 1) / align * align + pick(0, 3) * align;
      if (dst_at + count * dst_stride > dst_bytes) break;
      runs.push_back({reinterpret_cast<std::uint64_t>(src + src_at), reinterpret_cast<std::uint64_t>(dst + dst_at), bytes, count,
                      src_stride, dst_stride});
      for (std::uint64_t row = 0; row < count; ++row)
        std::memcpy(want.data() + dst_at + row * dst_stride, host_src.data() + src_at + row * src_stride, bytes);
      dst_at += count * dst_stride;
    }
    REQUIRE(detail::launch_strided_copies(runs, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    REQUIRE(cudaMemcpy(got.data(), dst, dst_bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(got == want);
  }
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
}

TEST_CASE("FP8 quantizer on the GPU: random regions, bf16, f16 and f32, bit for bit the host quantizer's bytes and scales") {
  std::mt19937_64 rng(1207);
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  for (int round = 0; round < 30; ++round) {
    const std::int64_t rows = pick(1, 700), cols = pick(1, 700), stride = cols + pick(0, 9);
    const std::int64_t bo = round % 3 == 0 ? 128 : pick(1, 64), bi = round % 3 == 0 ? 128 : pick(1, 64);
    const auto type = static_cast<fp8::Source>(round % 3);
    const std::int64_t w = type == fp8::Source::f32 ? 4 : 2;
    std::vector<unsigned char> host(static_cast<std::size_t>(rows * stride * w));
    for (auto& b : host) b = static_cast<unsigned char>(rng());  // NaN, inf, subnormals included
    const std::int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
    std::vector<std::uint8_t> want(static_cast<std::size_t>(rows * cols)), got(want.size());
    std::vector<float> want_s(static_cast<std::size_t>(sr * sc)), got_s(want_s.size());
    fp8::quantize({reinterpret_cast<const std::byte*>(host.data()), type, rows, cols, stride}, bo, bi, want.data(), cols, want_s.data(), sc);
    void *src = nullptr, *out = nullptr, *scales = nullptr;
    REQUIRE(cudaMalloc(&src, host.size()) == cudaSuccess);
    REQUIRE(cudaMalloc(&out, got.size()) == cudaSuccess);
    REQUIRE(cudaMalloc(&scales, got_s.size() * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    quantize_fp8_on_gpu(0, {static_cast<const std::byte*>(src), type, rows, cols, stride}, bo, bi, static_cast<std::uint8_t*>(out), cols,
                        static_cast<float*>(scales), sc);
    REQUIRE(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    REQUIRE(cudaMemcpy(got_s.data(), scales, got_s.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CAPTURE(round);
    CHECK(got == want);
    CHECK(std::memcmp(got_s.data(), want_s.data(), got_s.size() * 4) == 0);
    cudaFree(src);
    cudaFree(out);
    cudaFree(scales);
  }
}

TEST_CASE("cuda IPC gets: every link a get through the registered arenas' keys, in one process") {
  // One process: each key maps to its own memory (CUDA cannot open its own handles), so
  // this checks the keys, the regions and the address rewrite of a get; `nereus bench
  // transition --transport cuda --procs 2` (benches/gpu/run.sh) opens them across processes.
  testing::Patterned r("tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2,devices=4:5:6:7");
  const auto& [plan, transfers, host] = std::tie(r.plan, r.transfers, r.w);
  CudaMirror gpu(host, cuda_device_count());
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  REQUIRE(cuda->connect(0, cuda->address()).is_ok());
  for (auto& [d, dev] : gpu.devices) {
    const Registration r = cuda->register_memory({dev->arena(), dev->capacity(), d, MemoryKind::cuda});
    REQUIRE(cuda->add_remote_region(0, d, r.remote_key).is_ok());
  }
  ExecutorOptions opt;
  opt.remote_links = true;
  opt.chunk_bytes = 100000;
  Executor ex(*cuda, cuda.get(), [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), gpu.table);
  const auto report = run_on(io, ex.run(bound));
  CHECK(report.link_bytes == plan.summary().moved_bytes);
  gpu.download(host);
  CHECK(testing::landed_as_planned(transfers, host.table));
  // A get outside a registered region is refused before CUDA sees it.
  DescriptorList l;
  l.op = Op::get;
  l.remote_device = gpu.devices.begin()->first;
  const auto base = reinterpret_cast<std::uint64_t>(gpu.devices.begin()->second->arena());
  l.segments.push_back({base + (std::uint64_t{1} << 40), reinterpret_cast<std::uint64_t>(gpu.buffers[0].data()), 64, 1, 0, 0});
  const Status st = run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await cuda->post(l); }());
  CHECK(st.message().find("reads outside the registered regions of device") != std::string::npos);
}

TEST_CASE("cuda IPC keys of a framework's tensor: the allocation holding it, gets held to the tensor's bounds") {
  // Two "tensors" inside one cudaMalloc block, as PyTorch's caching allocator places them;
  // an adopted buffer is registered as such a region (docs/cluster.md, adopt=).
  constexpr std::size_t kBlock = 1 << 20, kA = 4096, kB = 65536;
  void* block = nullptr;
  REQUIRE(cudaMalloc(&block, kBlock) == cudaSuccess);
  auto* base = static_cast<std::byte*>(block);
  std::vector<std::byte> pattern(kBlock);
  for (std::size_t i = 0; i < kBlock; ++i) pattern[i] = static_cast<std::byte>(i * 131 + 7);
  REQUIRE(cudaMemcpy(block, pattern.data(), kBlock, cudaMemcpyHostToDevice) == cudaSuccess);
  {
    asio::io_context io;
    auto cuda = make_cuda_transport(io);
    REQUIRE(cuda->connect(0, cuda->address()).is_ok());
    const Registration a = cuda->register_memory({base + kA, 8192, 3, MemoryKind::cuda});
    const Registration b = cuda->register_memory({base + kB, 4096, 3, MemoryKind::cuda});
    const auto ka = detail::IpcKey::decode(a.remote_key), kb = detail::IpcKey::decode(b.remote_key);
    REQUIRE(ka);
    REQUIRE(kb);
    CHECK(ka->allocation == reinterpret_cast<std::uint64_t>(base));  // found by cuMemGetAddressRange
    CHECK(kb->allocation == ka->allocation);
    CHECK(ka->base == reinterpret_cast<std::uint64_t>(base + kA));
    CHECK(ka->size == 8192);
    CHECK(ka->handle == kb->handle);  // one allocation, one handle
    REQUIRE(cuda->add_remote_region(0, 3, a.remote_key, ka->base, ka->size).is_ok());
    REQUIRE(cuda->add_remote_region(0, 3, b.remote_key, kb->base, kb->size).is_ok());
    CHECK(cuda->add_remote_region(0, 3, b.remote_key, kb->base, 1).message().find("differ from its key") != std::string::npos);

    void* out = nullptr;
    REQUIRE(cudaMalloc(&out, 8192) == cudaSuccess);
    auto get = [&](std::uint64_t src, std::uint64_t bytes) {
      DescriptorList l;
      l.op = Op::get;
      l.kind = MemoryKind::cuda;
      l.remote_device = 3;
      l.segments.push_back({src, reinterpret_cast<std::uint64_t>(out), bytes, 1, 0, 0});
      return run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await cuda->post(l); }());
    };
    const auto at = reinterpret_cast<std::uint64_t>(base);
    REQUIRE(get(at + kA + 100, 5000).is_ok());
    std::vector<std::byte> got(5000);
    REQUIRE(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(got.data(), pattern.data() + kA + 100, got.size()) == 0);
    REQUIRE(get(at + kB, 4096).is_ok());
    // Inside the allocation but in no registered tensor, or past one's end: refused.
    CHECK(get(at + 32768, 16).message().find("reads outside") != std::string::npos);
    CHECK(get(at + kB + 4000, 200).message().find("reads outside") != std::string::npos);
    // A region running past its allocation's end is one error at registration.
    CHECK(error_of([&] { cuda->register_memory({base + kBlock - 100, 200, 3, MemoryKind::cuda}); })
              .find("runs past the end of its CUDA allocation") != std::string::npos);
    cudaFree(out);
  }
  cudaFree(block);
}

TEST_CASE("GPU memory over host-only UCX: two-sided messages staged through page-locked host memory") {
  // What moves GPU memory between machines where UCX has no CUDA support (Debian's): the
  // sender's cuda transport copies each chunk into staging from alloc_host, UCX sends it,
  // the receiver's copies it up. Here both ends are this process (every link remote).
  testing::Patterned r("tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2,devices=4:5:6:7");
  const auto& [plan, transfers, host] = std::tie(r.plan, r.transfers, r.w);
  CudaMirror gpu(host, cuda_device_count());
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  UcxTransport ucx(io);
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  ExecutorOptions opt;
  opt.remote_links = true;
  opt.two_sided = true;
  opt.chunk_bytes = 100000;
  {
    Executor ex(*cuda, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(transfers, plan.target(), gpu.table);
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.sent_bytes == plan.summary().moved_bytes);
  }
  gpu.download(host);
  CHECK(testing::landed_as_planned(transfers, host.table));
  run_on(io, [&]() -> asio::awaitable<int> {
    co_await ucx.shutdown();
    co_return 0;
  }());
}

TEST_CASE("nccl transport: every link an NCCL message, in grouped rounds, strided runs packed on the GPU") {
  // One process holds every rank: one per GPU present (logical devices d on GPU d % gpus),
  // so on one GPU every message is a send to its own rank, which NCCL allows; with two or
  // more, messages cross GPUs. NCCL comes from NEREUS_NCCL_LIBRARY (run.sh: torch's).
  const int gpus = cuda_device_count();
  testing::Patterned r("tp=4,pp=1,dp=1", "tp=2,pp=1,dp=2,devices=4:5:6:7");
  const auto& [plan, transfers, host] = std::tie(r.plan, r.transfers, r.w);
  CudaMirror gpu(host, gpus);
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  std::unique_ptr<Transport> nccl = one_process_nccl(io, 8, gpus);
  if (!nccl) return;
  ExecutorOptions opt;
  opt.remote_links = true;
  opt.chunk_bytes = 100000;  // several rounds
  {
    Executor ex(*cuda, nccl.get(), [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(transfers, plan.target(), gpu.table);
    CHECK(bound.rounds().size() > 1);
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.sent_bytes == plan.summary().moved_bytes);
    const auto again = run_on(io, ex.run(bound));  // communicators reused
    CHECK(again.link_bytes == plan.summary().moved_bytes);
  }
  gpu.download(host);
  CHECK(testing::landed_as_planned(transfers, host.table));
}

TEST_CASE("embedded job in GPU memory: filled, changed plan through the cuda transport, checked, exported as the GPU's") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  JobOptions o;
  o.devices = 8;
  o.capacity = 64 << 20;
  o.fill = true;
  o.memory = MemoryKind::cuda;
  Job job(io.get_executor(), spec, load_global_plan(spec, testcase::kPlanA), o);
  CHECK(job.verify().ok);  // filled through host copies, checked through host copies
  const TransitionReport r = run_on(io, job.transition(load_global_plan(spec, testcase::kPlanB)));
  CHECK(r.completed);
  CHECK(r.moved_bytes > 0);
  const FillCheck v = job.verify();
  CHECK_MESSAGE(v.ok, v.first_error);
  const int gpus = cuda_device_count();
  for (const UnitView& u : job.units("actor/train"))
    for (const ShardView& sv : u.shards) {
      CHECK(sv.kind == MemoryKind::cuda);
      CHECK(sv.gpu == sv.device % gpus);
      cudaPointerAttributes at{};
      REQUIRE(cudaPointerGetAttributes(&at, sv.data) == cudaSuccess);
      CHECK(at.type == cudaMemoryTypeDevice);
      CHECK(at.device == sv.gpu);
    }
}

TEST_CASE("cuda transport refuses host memory, and the executor refuses a host transport for cuda memory") {
  testing::World host;
  const auto plan = plan_reshard(coll("tp=2,pp=1,dp=1"), coll("tp=1,pp=1,dp=2,devices=2:3"));
  host.bind_all(plan);
  CudaMirror gpu(host, cuda_device_count());
  asio::io_context io;
  LocalTransport local;
  Executor ex(local, nullptr, [](DeviceId) { return PeerId{0}; });
  const auto transfers = plan.transfers();
  CHECK(error_of([&] { ex.bind(transfers, plan.target(), gpu.table); }).find("cuda memory, which the local transport does not move") !=
        std::string::npos);
  auto cuda = make_cuda_transport(io);
  Executor on_host(*cuda, nullptr, [](DeviceId) { return PeerId{0}; });
  CHECK(error_of([&] { on_host.bind(transfers, plan.target(), host.table); }).find("which the cuda transport does not move") !=
        std::string::npos);
}

int main(int argc, char** argv) {
  if (!cuda_built() || cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device (or no CUDA in this build): skipped\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

// Issue 45's mends, each written to fail without its fix.

TEST_CASE("cuda device: an upload from pageable memory has landed when it returns, so a copy posted at once reads it") {
  // A cudaMemcpy from pageable memory returns once the bytes are staged; Nereus's queues
  // are non-blocking streams that do not wait for the legacy stream's DMA.
  auto d = make_device({MemoryKind::cuda, 0, 512 << 20, nullptr, 0});
  const std::size_t n = 200 << 20;
  DeviceBuffer a = d->allocate(n, "a"), b = d->allocate(n, "b");
  auto q = d->make_queue();
  for (unsigned char fill : {0x11, 0x5c, 0xe7}) {
    std::vector<unsigned char> host(n, fill);  // pageable
    d->upload(a.data(), reinterpret_cast<const std::byte*>(host.data()), n);
    q->copy(b.data(), a.data(), n);
    q->synchronize();
    std::vector<unsigned char> tail(4096);
    d->download(reinterpret_cast<std::byte*>(tail.data()), b.data() + n - tail.size(), tail.size());
    CHECK(std::all_of(tail.begin(), tail.end(), [&](unsigned char c) { return c == fill; }));
  }
}

TEST_CASE("cuda transport: a pair of GPUs without peer access copies all the same") {
  const int gpus = cuda_device_count();
  if (gpus < 2) {
    MESSAGE("one GPU: no pair to copy between; skipped");
    return;
  }
  const auto plan = plan_reshard(coll("tp=2,pp=1,dp=1", true), coll("tp=1,pp=2,dp=1,devices=1:0", true));
  const auto transfers = plan.transfers();
  testing::World host;
  host.bind_all(plan);
  host.pattern_sources();
  CudaMirror gpu(host, gpus);
  asio::io_context io;
  CudaTransportOptions co;
  co.inject_no_peer_access = true;  // as on a machine whose GPUs cannot map each other
  auto cuda = make_cuda_transport(io, co);
  Executor ex(*cuda, nullptr, [](DeviceId) { return PeerId{0}; }, ExecutorOptions{});
  const BoundTransition bound = ex.bind(transfers, plan.target(), gpu.table);
  const auto report = run_on(io, ex.run(bound));  // the first cross-GPU copy included
  CHECK(report.link_bytes == plan.summary().moved_bytes);
  gpu.download(host);
  CHECK(testing::landed_as_planned(transfers, host.table));
}

TEST_CASE("cuda transport: a post that fails part-way has drained what it enqueued when it returns the error") {
  auto d = make_device({MemoryKind::cuda, 0, 1200 << 20, nullptr, 0});
  const std::size_t n = 512 << 20;  // long enough that a read racing it sees old bytes
  DeviceBuffer src = d->allocate(n, "src"), dst = d->allocate(n, "dst"), other = d->allocate(4096, "other");
  REQUIRE(cudaMemset(src.data(), 0x7a, n) == cudaSuccess);
  REQUIRE(cudaMemset(dst.data(), 0, n) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  asio::io_context io;
  CudaTransportOptions co;
  co.inject_enqueue_failure_after = 1;  // the first segment is on the stream, the second fails
  auto cuda = make_cuda_transport(io, co);
  DescriptorList list;
  list.op = Op::copy;
  list.kind = MemoryKind::cuda;
  list.segments.push_back({reinterpret_cast<std::uint64_t>(src.data()), reinterpret_cast<std::uint64_t>(dst.data()), n});
  list.segments.push_back({reinterpret_cast<std::uint64_t>(src.data()), reinterpret_cast<std::uint64_t>(other.data()), 4096});
  const Status st = run_on(io, cuda->post(list));
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("injected") != std::string::npos);
  // At once, on the legacy stream (which does not wait for the transport's): the last page
  // of the first segment must already be there.
  std::vector<unsigned char> tail(4096);
  REQUIRE(cudaMemcpy(tail.data(), dst.data() + n - tail.size(), tail.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::all_of(tail.begin(), tail.end(), [](unsigned char c) { return c == 0x7a; }));
}

TEST_CASE("nccl transport: a run cancelled at once does not leave its group in flight for the next one") {
  const int gpus = cuda_device_count();
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  CudaMirror gpu(r.w, gpus);
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  std::unique_ptr<Transport> nccl = one_process_nccl(io, 4, gpus);
  if (!nccl) return;
  ExecutorOptions opt;
  opt.remote_links = true;
  Executor ex(*cuda, nccl.get(), [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(r.transfers, r.plan.target(), gpu.table);
  // A run abandoned at once: its group's coroutine is destroyed while it waits.
  {
    asio::cancellation_signal cancel;
    asio::co_spawn(io, ex.run(bound), asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    io.poll();
    cancel.emit(asio::cancellation_type::terminal);
    io.run_for(std::chrono::seconds(5));
    io.restart();
  }
  std::string error;
  try {
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.sent_bytes == r.plan.summary().moved_bytes);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK_MESSAGE(error.find("another was in flight") == std::string::npos, error);
}
