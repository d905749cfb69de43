// The controller's planner: decision time and peak heap memory of one replan per pool
// size, PPO llama-3.1-8b (4 models, 7 model-stages) on cluster-1 (128 nodes x 8 MI250X
// GCDs, memory binds) and cluster-3 (8 x 8 H200), short and long responses.
//   planner_bench [--repeat N] [--smoke] [--json]
//
// Peak memory is counted by replacing global operator new/delete in this binary: the
// largest number of live heap bytes during one plan_job call, above what was live before.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <nlohmann/json.hpp>

#include "bench_args.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/control/planner.hpp"

namespace {

std::atomic<std::int64_t> g_live{0}, g_peak{0};

void* counted_alloc(std::size_t n) {
  // A header before the block remembers its size, so delete can subtract it.
  auto* p = static_cast<std::size_t*>(std::malloc(n + 16));
  if (!p) throw std::bad_alloc();
  *p = n;
  const std::int64_t live = g_live.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
  std::int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return reinterpret_cast<char*>(p) + 16;
}

void counted_free(void* q) noexcept {
  if (!q) return;
  auto* p = reinterpret_cast<std::size_t*>(static_cast<char*>(q) - 16);
  g_live.fetch_sub(static_cast<std::int64_t>(*p));
  std::free(p);
}

}  // namespace

// Every variant that pairs with the deletes below (std::stable_sort's buffer uses nothrow).
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

using namespace nereus;

int main(int argc, char** argv) {
  const auto [repeat, json] = bench::parse_args(argc, argv, "planner_bench");
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  nlohmann::json rows = nlohmann::json::array();
  if (!json) fmt::print("{:<10} {:>6} {:>8} {:>12} {:>12} {:>10} {:>10}  {}\n", "cluster", "gpus", "response", "decision ms",
                        "peak heap", "candidates", "frontier", "path");
  for (const char* cluster_name : {"paper-cluster-3-h200", "paper-cluster-1-mi250x"}) {
    const ClusterSpec cluster = load_cluster(cluster_name);
    const CostModel model(cluster);
    for (int gpus : {8, 16, 32, 64, 128, 256, 512, 1024}) {
      if (gpus > cluster.gpus()) continue;
      for (double len : {1024.0, 4096.0}) {
        const Workload w = Workload::of(job, len, len * 1.2);
        PlanChoice c;
        const double ms = bench::median_ms(repeat, [&] { c = plan_job(model, job, gpus, w); });
        const std::int64_t before = g_live.load();
        g_peak.store(before);
        { const PlanChoice once = plan_job(model, job, gpus, w); }
        const std::int64_t peak = g_peak.load() - before;
        const std::string short_name = std::string(cluster_name).substr(6, 9);
        const char* path = !c.feasible ? "infeasible" : c.fast_path ? "fast" : "pareto-dp";
        rows.push_back({{"cluster", cluster_name},
                        {"gpus", gpus},
                        {"response_len", len},
                        {"decision_ms_median", ms},
                        {"peak_heap_bytes", peak},
                        {"candidates", c.candidates},
                        {"frontier", c.frontier},
                        {"path", path}});
        if (!json)
          fmt::print("{:<10} {:>6} {:>8.0f} {:>12.3f} {:>10.1f} KB {:>10} {:>10}  {}\n", short_name, gpus, len, ms,
                     static_cast<double>(peak) / 1e3, c.candidates, c.frontier, path);
      }
    }
  }
  if (json) fmt::print("{}\n", nlohmann::json{{"bench", "planner"}, {"repeat", repeat}, {"rows", rows}}.dump());
  return 0;
}
