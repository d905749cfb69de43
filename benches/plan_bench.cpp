// Reshard planning time for one model-stage's collection at 1,024 GPUs (one collection,
// not a whole job's graph: graph_bench times that), training slots:
//   dense: llama-3.3-70b, tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64;
//   MoE:   qwen3-235b-a22b, tp=4,pp=8,ep=8,etp=1,dp=4 -> tp=8,pp=4,ep=4,etp=1,dp=8
//          (32 expert groups a stage -> 32; 36,096 expert tensors).
// Prints medians of repeated runs.
//   plan_bench [--repeat N] [--smoke] [--json]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

#include "bench_args.hpp"
#include "nereus/plan/placement.hpp"
#include "nereus/plan/reshard.hpp"

using namespace nereus;

namespace {

struct Row {
  const char* key;    ///< JSON prefix
  const char* model;
  const char* from;
  const char* to;
  double summary_ms = 0, node_ms = 0, all_ms = 0, placement_ms = 0;
  std::size_t node_transfers = 0, all_transfers = 0;
  std::uint64_t moved = 0, placed_moved = 0;
};

void measure(Row& r, int repeat, bool smoke) {
  const auto model = load_model(r.model);
  const auto src = Collection::from_spec(model, "actor/train", parse_collection_spec(r.from), true);
  const auto dst = Collection::from_spec(model, "actor/train", parse_collection_spec(r.to), true);
  std::vector<DeviceId> node0(8);
  std::iota(node0.begin(), node0.end(), 0);
  r.summary_ms = bench::median_ms(repeat, [&] { r.moved = plan_reshard(src, dst).summary().moved_bytes; });
  r.node_ms = bench::median_ms(repeat, [&] { r.node_transfers = plan_reshard(src, dst).transfers_touching(node0).size(); });
  // Every transfer of a 235B MoE model is millions of records: skipped in the smoke run.
  if (!smoke || std::strcmp(r.key, "moe") != 0)
    r.all_ms = bench::median_ms(std::max(1, repeat / 4), [&] { r.all_transfers = plan_reshard(src, dst).transfers().size(); });
  Collection placed;
  r.placement_ms = bench::median_ms(std::max(1, repeat / 4), [&] {
    placed = optimize_placement(std::span<const Collection>(&src, 1), dst, 8);
  });
  r.placed_moved = plan_reshard(src, placed).summary().moved_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const auto [repeat, json] = bench::parse_args(argc, argv, "plan_bench");
  bool smoke = false;
  for (int i = 1; i < argc; ++i) smoke = smoke || std::strcmp(argv[i], "--smoke") == 0;
  Row rows[] = {{"dense", "llama-3.3-70b", "tp=8,pp=2,dp=64", "tp=4,pp=4,dp=64"},
                {"moe", "qwen3-235b-a22b", "tp=4,pp=8,ep=8,etp=1,dp=4", "tp=8,pp=4,ep=4,etp=1,dp=8"}};
  for (Row& r : rows) measure(r, repeat, smoke);

  if (json) {
    std::string out = fmt::format("{{\"repeat\":{}", repeat);
    for (const Row& r : rows) {
      const std::string p = std::strcmp(r.key, "dense") == 0 ? "" : std::string(r.key) + "_";
      out += fmt::format(",\"{0}collection_summary_ms\":{1:.3f},\"{0}node_transfers_ms\":{2:.3f},\"{0}node_transfers\":{3},"
                         "\"{0}all_transfers_ms\":{4:.3f},\"{0}all_transfers\":{5},\"{0}placement_ms\":{6:.3f},"
                         "\"{0}moved_bytes\":{7},\"{0}placed_moved_bytes\":{8}",
                         p, r.summary_ms, r.node_ms, r.node_transfers, r.all_ms, r.all_transfers, r.placement_ms, r.moved,
                         r.placed_moved);
    }
    fmt::print("{}}}\n", out);
    return 0;
  }
  for (const Row& r : rows) {
    fmt::print("{}, training slots, {} -> {} (1,024 GPUs), median of {}\n", r.model, r.from, r.to, repeat);
    fmt::print("  one collection's plan (summary)   {:8.3f} ms   moved {:.1f} GB\n", r.summary_ms, r.moved / 1e9);
    fmt::print("  plan + node 0 transfer list       {:8.3f} ms   {} transfers\n", r.node_ms, r.node_transfers);
    if (r.all_transfers > 0)
      fmt::print("  plan + every transfer of the model {:7.3f} ms   {} transfers\n", r.all_ms, r.all_transfers);
    fmt::print("  optimise placement                {:8.3f} ms   moved {:.1f} GB after\n", r.placement_ms, r.placed_moved / 1e9);
  }
  return 0;
}
