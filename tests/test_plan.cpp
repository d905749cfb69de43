// Reshard planner: the worked examples of the issue, source choice, placement, errors.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "../src/plan/assignment.hpp"
#include "nereus/base/error.hpp"
#include "nereus/plan/placement.hpp"
#include "nereus/plan/reshard.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {

Collection coll(const std::string& model, const std::string& spec, bool train = false, const std::string& stage = "s") {
  return Collection::from_spec(load_model(model), stage, parse_collection_spec(spec), train);
}

double gb(std::uint64_t b) { return static_cast<double>(b) / 1e9; }


}  // namespace

TEST_CASE("worked examples: llama-3.1-8b on 8 GPUs, params only") {
  const auto tp8 = coll("llama-3.1-8b", "tp=8,pp=1,dp=1");
  const auto tp2dp4 = coll("llama-3.1-8b", "tp=2,pp=1,dp=4");
  SUBCASE("tp=8 -> tp=2,dp=4") {
    CHECK(gb(plan_reshard(tp8, tp2dp4).summary().moved_bytes) == doctest::Approx(56.21).epsilon(0.0002));
    const auto best = optimize_placement(std::span<const Collection>(&tp8, 1), tp2dp4, 8);
    CHECK(gb(plan_reshard(tp8, best).summary().moved_bytes) == doctest::Approx(48.18).epsilon(0.0002));
  }
  SUBCASE("tp=2,dp=4 -> tp=8") {
    CHECK(gb(plan_reshard(tp2dp4, tp8).summary().moved_bytes) == doctest::Approx(8.03).epsilon(0.0005));
    const auto best = optimize_placement(std::span<const Collection>(&tp2dp4, 1), tp8, 8);
    CHECK(plan_reshard(tp2dp4, best).summary().moved_bytes == 0);
    // The example order is optimal too.
    CHECK(plan_reshard(tp2dp4, coll("llama-3.1-8b", "tp=8,pp=1,dp=1,devices=0:2:4:6:1:3:5:7")).summary().moved_bytes == 0);
  }
}

TEST_CASE("a plan with nothing to change moves nothing and keeps every buffer") {
  const auto a = coll("qwen2.5-0.5b", "tp=2,pp=2,dp=2", true);
  const auto s = plan_reshard(a, a).summary();
  CHECK(s.moved_bytes == 0);
  CHECK(s.kept_bytes == s.target_bytes);
  CHECK(s.local_copy_count == 0);
}

TEST_CASE("extend spreads the send load over the existing replicas") {
  const auto src = coll("llama-3.2-1b", "tp=2,pp=1,dp=2");
  const auto dst = coll("llama-3.2-1b", "tp=2,pp=1,dp=4");
  const auto plan = plan_reshard(src, dst);
  const auto& s = plan.summary();
  // Two new replicas, each a full copy: moved = 2 copies; each of the 4 senders carries ~half a copy.
  CHECK(s.moved_bytes == 2 * s.target_bytes / 4);
  CHECK(static_cast<double>(s.max_device_send_bytes) <= 1.05 * static_cast<double>(s.moved_bytes) / 4);
}

TEST_CASE("a sender on the destination's node is preferred") {
  // Source replicas on node 0 (0-1) and node 1 (8-9); a new replica on node 1 (10-11).
  const auto src = coll("tiny-llama", "tp=2,pp=1,dp=2,devices=0:1:8:9");
  const auto dst = coll("tiny-llama", "tp=2,pp=1,dp=3,devices=0:1:8:9:10:11");
  const auto plan = plan_reshard(src, dst);
  CHECK(plan.summary().inter_node_bytes == 0);
  for (const auto& t : plan.transfers())
    if (!t.local()) CHECK((t.src == 8 || t.src == 9));
}

TEST_CASE("weight sync moves params only, and only what is not already there") {
  const auto train = coll("qwen2.5-0.5b", "tp=2,pp=1,dp=2", true, "actor/train");
  const auto gen = coll("qwen2.5-0.5b", "tp=1,pp=1,dp=4", false, "actor/generate");
  const auto plan = plan_reshard(train, gen);
  for (const auto& t : plan.transfers()) CHECK(t.slot == Slot::param);
  const auto params = static_cast<std::uint64_t>(load_model("qwen2.5-0.5b")->parameters()) * 2;
  CHECK(plan.summary().target_bytes == 4 * params);
  // Each generation GPU already holds half of its tensor-split params.
  CHECK(plan.summary().moved_bytes < 4 * params);
  CHECK(plan.summary().moved_bytes > 4 * params / 2 - params / 10);
}

