// Reshard planning time for one model-stage's collection at 1,024 GPUs: llama-3.3-70b
// with training slots, tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64 (one collection, not a whole
// job's graph: graph_bench times that). Prints medians of repeated runs.
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


int main(int argc, char** argv) {
  const auto [repeat, json] = bench::parse_args(argc, argv, "plan_bench");
  const auto model = load_model("llama-3.3-70b");
  const auto src = Collection::from_spec(model, "actor/train", parse_collection_spec("tp=8,pp=2,dp=64"), true);
  const auto dst = Collection::from_spec(model, "actor/train", parse_collection_spec("tp=4,pp=4,dp=64"), true);
  std::vector<DeviceId> node0(8);
  std::iota(node0.begin(), node0.end(), 0);

  std::uint64_t moved = 0;
  std::size_t node_transfers = 0;
  const double summary_ms = bench::median_ms(repeat, [&] { moved = plan_reshard(src, dst).summary().moved_bytes; });
  const double node_ms = bench::median_ms(repeat, [&] { node_transfers = plan_reshard(src, dst).transfers_touching(node0).size(); });
  std::size_t all_transfers = 0;
  const double all_ms = bench::median_ms(std::max(1, repeat / 4), [&] { all_transfers = plan_reshard(src, dst).transfers().size(); });
  Collection placed;
  const double placement_ms = bench::median_ms(std::max(1, repeat / 4), [&] {
    placed = optimize_placement(std::span<const Collection>(&src, 1), dst, 8);
  });
  const std::uint64_t placed_moved = plan_reshard(src, placed).summary().moved_bytes;

  if (json) {
    fmt::print("{{\"repeat\":{},\"collection_summary_ms\":{:.3f},\"node_transfers_ms\":{:.3f},\"node_transfers\":{},"
               "\"all_transfers_ms\":{:.3f},\"all_transfers\":{},"
               "\"placement_ms\":{:.3f},\"moved_bytes\":{},\"placed_moved_bytes\":{}}}\n",
               repeat, summary_ms, node_ms, node_transfers, all_ms, all_transfers, placement_ms, moved, placed_moved);
  } else {
    fmt::print("llama-3.3-70b, training slots, tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64 (1,024 GPUs), median of {}\n", repeat);
    fmt::print("  one collection's plan (summary)   {:8.3f} ms   moved {:.1f} GB\n", summary_ms, moved / 1e9);
    fmt::print("  plan + node 0 transfer list       {:8.3f} ms   {} transfers\n", node_ms, node_transfers);
    fmt::print("  plan + every transfer of the model {:7.3f} ms   {} transfers\n", all_ms, all_transfers);
    fmt::print("  optimise placement                {:8.3f} ms   moved {:.1f} GB after\n", placement_ms, placed_moved / 1e9);
  }
  return 0;
}
