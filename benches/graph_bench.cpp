// Planning time of the global transition graph: the 4-model PPO job (llama-3.1-8b actor,
// critic, reference, reward; 7 model-stages) growing from 512 to 1,024 GPUs with new
// layouts for every model-stage, and a 32-GPU case. Prints medians of repeated runs.
//   graph_bench [--repeat N] [--smoke] [--json]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "bench_args.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/plan/transition_graph.hpp"

using namespace nereus;

namespace {

/// A colocated PPO plan on n GPUs: generation on all, four inference stages on a quarter
/// each, the two training stages on a half each.
GlobalPlan ppo_plan(int n, int gen_tp, int infer_tp, int train_tp, int train_pp) {
  auto spec = [](int tp, int pp, int lo, int count) {
    return parse_collection_spec(fmt::format("tp={},pp={},dp={},devices={}-{}", tp, pp, count / (tp * pp), lo, lo + count - 1));
  };
  const int q = n / 4, h = n / 2;
  return {{{"actor/generate", spec(gen_tp, 1, 0, n)},
           {"actor/infer", spec(infer_tp, 1, 0, q)},
           {"critic/infer", spec(infer_tp, 1, q, q)},
           {"reference/infer", spec(infer_tp, 1, 2 * q, q)},
           {"reward/infer", spec(infer_tp, 1, 3 * q, q)},
           {"actor/train", spec(train_tp, train_pp, 0, h)},
           {"critic/train", spec(train_tp, train_pp, h, h)}}};
}

struct Result {
  double median_ms;
  TransitionSummary summary;
  bool feasible;
};

Result measure(const JobSpec& job, const GlobalPlan& from, const GlobalPlan& to, int repeat,
               std::uint64_t capacity = 141ull << 30) {
  TransitionRequest req;
  req.job = &job;
  req.from = plan_collections(job, from);
  req.to = plan_collections(job, to);
  req.links = LinkModel::of(load_cluster("h200-node"));
  req.memory.capacity = capacity;
  Result r{};
  r.median_ms = bench::median_ms(repeat, [&] {
    const TransitionGraph g = compile_transition(req);
    r.summary = g.summary;
    r.feasible = g.feasibility.ok;
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const auto [repeat, json] = bench::parse_args(argc, argv, "graph_bench");
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const Result big = measure(job, ppo_plan(512, 4, 4, 8, 1), ppo_plan(1024, 2, 2, 4, 2), repeat);
  const Result small = measure(job, ppo_plan(16, 4, 4, 8, 1), ppo_plan(32, 2, 2, 4, 2), repeat);
  // Tight memory: 50 GiB per GPU needs release-before-acquire edges; at 40 GiB no order
  // of the lower-bound graph fits (the bounded search gives up) and the memory-first graph
  // is built instead.
  const Result tight = measure(job, ppo_plan(512, 4, 4, 8, 1), ppo_plan(1024, 2, 2, 4, 2), repeat, 50ull << 30);
  const Result none = measure(job, ppo_plan(512, 4, 4, 8, 1), ppo_plan(1024, 2, 2, 4, 2), std::max(1, repeat / 4),
                              40ull << 30);
  if (json) {
    fmt::print("{{\"repeat\":{},\"gpus_1024_ms\":{:.3f},\"gpus_1024_nodes\":{},\"gpus_1024_moved_bytes\":{},"
               "\"gpus_1024_feasible\":{},\"gpus_32_ms\":{:.3f},\"gpus_1024_tight_ms\":{:.3f},"
               "\"gpus_1024_tight_resource_edges\":{},\"gpus_1024_memory_first_ms\":{:.3f},\"gpus_1024_memory_first_moved_bytes\":{}}}\n",
               repeat, big.median_ms, big.summary.builds + big.summary.destroys, big.summary.moved_bytes, big.feasible,
               small.median_ms, tight.median_ms, tight.summary.resource_edges, none.median_ms, none.summary.moved_bytes);
  } else {
    fmt::print("PPO llama-3.1-8b x4, 7 model-stages, new layouts everywhere; median of {}\n", repeat);
    fmt::print("  512 -> 1,024 GPUs   {:8.3f} ms   {} nodes, {:.1f} TB moved, L_tran {:.2f} s\n", big.median_ms,
               big.summary.builds + big.summary.destroys, big.summary.moved_bytes / 1e12, big.summary.l_tran_seconds);
    fmt::print("  16 -> 32 GPUs       {:8.3f} ms   {} nodes\n", small.median_ms, small.summary.builds + small.summary.destroys);
    fmt::print("  1,024, 50 GiB/GPU   {:8.3f} ms   {} resource edges\n", tight.median_ms, tight.summary.resource_edges);
    fmt::print("  1,024, 40 GiB/GPU   {:8.3f} ms   memory-first: {:.1f} TB moved\n", none.median_ms,
               none.summary.moved_bytes / 1e12);
  }
  return big.feasible && small.feasible && tight.feasible && none.feasible && none.summary.memory_first ? 0 : 1;
}
