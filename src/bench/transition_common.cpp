#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include <fstream>

#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/base/device.hpp"
#include "nereus/base/svg.hpp"
#include "nereus/plan/geometry.hpp"
#include "nereus/base/trace_events.hpp"
#include "nereus/runtime/participant.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/nccl.hpp"
#include "transition_bench.hpp"

namespace nereus::bench {

json timings_json(const std::vector<TransferTiming>& timings) {
  json out = json::array();
  for (const TransferTiming& t : timings) out.push_back({t.src, t.dst, t.bytes, t.start, t.end});
  return out;
}

namespace {

struct Moved {
  int src, dst;
  std::uint64_t bytes;
  double start, end;
};

std::vector<Moved> moved_of(const std::map<int, json>& timings, std::vector<int>* process = nullptr) {
  std::vector<Moved> out;
  for (const auto& [rank, list] : timings)
    for (const json& t : list) {
      out.push_back({t[0].get<int>(), t[1].get<int>(), t[2].get<std::uint64_t>(), t[3].get<double>(), t[4].get<double>()});
      if (process) process->push_back(rank);
    }
  return out;
}

void write_text(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path);
  out << text;
  if (!out) throw Error(std::string(flag) + ": cannot write '" + path + "'");
}

std::string transfer_trace(const TransitionConfig& c, const TransferLabels& labels, const std::map<int, json>& timings) {
  TraceEvents trace;
  // One group of device tracks per process (per node with --daemons), then the links.
  const bool several = timings.size() > 1;
  const std::string who = c.daemons.empty() ? "process " : "node ";
  for (const auto& [rank, list] : timings)
    trace.process(several ? 10 + rank : 1, several ? who + std::to_string(rank) + " · devices (receiving)" : "devices (receiving)");
  trace.process(2, "links");
  const std::string reshard = c.model + " " + c.from + " -> " + c.to;
  std::vector<int> process;
  const std::vector<Moved> moved = moved_of(timings, &process);
  for (std::size_t i = 0; i < moved.size(); ++i) {
    const Moved& m = moved[i];
    const std::string transport = labels(m.src, m.dst);
    const json args = {{"bytes", m.bytes}, {"transport", transport}, {"src", m.src}, {"dst", m.dst}, {"process", process[i]}, {"reshard", reshard}};
    const std::string name = human_bytes(m.bytes) + " " + std::to_string(m.src) + " → " + std::to_string(m.dst);
    trace.complete(several ? 10 + process[i] : 1, "device " + std::to_string(m.dst), name, m.start, m.end - m.start, args);
    trace.complete(2, std::to_string(m.src) + " → " + std::to_string(m.dst), name, m.start, m.end - m.start, args);
  }
  return trace.dump();
}

/// Each link's GB/s over the run (transfers spread evenly over their span, 60 bins), the
/// busiest links as lines, the rest summed into one.
std::string link_plot(const TransitionConfig& c, const std::map<int, json>& timings) {
  const std::vector<Moved> moved = moved_of(timings);
  double end = 0;
  std::map<std::pair<int, int>, std::uint64_t> per_link;
  for (const Moved& m : moved)
    if (m.src != m.dst) end = std::max(end, m.end), per_link[{m.src, m.dst}] += m.bytes;
  std::vector<std::pair<std::uint64_t, std::pair<int, int>>> order;
  for (const auto& [link, bytes] : per_link) order.push_back({bytes, link});
  std::sort(order.rbegin(), order.rend());
  const std::size_t shown = std::min<std::size_t>(order.size(), 8);
  std::map<std::pair<int, int>, std::size_t> series;
  for (std::size_t i = 0; i < order.size(); ++i) series[order[i].second] = std::min(i, shown);
  const std::size_t bins = 60, lines = shown + (order.size() > shown ? 1 : 0);
  const double width = end > 0 ? end / bins : 1;
  std::vector<std::vector<double>> rate(lines, std::vector<double>(bins, 0));
  for (const Moved& m : moved) {
    if (m.src == m.dst) continue;
    const double span = std::max(1e-9, m.end - m.start);
    for (std::size_t b = 0; b < bins; ++b) {
      const double lo = b * width, hi = lo + width;
      const double overlap = std::max(0.0, std::min(hi, m.end) - std::max(lo, m.start));
      rate[series[{m.src, m.dst}]][b] += static_cast<double>(m.bytes) * overlap / span / width / 1e9;
    }
  }
  double ymax = 1e-9;
  for (const auto& r : rate) ymax = std::max(ymax, *std::max_element(r.begin(), r.end()));
  ymax *= 1.1;
  const double W = 960, left = 70, right = 30, pw = W - left - right;
  const std::vector<std::string> heading =
      svg::fit_title("bench transition · " + c.model + " · " + c.from + " → " + c.to + " · " + c.transport + " · " +
                         std::to_string(c.procs) + (c.procs == 1 ? " process" : " processes"),
                     static_cast<std::size_t>(pw / 8.3));
  const double legend_top = 22.0 + 20.0 * static_cast<double>(heading.size());
  const double top = legend_top + 18.0 * static_cast<double>((lines + 3) / 4) + 8, ph = 300, H = top + ph + 50;
  auto x = [&](double t) { return left + pw * t / std::max(1e-9, end); };
  auto y = [&](double v) { return top + ph * (1 - v / ymax); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n",
      W, H, W, H);
  for (std::size_t i = 0; i < heading.size(); ++i)
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"15\">{}</text>\n", left, 22 + 20 * i, svg::escape(heading[i]));
  for (std::size_t k = 0; k < lines; ++k) {
    const std::string name = k < shown ? fmt::format("{} → {}: {}", order[k].second.first, order[k].second.second, human_bytes(order[k].first))
                                       : fmt::format("{} other links", order.size() - shown);
    const double lx = left + pw / 4 * static_cast<double>(k % 4), ly = legend_top + 18 * static_cast<double>(k / 4);
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", lx, ly - 4,
                       svg::colour(k), lx + 20, ly, svg::escape(svg::clip(name, 30)));
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", left, top, pw, ph);
  for (int k = 0; k <= 4; ++k) {
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3g}</text>\n", left - 6, y(ymax * k / 4) + 4, ymax * k / 4);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.3g}</text>\n", x(end * k / 4), top + ph + 16, end * k / 4);
  }
  for (std::size_t k = 0; k < lines; ++k) {
    std::string pts;
    for (std::size_t b = 0; b < bins; ++b) pts += fmt::format("{:.1f},{:.1f} ", x((static_cast<double>(b) + 0.5) * width), y(rate[k][b]));
    out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\" points=\"{}\"/>\n", svg::colour(k), pts);
  }
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">seconds from the run's start</text>"
      "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">GB/s per link</text>\n",
      left + pw / 2, H - 14, top + ph / 2, top + ph / 2);
  return out + "</svg>\n";
}

}  // namespace