TEST_CASE("two source model-stages: optimizer slots come only from the training one") {
  const auto m = load_model("tiny-llama");
  const std::vector<Collection> sources{
      Collection::from_spec(m, "actor/generate", parse_collection_spec("tp=1,pp=1,dp=2,devices=4:5"), false),
      Collection::from_spec(m, "actor/train", parse_collection_spec("tp=2,pp=1,dp=1,devices=0:1"), true)};
  const auto dst = Collection::from_spec(m, "actor/train", parse_collection_spec("tp=1,pp=1,dp=2,devices=4:5"), true);
  const auto plan = plan_reshard(sources, dst);
  for (const auto& t : plan.transfers()) {
    if (t.slot != Slot::param) CHECK(t.source == 1);
    else CHECK(t.local());  // params are already on 4 and 5
  }
}

TEST_CASE("bad inputs are refused with the reason") {
  const auto a = coll("tiny-llama", "tp=2,pp=1,dp=1");
  const auto b = coll("tiny-qwen2-tied", "tp=2,pp=1,dp=1");
  CHECK(error_of([&] { plan_reshard(a, b); }).find("different models") != std::string::npos);
  const auto t = coll("tiny-llama", "tp=2,pp=1,dp=1", true);
  CHECK(error_of([&] { plan_reshard(a, t); }).find("no source model-stage holds them") != std::string::npos);
}

TEST_CASE("a node's transfers are exactly the global transfers touching it") {
  const auto src = coll("qwen2.5-0.5b", "tp=2,pp=2,dp=4", true);
  const auto dst = coll("qwen2.5-0.5b", "tp=1,pp=2,dp=8", true);
  ReshardOptions opt;
  opt.links.gpus_per_node = 4;
  const auto plan = plan_reshard(src, dst, opt);
  const auto all = plan.transfers();
  const std::vector<DeviceId> node1{4, 5, 6, 7};
  const auto mine = plan.transfers_touching(node1);
  std::size_t expect = 0;
  for (const auto& t : all)
    if ((t.src >= 4 && t.src < 8) || (t.dst >= 4 && t.dst < 8)) ++expect;
  CHECK(mine.size() == expect);
  CHECK(!mine.empty());
}

TEST_CASE("placement keeps TP groups on their node and is deterministic") {
  const auto src = coll("llama-3.1-8b", "tp=8,pp=2,dp=2");
  const auto dst = coll("llama-3.1-8b", "tp=4,pp=2,dp=4");
  const auto a = optimize_placement(std::span<const Collection>(&src, 1), dst, 8);
  const auto b = optimize_placement(std::span<const Collection>(&src, 1), dst, 8);
  CHECK(a.devices() == b.devices());
  for (const auto& u : a.units)
    for (int s = 0; s < u.layout.pp; ++s)
      for (int r = 1; r < u.layout.tp; ++r) CHECK(u.device(s, r) / 8 == u.device(s, 0) / 8);
  CHECK(plan_reshard(src, a).summary().moved_bytes <= plan_reshard(src, dst).summary().moved_bytes);
}

TEST_CASE("assignment is optimal against brute force over permutations") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<std::vector<std::int64_t>> w(n, std::vector<std::int64_t>(n));
    for (auto& row : w)
      for (auto& x : row) x = static_cast<std::int64_t>(rng() % 20) - (trial % 3 == 0 ? 5 : 0);
    const auto cols = max_weight_assignment(w);
    std::int64_t got = 0;
    std::vector<int> seen(n, 0);
    for (int i = 0; i < n; ++i) {
      got += w[i][cols[i]];
      ++seen[cols[i]];
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::int64_t best = INT64_MIN;
    do {
      std::int64_t v = 0;
      for (int i = 0; i < n; ++i) v += w[i][perm[i]];
      best = std::max(best, v);
    } while (std::next_permutation(perm.begin(), perm.end()));
    CHECK(got == best);
  }
}

TEST_CASE("1,024 GPUs: llama-3.3-70b tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64 with training slots") {
  const auto src = coll("llama-3.3-70b", "tp=8,pp=2,dp=64", true);
  const auto dst = coll("llama-3.3-70b", "tp=4,pp=4,dp=64", true);
  const auto plan = plan_reshard(src, dst);
  const auto& s = plan.summary();
  // A replica holds every tensor once, and each TP rank its own copy of the norms.
  std::uint64_t replica = 0;
  for (const auto& t : src.model->tensors())
    replica += static_cast<std::uint64_t>(t.elements()) * (t.rank == 1 ? 4 : 1) * (2 + 12);
  CHECK(s.target_bytes == 64 * replica);
  CHECK(s.moved_bytes == s.lower_bound_bytes);
  CHECK(s.inter_node_bytes == 0);  // stages stay on their nodes in device order
  std::vector<DeviceId> node0(8);
  std::iota(node0.begin(), node0.end(), 0);
  const auto mine = plan.transfers_touching(node0);
  std::uint64_t in = 0;
  for (const auto& t : mine)
    if (t.dst < 8 && !t.local()) in += t.bytes;
  std::uint64_t want = 0;
  for (const auto& d : plan.traffic())
    if (d.device < 8) want += d.recv_bytes;
  CHECK(in == want);
}
