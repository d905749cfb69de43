#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include <fstream>

#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/base/trace_events.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

json timings_json(const std::vector<TransferTiming>& timings) {
  json out = json::array();
  for (const TransferTiming& t : timings) out.push_back({t.src, t.dst, t.bytes, t.start, t.end});
  return out;
}

void write_transfer_trace(const TransitionConfig& c, const std::map<int, json>& timings) {
  TraceEvents trace;
  trace.process(1, "devices (receiving)");
  trace.process(2, "links");
  const std::string reshard = c.model + " " + c.from + " -> " + c.to;
  for (const auto& [rank, list] : timings)
    for (const json& t : list) {
      const auto src = t[0].get<int>(), dst = t[1].get<int>();
      const auto bytes = t[2].get<std::uint64_t>();
      const double start = t[3].get<double>(), end = t[4].get<double>();
      const std::string transport = src == dst ? "local copy" : c.transport == "ucx" ? "ucx" : "local";
      const json args = {{"bytes", bytes}, {"transport", transport}, {"src", src}, {"dst", dst}, {"process", rank}, {"reshard", reshard}};
      const std::string name = human_bytes(bytes) + " " + std::to_string(src) + " → " + std::to_string(dst);
      trace.complete(1, "device " + std::to_string(dst), name, start, end - start, args);
      trace.complete(2, std::to_string(src) + " → " + std::to_string(dst), name, start, end - start, args);
    }
  std::ofstream out(c.perfetto);
  out << trace.dump();
  if (!out) throw Error("--perfetto: cannot write '" + c.perfetto + "'");
}

Prepared prepare(const TransitionConfig& c) {
  if (c.transport != "local" && c.transport != "ucx")
    throw Error("--transport " + c.transport + " is not one of: local, ucx");
  if (c.procs < 1) throw Error("--procs must be at least 1");
  if (c.procs > 1 && c.transport == "local")
    throw Error("--transport local moves bytes inside one process; use --transport ucx with --procs " + std::to_string(c.procs));
  if (c.repeat < 1) throw Error("--repeat must be at least 1");
  Prepared p = prepare_reshard(c);
  if (c.procs > static_cast<int>(p.devices.size()))
    throw Error("--procs " + std::to_string(c.procs) + " exceeds the " + std::to_string(p.devices.size()) + " devices");
  return p;
}

double memcpy_gbps(unsigned threads) {
  threads = std::max(1u, threads);
  const std::size_t per = std::size_t{128} << 20;
  std::vector<std::vector<std::byte>> src(threads, std::vector<std::byte>(per, std::byte{1}));
  std::vector<std::vector<std::byte>> dst(threads, std::vector<std::byte>(per, std::byte{0}));
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (unsigned k = 0; k < threads; ++k) pool.emplace_back([&, k] { std::memcpy(dst[k].data(), src[k].data(), per); });
    for (auto& t : pool) t.join();
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(runs.begin(), runs.end());
  return static_cast<double>(per * threads) / runs[runs.size() / 2] / 1e9;
}

int report(const TransitionConfig& c, const Prepared& p, nlohmann::json r) {
  const auto& s = p.plan.summary();
  r["transport"] = c.transport;
  r["procs"] = c.procs;
  r["repeat"] = c.repeat;
  r["model"] = c.model;
  r["from"] = c.from;
  r["to"] = c.to;
  r["moved_bytes"] = s.moved_bytes;
  r["local_bytes"] = s.local_bytes;
  r["kept_bytes"] = s.kept_bytes;
  r["target_bytes"] = s.target_bytes;
  r["transfer_count"] = s.transfer_count;
  r["plan_ms"] = s.plan_ms;
  const bool failed = r.contains("error");
  const bool verify_failed = r.contains("verified") && r["verified"].is_boolean() && !r["verified"].get<bool>();
  if (c.json) {
    std::cout << r.dump() << "\n";
  } else if (!failed) {
    std::cout << fmt::format("transition   {} {} -> {} ({}, {} process{})\n", c.model, c.from, c.to, c.transport, c.procs,
                             c.procs == 1 ? "" : "es");
    std::cout << fmt::format("moved        {:.3f} GB over links, {:.3f} GB copied on devices, {:.3f} GB kept\n",
                             s.moved_bytes / 1e9, (s.local_bytes - s.kept_bytes) / 1e9, s.kept_bytes / 1e9);
    std::cout << fmt::format("time         median {:.4f} s, min {:.4f} s over {} runs\n", r.value("seconds_median", 0.0),
                             r.value("seconds_min", 0.0), c.repeat);
    std::cout << fmt::format("bandwidth    {:.2f} GB/s moved, {:.2f} GB/s copied", r.value("gbps", 0.0), r.value("copy_gbps", 0.0));
    if (r.contains("memcpy_gbps"))
      std::cout << fmt::format(" (memcpy {:.2f} GB/s, ratio {:.2f})", r["memcpy_gbps"].get<double>(),
                               r["ratio_to_memcpy"].get<double>());
    std::cout << "\n";
    if (r["verified"].is_boolean())
      std::cout << fmt::format("verified     {}\n", r["verified"].get<bool>() ? "every destination byte matches the fill" : "MISMATCH");
  }
  if (failed) {
    std::cerr << "nereus: error: " << r["error"].get<std::string>() << "\n";
    return 1;
  }
  if (verify_failed) {
    std::cerr << "nereus: error: verification failed: " << r.value("verify_error", std::string("?")) << "\n";
    return 1;
  }
  return 0;
}


}  // namespace nereus::bench
