// A worker process of `nereus bench transition --procs N`: owns its share of the
// devices, fills its sources, pulls what its devices receive.
#include <signal.h>
#include <unistd.h>

#include "control.hpp"
#include "nereus/base/error.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

namespace {

json to_json(const PeerInfo& w) {
  json regions = json::array(), buffers = json::array();
  for (const auto& r : w.regions) regions.push_back({{"device", r.device}, {"key", binary(r.key)}});
  for (const auto& b : w.buffers)
    buffers.push_back({b.side, b.device, b.buffer, static_cast<int>(b.slot), b.address, b.bytes, static_cast<int>(b.kind)});
  return {{"rank", w.rank}, {"address", binary(w.address)}, {"regions", regions}, {"buffers", buffers}, {"machine", w.machine}};
}

PeerInfo peer_of(const json& w) {
  PeerInfo out;
  out.rank = w["rank"].get<PeerId>();
  out.address = bytes_of(w["address"]);
  for (const json& r : w["regions"]) out.regions.push_back({r["device"].get<DeviceId>(), bytes_of(r["key"])});
  for (const json& b : w["buffers"])
    out.buffers.push_back({b[0].get<std::uint32_t>(), b[1].get<DeviceId>(), b[2].get<TensorId>(), static_cast<Slot>(b[3].get<int>()),
                           b[4].get<std::uint64_t>(), b[5].get<std::uint64_t>(), static_cast<MemoryKind>(b[6].get<int>())});
  out.machine = w.value("machine", "");
  return out;
}

json verified_message(const Participant& part, bool sources_only) {
  const FillCheck s = part.verify_sources();
  json r = {{"type", "verified"}, {"sources_ok", s.ok}, {"bytes", s.bytes}};
  if (!sources_only) {
    const FillCheck tc = part.verify_targets();
    r["targets_ok"] = tc.ok;
    r["bytes"] = tc.bytes;
    if (!tc.ok) r["error"] = tc.first_error;
  }
  if (!s.ok) r["error"] = "source " + s.first_error;
  return r;
}

asio::awaitable<void> serve(const TransitionConfig& c, asio::io_context& io, Socket& control, Participant& part) {
  {
    json msg = to_json(part.start());
    msg["type"] = "ready";
    co_await send(control, msg);
  }
  json peers = co_await receive(control);
  if (peers.value("type", std::string()) != "peers") co_return;
  std::vector<PeerInfo> infos;
  for (const json& w : peers["workers"]) infos.push_back(peer_of(w));
  part.connect(infos);
  part.warm();  // before any run: nothing of ours is in flight yet, and peers do not need our loop
  {
    const json msg = {{"type", "connected"}};
    co_await send(control, msg);
  }
  asio::steady_timer doom(io);
  for (;;) {
    json m = co_await receive(control);
    const std::string t = m.value("type", std::string("eof"));
    if (t == "run") {
      if (c.kill_worker == c.worker_rank) {  // fault injection: die mid-transition
        doom.expires_after(std::chrono::milliseconds(3));
        doom.async_wait([](auto) { ::raise(SIGKILL); });
      }
      const bool last = m.value("last", false);  // its transfers travel back (the report's transports)
      part.run([&control, &c, last](RunResult r) -> asio::awaitable<void> {
        json msg = r.ok ? json{{"type", "done"},
                               {"seconds", r.report.seconds},
                               {"link_bytes", r.report.link_bytes},
                               {"local_bytes", r.report.local_bytes},
                               {"transfers", r.report.timings.size()},
                               {"commits", r.report.commits.size()}}
                        : json{{"type", "failed"}, {"error", r.error}};
        if (r.ok && (last || wants_timings(c))) msg["timings"] = timings_json(r.report.timings);
        co_await send(control, msg);
      });
    } else if (t == "quantize") {  // before "run": the peers read what this writes (the parent times it)
      part.quantize();
      const json msg = {{"type", "quantized"}};
      co_await send(control, msg);
    } else if (t == "abort") {
      const bool stopped = co_await part.abort(std::chrono::seconds(2));
      const json msg = {{"type", "aborted"}, {"stuck", !stopped}};
      co_await send(control, msg);
    } else if (t == "verify") {
      co_await part.settle();
      co_await send(control, verified_message(part, m.value("sources_only", false)));
    } else if (t == "dump") {
      const json msg = {{"type", "dumped"}, {"files", part.dump(m["dir"].get<std::string>())}};
      co_await send(control, msg);
    } else {  // "exit", or the parent went away
      if (!co_await part.finish(std::chrono::seconds(2))) std::_Exit(3);  // nothing left to save
      break;
    }
  }
}

}  // namespace

int run_worker(const TransitionConfig& c) {
  Prepared p = prepare(c);
  asio::io_context io;
  Socket control(io, asio::local::stream_protocol(), c.control_fd);
  const auto all = p.devices;
  const auto owner = [&c, all](DeviceId d) {
    for (int r = 0; r < c.procs; ++r) {
      const auto mine = devices_of(all, r, c.procs);
      if (std::find(mine.begin(), mine.end(), d) != mine.end()) return static_cast<PeerId>(r);
    }
    return PeerId{0};
  };
  TransitionConfig mine = c;
  mine.machine = c.machine_of(c.worker_rank);  // this worker's (emulated) machine, for CUDA IPC
  Participant part(io, mine, p, devices_of(p.devices, c.worker_rank, c.procs), static_cast<PeerId>(c.worker_rank), owner);
  std::exception_ptr err;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::string failed;
    try {
      co_await serve(c, io, control, part);
    } catch (const Error& e) {
      failed = e.what();
    }
    if (!failed.empty()) {  // tell the parent (no co_await inside a handler), then fail
      const json msg = {{"type", "failed"}, {"error", failed}};
      co_await send(control, msg);
      throw Error(failed);
    }
  }, [&](std::exception_ptr e) { err = e; });
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
