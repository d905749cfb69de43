// A worker process of `nereus bench transition --procs N`: owns its share of the
// devices, fills its sources, pulls what its devices receive.
#include <signal.h>
#include <unistd.h>

#include "control.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/ucx.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

namespace {

/// Whether every coroutine of `scope` finished within `limit`.
asio::awaitable<bool> join_within(AsyncScope& scope, std::chrono::milliseconds limit) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  const auto until = std::chrono::steady_clock::now() + limit;
  while (scope.pending() > 0 && std::chrono::steady_clock::now() < until) {
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(asio::use_awaitable);
  }
  if (scope.pending() > 0) co_return false;
  co_await scope.join();
  co_return true;
}

struct Worker {
  const TransitionConfig& c;
  Prepared& p;
  asio::io_context& io;
  Socket& control;
  UnitStore& store;
  LocalTransport& local;
  UcxTransport& ucx;
  std::vector<DeviceId> all;

  PeerId owner(DeviceId d) const {
    for (int r = 0; r < c.procs; ++r) {
      const auto mine = devices_of(all, r, c.procs);
      if (std::find(mine.begin(), mine.end(), d) != mine.end()) return static_cast<PeerId>(r);
    }
    return 0;
  }

  asio::awaitable<void> run_once(Executor& ex, const BoundTransition& bound) {
    json msg;
    try {
      const ExecutionReport rep = co_await ex.run(bound);
      msg = {{"type", "done"},
             {"seconds", rep.seconds},
             {"link_bytes", rep.link_bytes},
             {"local_bytes", rep.local_bytes},
             {"transfers", rep.timings.size()},
             {"commits", rep.commits.size()}};
    } catch (const std::exception& e) {
      msg = {{"type", "failed"}, {"error", e.what()}};
    }
    co_await send(control, msg);
  }

  asio::awaitable<void> main() {
    const PeerId self = static_cast<PeerId>(c.worker_rank);
    std::vector<Registration> regs;
    json regions = json::array(), buffers = json::array();
    for (auto& [d, dev] : store.devices()) {
      regs.push_back(ucx.register_memory({dev->arena(), dev->capacity(), d, MemoryKind::host}));
      regions.push_back({{"device", d}, {"key", binary(regs.back().remote_key)}});
    }
    for (const auto& [key, b] : store.table().all())
      if (key.side != kTargetSide)
        buffers.push_back({key.side, key.device, key.buffer, static_cast<int>(key.slot), b.address, b.bytes});
    {
      const json msg = {{"type", "ready"}, {"address", binary(ucx.address())}, {"regions", regions}, {"buffers", buffers}};
      co_await send(control, msg);
    }

    json peers = co_await receive(control);
    if (peers.value("type", std::string()) != "peers") co_return;
    for (const json& w : peers["workers"]) {
      const auto r = w["rank"].get<PeerId>();
      if (r == self) continue;
      if (Status st = ucx.connect(r, bytes_of(w["address"])); !st) throw Error(st.message());
      for (const json& reg : w["regions"])
        if (Status st = ucx.add_remote_region(r, reg["device"].get<DeviceId>(), bytes_of(reg["key"])); !st)
          throw Error(st.message());
      for (const json& b : w["buffers"])
        store.table().bind({b[0].get<std::uint32_t>(), b[1].get<DeviceId>(), b[2].get<TensorId>(), static_cast<Slot>(b[3].get<int>())},
                           {b[4].get<std::uint64_t>(), b[5].get<std::uint64_t>(), r});
    }
    ExecutorOptions eo;
    eo.per_link_concurrency = c.per_link;
    eo.chunk_bytes = c.chunk_bytes;
    eo.self = self;
    Executor ex(local, &ucx, [this](DeviceId d) { return owner(d); }, eo);
    const auto mine = devices_of(all, c.worker_rank, c.procs);
    const auto transfers = p.plan.transfers_touching(mine);
    const BoundTransition bound = ex.bind(transfers, p.target, store.table());
    {
      const json msg = {{"type", "connected"}};
      co_await send(control, msg);
    }

    AsyncScope scope(co_await asio::this_coro::executor);
    asio::steady_timer doom(io);
    bool stuck = false;
    for (;;) {
      json m = co_await receive(control);
      const std::string t = m.value("type", std::string("eof"));
      if (t == "run") {
        if (c.kill_worker == c.worker_rank) {  // fault injection: die mid-transition
          doom.expires_after(std::chrono::milliseconds(3));
          doom.async_wait([](auto) { ::raise(SIGKILL); });
        }
        scope.spawn(run_once(ex, bound));
      } else if (t == "abort") {
        ex.cancel();
        // RMA gets cannot always be cancelled (ucp_request_cancel covers receives):
        // wait a bounded time, then leave them; they only write destination buffers.
        stuck = !co_await join_within(scope, std::chrono::seconds(2));
        const json msg = {{"type", "aborted"}, {"stuck", stuck}};
        co_await send(control, msg);
      } else if (t == "verify") {
        if (!stuck) co_await scope.join();
        const bool sources_only = m.value("sources_only", false);
        const FillCheck s = store.verify_sources(c.copy_threads);
        json r = {{"type", "verified"}, {"sources_ok", s.ok}, {"bytes", s.bytes}};
        if (!sources_only) {
          const FillCheck tc = store.verify_targets(c.copy_threads);
          r["targets_ok"] = tc.ok;
          r["bytes"] = tc.bytes;
          if (!tc.ok) r["error"] = tc.first_error;
        }
        if (!s.ok) r["error"] = "source " + s.first_error;
        co_await send(control, r);
      } else if (t == "dump") {
        {
          const json msg = {{"type", "dumped"}, {"files", store.dump(m["dir"].get<std::string>())}};
          co_await send(control, msg);
        }
      } else {  // "exit", or the parent went away
        ex.cancel();
        if (stuck || !co_await join_within(scope, std::chrono::seconds(2))) std::_Exit(3);  // nothing left to save
        break;
      }
    }
    for (const auto& r : regs) ucx.deregister_memory(r);
    co_await ucx.shutdown();
  }
};

}  // namespace

int run_worker(const TransitionConfig& c) {
  Prepared p = prepare(c);
  const auto mine = devices_of(p.devices, c.worker_rank, c.procs);
  UnitStore store(p.plan, mine, c.capacity.empty() ? 0 : parse_capacity(c.capacity), static_cast<PeerId>(c.worker_rank));
  asio::io_context io;
  Socket control(io, asio::local::stream_protocol(), c.control_fd);
  try {
    store.allocate_and_fill(c.copy_threads);
  } catch (const std::exception& e) {
    asio::co_spawn(io, send(control, {{"type", "failed"}, {"error", e.what()}}), asio::detached);
    io.run();
    return 1;
  }
  LocalTransport local({c.copy_threads, 1 << 20});
  UcxOptions uo;
  uo.peer_error_handling = c.ucx_peer_errors;
  UcxTransport ucx(io, uo);
  Worker w{c, p, io, control, store, local, ucx, p.devices};
  std::exception_ptr err;
  asio::co_spawn(io, w.main(), [&](std::exception_ptr e) { err = e; });
  io.run();
  if (err) {
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nereus worker %d: %s\n", c.worker_rank, e.what());
    }
    return 1;
  }
  return 0;
}

}  // namespace nereus::bench
