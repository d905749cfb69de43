// One process owns every device: local copies, or UCX through a loopback endpoint.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/progress.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/nccl.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/ucx.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

namespace {

/// Runs `a` on `io` until it completes (the io_context may have other work forever).
template <class T>
T run_until_done(asio::io_context& io, asio::awaitable<T> a) {
  std::optional<T> out;
  std::exception_ptr err;
  bool done = false;
  io.restart();  // a previous run that drained the loop left it stopped
  asio::co_spawn(io, std::move(a), [&](std::exception_ptr e, T v) {
    err = e;
    if (!e) out = std::move(v);
    done = true;
  });
  while (!done)
    if (io.run_one() == 0) throw Error("internal: the event loop ran out of work before the run finished");
  if (err) std::rethrow_exception(err);
  return std::move(*out);
}

}  // namespace

int run_single_process(const TransitionConfig& c) {
  Prepared p = prepare(c);
  if (!c.cuda) check_host_memory(p);
  asio::io_context io;
  std::unique_ptr<UcxTransport> ucx;  // before the store: it allocates the store's arenas
  if (c.every_link_remote()) {
    UcxOptions uo;
    uo.peer_error_handling = c.ucx_peer_errors;
    ucx = std::make_unique<UcxTransport>(io, uo);
  }
  UnitStore store(p.plan, p.devices, c.capacity.empty() ? 0 : parse_capacity(c.capacity), 0, ucx.get(),
                  c.cuda ? MemoryKind::cuda : MemoryKind::host, c.cuda ? cuda_device_count() : 1);
  store.allocate_and_fill(c.copy_threads);
  LocalTransport local({c.copy_threads, 1 << 20});
  std::unique_ptr<Transport> cuda = c.cuda ? make_cuda_transport(io) : nullptr;
  std::unique_ptr<Transport> nccl;  // every link an NCCL message; this process holds one rank per GPU
  if (c.nccl) {
    NcclTransportOptions no;
    no.devices = p.devices;
    no.owner_of = [](DeviceId) { return PeerId{0}; };
    const int gpus = std::max(1, cuda_device_count());
    no.gpu_of = [gpus](DeviceId d) { return static_cast<int>(d) % gpus; };  // as the store places them
    nccl = make_nccl_transport(io, std::move(no));
    if (Status st = nccl->connect(0, nccl->address()); !st) throw Error(st.message());
  }
  std::vector<Registration> regs;
  if (ucx) {
    if (Status st = ucx->connect(0, ucx->address()); !st) throw Error(st.message());
    for (auto& [d, dev] : store.devices()) {
      if (dev->kind() != MemoryKind::host) continue;  // GPU memory goes as staged messages
      regs.push_back(ucx->register_memory({dev->arena(), dev->capacity(), d, MemoryKind::host}));
      if (Status st = ucx->add_remote_region(0, d, regs.back().remote_key); !st) throw Error(st.message());
    }
  }
  ExecutorOptions eo;
  eo.per_link_concurrency = c.per_link;
  eo.chunk_bytes = c.chunk_bytes;
  eo.remote_links = ucx != nullptr || nccl != nullptr;
  eo.two_sided = c.two_sided;
  eo.rounds = c.rounds;
  Transport* remote = nccl ? nccl.get() : ucx.get();
  Executor ex(cuda ? *cuda : static_cast<Transport&>(local), remote, [](DeviceId) { return PeerId{0}; }, eo);
  const BoundTransition bound = ex.bind(store.transfers(), p.target, store.table());

  std::vector<double> secs, quantize_secs;
  ExecutionReport last;
  // Bytes, not runs: one long transition shows its progress inside the run too.
  const double per_run = static_cast<double>(bound.bytes());
  Progress progress("bench transition", per_run * c.repeat, "bytes", c.quiet || c.json);
  int runs_done = 0;
  asio::steady_timer tick(io);
  if (progress.shown())
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      for (;;) {
        progress.update(per_run * runs_done + static_cast<double>(ex.landed_bytes()));
        tick.expires_after(std::chrono::milliseconds(100));
        auto [ec] = co_await tick.async_wait(asio::as_tuple(asio::use_awaitable));
        if (ec || runs_done == c.repeat) co_return;
      }
    }, asio::detached);
  for (int r = 0; r < c.repeat; ++r) {
    // A bf16 → FP8 run quantizes first, where the bytes are read; its time is the run's.
    double quantized = 0;
    if (store.quantizes()) {
      const auto q0 = std::chrono::steady_clock::now();
      store.quantize(c.copy_threads);
      quantized = std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count();
      quantize_secs.push_back(quantized);
    }
    last = run_until_done(io, ex.run(bound));
    secs.push_back(quantized + last.seconds);
    runs_done = r + 1;
    progress.update(per_run * runs_done);
  }
  tick.cancel();
  io.restart();
  io.poll();  // lets the ticker see the cancellation and end
  progress.finish();
  const TransferLabels labels = transfer_labels(c, p);
  const std::map<int, json> timings{{0, timings_json(last.timings)}};
  if (wants_timings(c)) write_transfer_outputs(c, labels, timings);
  nlohmann::json out = run_figures(p, secs, last.link_bytes + last.local_bytes, quantize_secs);
  out["transports"] = transports_json(labels, timings);
  const double copied = static_cast<double>(last.link_bytes + last.local_bytes);
  const double median = out["seconds_median"];
  out["units_committed"] = last.commits.size();
  out["peak_device_bytes"] = store.peak_bytes();
  if (!ucx && !cuda) {  // local, or auto in one process: every link a local copy
    const double mc = memcpy_gbps(c.copy_threads);
    out["memcpy_gbps"] = mc;
    out["ratio_to_memcpy"] = copied / median / 1e9 / mc;
  }
  out["verified"] = nullptr;
  if (c.verify) {
    const FillCheck t = store.verify_targets(c.copy_threads);
    const FillCheck s = store.verify_sources(c.copy_threads);
    out["verified"] = t.ok && s.ok;
    out["verified_bytes"] = t.bytes;
    if (!t.ok || !s.ok) out["verify_error"] = t.ok ? "source " + s.first_error : t.first_error;
  }
  if (!c.dump_dir.empty()) {
    nlohmann::json files = store.dump(c.dump_dir);
    std::ofstream(std::filesystem::path(c.dump_dir) / "manifest.json") << nlohmann::json{{"files", files}}.dump(1) << "\n";
  }
  if (ucx) {
    for (const auto& reg : regs) ucx->deregister_memory(reg);
    run_until_done(io, [](UcxTransport& u) -> asio::awaitable<int> {
      co_await u.shutdown();
      co_return 0;
    }(*ucx));
    io.run();
  }
  return report(c, p, std::move(out));
}

int run_transition_bench(const TransitionConfig& c, const std::vector<std::string>& argv) {
  if (c.worker_rank >= 0) return run_worker(c);
  if (!c.daemons.empty()) return run_on_daemons(c);
  if (c.procs == 1) return run_single_process(c);
  return run_parent(c, "/proc/self/exe", argv);
}

}  // namespace nereus::bench