std::string TransferLabels::operator()(int src, int dst) const {
  const int a = owner(src), b = owner(dst);
  return names(src == dst, !links_remote && a == b, machine(a) == machine(b));
}

TransferLabels transfer_labels(const TransitionConfig& c, const Prepared& p, int devices_per_node, std::map<int, int> machines) {
  const TransportNames names = transport_names(c);
  if (!c.daemons.empty()) {
    const int per = std::max(1, devices_per_node);
    return {[per](int d) { return d / per; }, false, names,
            [m = std::move(machines)](int node) { return m.contains(node) ? m.at(node) : 0; }};
  }
  if (c.procs > 1) {
    std::map<int, int> owner;
    for (int r = 0; r < c.procs; ++r)
      for (DeviceId d : devices_of(p.devices, r, c.procs)) owner[static_cast<int>(d)] = r;
    const int procs = c.procs, nodes = c.nodes;
    return {[owner](int d) { return owner.contains(d) ? owner.at(d) : 0; }, false, names,
            [procs, nodes](int r) { return r * nodes / procs; }};
  }
  return {[](int) { return 0; }, c.every_link_remote(), names};
}

json transports_json(const TransferLabels& labels, const std::map<int, json>& timings) {
  struct Span {
    std::uint64_t bytes = 0;
    double start = 1e300, end = 0;
  };
  std::map<std::string, Span> by;
  for (const Moved& m : moved_of(timings)) {
    Span& s = by[labels(m.src, m.dst)];
    s.bytes += m.bytes;
    s.start = std::min(s.start, m.start);
    s.end = std::max(s.end, m.end);
  }
  json out = json::object();
  for (const auto& [name, s] : by)
    out[name] = {{"bytes", s.bytes}, {"gbps", s.end > s.start ? static_cast<double>(s.bytes) / (s.end - s.start) / 1e9 : 0.0}};
  return out;
}

void write_transfer_outputs(const TransitionConfig& c, const TransferLabels& labels, const std::map<int, json>& timings) {
  if (!c.perfetto.empty()) write_text(c.perfetto, transfer_trace(c, labels, timings), "--perfetto");
  if (!c.plot.empty()) write_text(c.plot, link_plot(c, timings), "--plot");
}

Prepared prepare(const TransitionConfig& c) {
  return refusing_input([&] {  // nothing runs before this returns
  if (c.transport != "local" && c.transport != "ucx" && c.transport != "ucx-tag" && c.transport != "auto" && c.transport != "cuda" &&
      c.transport != "nccl")
    throw Error("--transport " + c.transport + " is not one of: local, ucx, ucx-tag, auto, cuda, nccl");
  const std::string gpu_flag = c.transport == "cuda" || c.transport == "nccl" ? "--transport " + c.transport : "--memory cuda";
  // With --daemons the GPUs and the build that drives them are the nodes': they check.
  const bool here = c.daemons.empty();
  if (here && c.cuda && !cuda_built()) throw Error(gpu_flag + ": this build has no CUDA (reconfigure with -Dcuda=enabled)");
  if (here && c.cuda && cuda_device_count() == 0) throw Error(gpu_flag + ": no CUDA device is present");
  if (c.procs < 1) throw Error("--procs must be at least 1");
  if (c.procs > 1 && c.transport == "local")
    throw Error("--transport local moves bytes inside one process; use --transport ucx, ucx-tag, auto, cuda or nccl with --procs " + std::to_string(c.procs));
  if (!here && c.transport == "local")
    throw Error("--transport local moves bytes inside one process; use --transport ucx, ucx-tag, auto, cuda or nccl with --daemons");
  if (c.repeat < 1) throw Error("--repeat must be at least 1");
  if (c.nodes < 1 || c.nodes > c.procs) throw Error("--nodes " + std::to_string(c.nodes) + " must be between 1 and --procs (" + std::to_string(c.procs) + ")");
  if (c.nodes > 1 && !c.ipc)
    throw Error("--nodes emulates machines that CUDA IPC does not cross: it needs --transport cuda or auto with --memory cuda");
  if (c.across == "nccl" && !c.ipc) throw Error("--across nccl is for the links CUDA IPC does not reach: it needs --transport cuda or auto with --memory cuda");
  if (here && c.nccl && !nccl_built())
    throw Error(std::string(c.transport == "nccl" ? "--transport nccl" : "--across nccl") +
                ": this build has no NCCL transport (it needs cudart and nccl.h)");
  Prepared p = prepare_reshard(c);
  if (c.procs > static_cast<int>(p.devices.size()))
    throw Error("--procs " + std::to_string(c.procs) + " exceeds the " + std::to_string(p.devices.size()) + " devices");
  return p;
  });
}

void check_host_memory(const Prepared& p) {
  // Targets not kept in place, and (at most) the FP8 staging the senders quantize into.
  std::uint64_t need = p.plan.summary().target_bytes - p.plan.summary().kept_bytes + p.plan.summary().quantized_bytes;
  for (const Collection& c : p.plan.sources()) {
    UnitGeometry geo(c.model);
    for (const Emu& u : c.units)
      for (int s = 0; s < u.layout.pp; ++s)
        for (int g = 0; g < u.layout.stage_size(); ++g) need += geo.held({&u.layout, s, g}).bytes(c.train);
  }
  const std::uint64_t free = host_memory_available();
  if (free > 0 && need > free)
    throw InputError("the units need " + human_bytes(need) + " of host memory but this machine has " + human_bytes(free) +
                " available: use a smaller model or fewer replicas, or run across machines (--daemons)");
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
