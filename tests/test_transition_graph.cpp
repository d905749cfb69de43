// Property tests of the global transition graph on random job plans, against independent
// brute force: every new unit built once from eligible sources, moved bytes equal the
// per-destination lower bound and the build's own transfer plan, old units freed only
// after their readers, every model-stage complete at every point, and — for every
// execution order the edges allow (all of them on small graphs, random ones on larger) —
// no GPU over its budget. Infeasibility is checked against an exhaustive search.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "job_cases.hpp"
#include "nereus/plan/overlap.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {

/// Bytes of position (s, r) of a unit, from the independent reading of sharding.md.
std::uint64_t ref_position_bytes(const ModelConfig& c, const Layout& l, int s, int r, bool train) {
  const ref::Layout rl{l.tp, l.pp, l.partition, false, l.ep, l.etp};
  std::uint64_t n = 0;
  for (const ref::Tensor& t : ref::tensors(c))
    if (auto b = ref::shard(c, t, rl, s, r)) n += static_cast<std::uint64_t>(ref::volume(*b));
  return n * (width(c.dtype) + (train ? 12u : 0u));
}

/// Memory bookkeeping of one execution: per-GPU use from the independent footprints.
struct Replay {
  const TransitionGraph& g;
  std::map<DeviceId, std::uint64_t> base;
  std::map<std::pair<std::size_t, DeviceId>, std::uint64_t> delta;  // (node, gpu) → bytes

  Replay(const TransitionGraph& graph, const MemoryModel& mem) : g(graph) {
    std::map<DeviceId, std::uint64_t> ws;
    for (std::size_t i = 0; i < g.stages.size(); ++i)
      for (const Collection* c : {&g.from[i], &g.to[i]})
        for (DeviceId d : c->devices()) ws[d] = std::max(ws[d], mem.workspace_of(g.stages[i]));
    for (std::size_t i = 0; i < g.stages.size(); ++i)
      for (const Emu& e : g.from[i].units) add(base, i, e, g.from[i].train, 0);
    for (auto& [d, w] : ws) base[d] += w;
    for (std::size_t x = 0; x < g.nodes.size(); ++x) {
      std::map<DeviceId, std::uint64_t> m;
      add(m, g.nodes[x].unit.stage, g.emu(g.nodes[x].unit), g.collection(g.nodes[x].unit).train,
          g.nodes[x].is_build() ? mem.staging : 0);
      for (auto [d, b] : m) delta[{x, d}] = b;
    }
  }
  void add(std::map<DeviceId, std::uint64_t>& m, std::size_t stage, const Emu& e, bool train, std::uint64_t extra) const {
    const ModelConfig& c = g.from[stage].model->config();
    for (int s = 0; s < e.layout.pp; ++s)
      for (int r = 0; r < e.layout.tp * e.layout.ep; ++r)
        m[e.gpus[ref::device_index({e.layout.tp, e.layout.pp, {}, false, e.layout.ep}, s, r)]] +=
            ref_position_bytes(c, e.layout, s, r, train) + extra;
  }
  /// Per-GPU use once the nodes in `done` have run.
  std::map<DeviceId, std::uint64_t> use(const std::vector<bool>& done) const {
    std::map<DeviceId, std::uint64_t> m = base;
    for (const auto& [k, b] : delta)
      if (done[k.first]) m[k.second] = g.nodes[k.first].is_build() ? m[k.second] + b : m[k.second] - b;
    return m;
  }
};

/// The invariants every point of every execution keeps: memory within the budget, every
/// model-stage with a complete collection (an old unit left, or all its new ones built),
/// and every role's state held by some live unit.
void check_point(const TransitionGraph& g, const Replay& replay, const std::vector<bool>& done, std::uint64_t budget,
                 bool limited, const std::string& where) {
  if (limited)
    for (const auto& [d, b] : replay.use(done))
      if (b > budget) FAIL(where << ": GPU " << d << " uses " << b << " B, budget " << budget);
  for (std::size_t i = 0; i < g.stages.size(); ++i) {
    bool all_built = true, old_left = false, some_built = false;
    for (std::size_t x = 0; x < g.nodes.size(); ++x) {
      const GraphNode& n = g.nodes[x];
      if (n.unit.stage != i) continue;
      if (n.is_build() && !done[x]) all_built = false;
      if (n.is_build() && done[x]) some_built = true;
    }
    for (std::uint32_t j = 0; j < g.from[i].units.size(); ++j) {
      bool destroyed = false;
      for (std::size_t x = 0; x < g.nodes.size(); ++x)
        if (done[x] && !g.nodes[x].is_build() && g.nodes[x].unit == UnitRef{static_cast<std::uint16_t>(i), false, j})
          destroyed = true;
      old_left = old_left || !destroyed;
    }
    // A memory-first graph may leave a stage on some of its new units instead.
    const bool complete = all_built || old_left || (g.summary.memory_first && some_built);
    if (!complete) FAIL(where << ": model-stage " << g.stages[i] << " has no complete collection");
  }
}

/// Nodes a node waits for, without the resource edges (the structure the scheduler starts from).
bool ready_structural(const GraphNode& n, const std::vector<bool>& done) {
  return std::all_of(n.after.begin(), n.after.end(),
                     [&](const Edge& e) { return e.kind == EdgeKind::resource || done[e.node]; });
}

/// Exhaustive search: is there any order of the nodes, respecting data and commit edges,
/// in which no GPU goes over the budget?
bool brute_force_feasible(const TransitionGraph& g, const Replay& replay, std::uint64_t budget) {
  const std::size_t n = g.nodes.size();
  std::vector<char> seen(std::size_t{1} << n, 0);
  std::vector<std::uint32_t> stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    const std::uint32_t mask = stack.back();
    stack.pop_back();
    if (mask == (1u << n) - 1) return true;
    std::vector<bool> done(n);
    for (std::size_t x = 0; x < n; ++x) done[x] = mask >> x & 1;
    const auto use = replay.use(done);
    for (std::size_t x = 0; x < n; ++x) {
      if (done[x] || !ready_structural(g.nodes[x], done)) continue;
      bool fits = true;
      if (g.nodes[x].is_build())
        for (const auto& [k, b] : replay.delta)
          if (k.first == x && use.at(k.second) + b > budget) fits = false;
      const std::uint32_t next = mask | (1u << x);
      if (fits && !seen[next]) {
        seen[next] = 1;
        stack.push_back(next);
      }
    }
  }
  return false;
}

bool same_graph(const TransitionGraph& a, const TransitionGraph& b) {
  if (a.nodes.size() != b.nodes.size() || a.summary.moved_bytes != b.summary.moved_bytes ||
      a.feasibility.ok != b.feasibility.ok)
    return false;
  for (std::size_t x = 0; x < a.nodes.size(); ++x) {
    const GraphNode &p = a.nodes[x], &q = b.nodes[x];
    if (p.kind != q.kind || !(p.unit == q.unit) || p.sources != q.sources || p.after.size() != q.after.size()) return false;
    for (std::size_t k = 0; k < p.after.size(); ++k)
      if (p.after[k].node != q.after[k].node || p.after[k].kind != q.after[k].kind) return false;
  }
  return true;
}

}  // namespace

/// `want` random plan changes of `job`, each checked against brute force; at least
/// `min_feasible` of them feasible, `min_infeasible` not, with `min_resource` resource edges.
void random_job_plans(const JobSpec& job, int want, int min_feasible, int min_infeasible, int min_resource) {
  const auto stages = model_stages(job);
  int cases = 0, feasible = 0, infeasible = 0, exhaustive = 0, resource_edges = 0, memory_first = 0;
  for (std::uint64_t seed = 1; cases < want; ++seed) {
    testcase::JobGenerator gen(seed);
    const int pool = gen.uniform(4, 8);
    const GlobalPlan from = gen.plan(job, pool);
    const GlobalPlan to = gen.plan(job, pool, &from, gen.uniform(0, 3) * 0.25);
    TransitionRequest req;
    req.job = &job;
    req.from = plan_collections(job, from);
    req.to = plan_collections(job, to);
    req.stale = gen.stale(job);
    req.links.gpus_per_node = gen.coin() ? 2 : 8;
    if (gen.coin(0.3)) req.memory.workspace = {{"actor/train", 200000}, {"actor/generate", 100000}};
    if (gen.coin(0.2)) req.memory.staging = 4096;
    // A budget between what the busier plan needs and 1.5 times that: often tight.
    const TransitionGraph open = compile_transition(req);
    std::uint64_t need = 0;
    for (const GpuMemory& m : open.memory) need = std::max({need, m.before, m.after});
    const bool limited = gen.coin(0.85);
    if (limited) req.memory.capacity = static_cast<std::uint64_t>(static_cast<double>(need) * (1.0 + gen.uniform(0, 50) / 100.0) / 0.9) + 1;
    const TransitionGraph g = compile_transition(req);
    ++cases;
    const std::string where = "seed " + std::to_string(seed);
    CAPTURE(where);
    CHECK(same_graph(g, compile_transition(req)));  // deterministic

    // Topological order, and exactly the right builds and destroys.
    std::set<std::pair<std::size_t, std::uint32_t>> built, destroyed;
    for (std::size_t x = 0; x < g.nodes.size(); ++x) {
      const GraphNode& n = g.nodes[x];
      for (const Edge& e : n.after) REQUIRE(e.node < x);
      auto& set = n.is_build() ? built : destroyed;
      CHECK(set.insert({n.unit.stage, n.unit.unit}).second);
      CHECK(n.unit.target == n.is_build());
      resource_edges += static_cast<int>(std::count_if(n.after.begin(), n.after.end(),
                                                       [](const Edge& e) { return e.kind == EdgeKind::resource; }));
    }
    for (std::size_t i = 0; i < stages.size(); ++i) {
      std::set<std::uint32_t> kept_old;
      for (std::uint32_t u = 0; u < g.to[i].units.size(); ++u) {
        const std::int32_t k = g.kept[i][u];
        if (k >= 0) {
          CHECK(g.from[i].units[static_cast<std::size_t>(k)].gpus == g.to[i].units[u].gpus);
          CHECK(g.from[i].units[static_cast<std::size_t>(k)].layout == g.to[i].units[u].layout);
          kept_old.insert(static_cast<std::uint32_t>(k));
          CHECK(!built.count({i, u}));
        } else {
          CHECK(built.count({i, u}));
        }
      }
      for (std::uint32_t j = 0; j < g.from[i].units.size(); ++j) CHECK(destroyed.count({i, j}) != kept_old.count(j));
    }

    // Every build reads only eligible units, moves exactly the lower bound, and its own
    // transfer plan agrees; every old unit it reads is freed only after it.
    for (std::size_t x = 0; x < g.nodes.size(); ++x) {
      const GraphNode& n = g.nodes[x];
      if (!n.is_build()) continue;
      const std::size_t i = n.unit.stage;
      std::vector<Collection> eligible;
      for (std::size_t k = 0; k < stages.size(); ++k) {
        const bool ok = stages[k].role == stages[i].role && !req.stale[k] && (!g.to[i].train || g.from[k].train);
        if (ok) eligible.push_back(g.from[k]);
        for (const UnitRef& s : n.sources)
          if (s.stage == k && !s.target) CHECK(ok);
      }
      const Collection target{g.to[i].model, g.to[i].model_stage, g.to[i].train, {g.to[i].units[n.unit.unit]}};
      const std::uint64_t lower = plan_reshard(eligible, target).summary().lower_bound_bytes;
      if (g.summary.memory_first) CHECK(n.moved_bytes >= lower);  // whole replicas from elsewhere
      else CHECK(lower == n.moved_bytes);
      const BuildPlan bp = plan_build(g, n, req.links);
      CHECK(bp.plan.summary().moved_bytes == n.moved_bytes);
      CHECK(bp.plan.summary().local_bytes == n.local_bytes);
      for (const UnitRef& s : n.sources)
        for (std::size_t y = 0; y < g.nodes.size(); ++y)
          if (!g.nodes[y].is_build() && g.nodes[y].unit == s) {
            const auto& a = g.nodes[y].after;
            CHECK(std::any_of(a.begin(), a.end(), [&](const Edge& e) { return e.node == x && e.kind == EdgeKind::data; }));
          }
    }

    const Replay replay(g, req.memory);
    const std::uint64_t budget = req.memory.budget();
    if (!g.feasibility.ok) {
      ++infeasible;
      CHECK(!g.feasibility.reason.empty());
      if (g.nodes.size() <= 18) {
        ++exhaustive;
        CHECK_MESSAGE(!brute_force_feasible(g, replay, budget), "an order exists but the graph was reported infeasible: "
                                                                   << g.feasibility.reason);
      }
      continue;
    }
    ++feasible;
    memory_first += g.summary.memory_first;
    // Every ideal of a small graph; random executions of a larger one.
    const std::size_t n = g.nodes.size();
    if (n <= 14) {
      for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
        std::vector<bool> done(n);
        bool closed = true;
        for (std::size_t x = 0; x < n; ++x) done[x] = mask >> x & 1;
        for (std::size_t x = 0; x < n && closed; ++x)
          if (done[x])
            for (const Edge& e : g.nodes[x].after) closed = closed && done[e.node];
        if (closed) check_point(g, replay, done, budget, limited, where);
      }
    } else {
      std::mt19937_64 rng(seed);
      for (int run = 0; run < 40; ++run) {
        std::vector<bool> done(n);
        for (std::size_t step = 0; step < n; ++step) {
          std::vector<std::size_t> ready;
          for (std::size_t x = 0; x < n; ++x)
            if (!done[x] && std::all_of(g.nodes[x].after.begin(), g.nodes[x].after.end(), [&](const Edge& e) { return done[e.node]; }))
              ready.push_back(x);
          REQUIRE(!ready.empty());
          done[ready[rng() % ready.size()]] = true;
          check_point(g, replay, done, budget, limited, where);
        }
      }
    }
    // The graph's own per-GPU worst case is a true bound.
    for (const GpuMemory& m : g.memory) {
      CHECK(m.before == replay.base.at(m.device));
      if (limited) CHECK(m.worst <= budget);
    }
  }
  MESSAGE("cases " << cases << ": " << feasible << " feasible, " << infeasible << " infeasible (" << exhaustive
                   << " checked exhaustively), " << resource_edges << " resource edges, " << memory_first
                   << " memory-first");
  CHECK(feasible > min_feasible);
  CHECK(infeasible > min_infeasible);
  CHECK(resource_edges > min_resource);
}

TEST_CASE("transition graph: random job plans against brute force") {
  random_job_plans(testcase::tiny_ppo_job(), 500, 40, 5, 20);
}

TEST_CASE("transition graph: random MoE job plans (ep, etp) against brute force") {
  random_job_plans(testcase::tiny_ppo_job(true), 150, 12, 2, 5);
}

TEST_CASE("transition graph: decisions, kinds and errors on worked examples") {
  const JobSpec job = load_job("ppo-tiny");
  auto compile = [&](const std::string& a, const std::string& b) {
    TransitionRequest req;
    req.job = &job;
    req.from = plan_collections(job, load_global_plan(job, a));
    req.to = plan_collections(job, load_global_plan(job, b));
    return compile_transition(req);
  };
  const std::string base = R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3", "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3", "reference/infer": "tp=2,pp=1,dp=1,devices=4-5",
    "reward/infer": "tp=2,pp=1,dp=1,devices=6-7", "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
    "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})";
  SUBCASE("an unchanged plan is all kept") {
    const TransitionGraph g = compile(base, base);
    CHECK(g.nodes.empty());
    CHECK(g.summary.moved_bytes == 0);
    for (const auto& d : g.decisions) CHECK(d.strategy == "unchanged");
  }
  SUBCASE("DP growth onto new GPUs is Extend; a bigger unit over old replicas is Merge; Split in place") {
    std::string to = base;
    to.replace(to.find("tp=2,pp=1,dp=2,devices=0-3"), 26, "tp=2,pp=1,dp=4,devices=0-7");  // generate: extend
    to.replace(to.find("\"actor/infer\": \"tp=2,pp=1,dp=1,devices=0-1\""), 43, "\"actor/infer\": \"tp=1,pp=1,dp=2,devices=0-1\"");
    const TransitionGraph g = compile(base, to);
    std::map<std::string, std::map<NodeKind, int>> kinds;
    for (const GraphNode& n : g.nodes) ++kinds[g.stages[n.unit.stage]][n.kind];
    CHECK(kinds["actor/generate"][NodeKind::extend] == 2);
    CHECK(kinds["actor/generate"][NodeKind::destroy] == 0);
    CHECK(kinds["actor/infer"][NodeKind::split] == 2);
    CHECK(g.decisions[0].strategy == "primitives");
    CHECK(g.decisions[0].kept == 2);
    // Extend copies whole replicas: a tp=2 unit of tiny-llama, param only (replicated
    // norms counted on both ranks).
    std::uint64_t extend_bytes = 0, unit_bytes = 0;
    for (const GraphNode& n : g.nodes)
      if (n.kind == NodeKind::extend) extend_bytes += n.moved_bytes;
    const Layout tp2{2, 1, {}, Packing::hf};
    for (int r = 0; r < 2; ++r) unit_bytes += ref_position_bytes(job.model("actor")->config(), tp2, 0, r, false);
    CHECK(extend_bytes == 2 * unit_bytes);
    const TransitionGraph back = compile(to, base);
    std::map<NodeKind, int> k2;
    for (const GraphNode& n : back.nodes)
      if (back.stages[n.unit.stage] == "actor/infer") ++k2[n.kind];
    CHECK(k2[NodeKind::merge] == 1);
    CHECK(k2[NodeKind::destroy] == 2);
  }
  SUBCASE("a layout change costs the common sub-layout path and records why") {
    std::string to = base;
    to.replace(to.find("\"actor/train\": \"tp=4,pp=1,dp=1,devices=0-3\""), 43, "\"actor/train\": \"tp=2,pp=2,dp=1,devices=0-3\"");
    const TransitionGraph g = compile(base, to);
    const StageDecision& d = g.decisions[5];
    CHECK(d.model_stage == "actor/train");
    CHECK(d.strategy == "direct");
    CHECK(d.common_layout == "tp=2,pp=1");
    CHECK(d.via_common_bytes > d.moved_bytes);
    CHECK(has(d.why, "the path through tp=2,pp=1 would move"));
  }
  SUBCASE("bad input") {
    CHECK(has(error_of([&] { compile(base, R"({"actor/generate": "tp=2"})"); }), "model-stage 'actor/infer' has no layout"));
    CHECK(has(error_of([&] { compile(base, R"({"critic/generate": "tp=2"})"); }), "'critic/generate' is not a model-stage"));
    std::string bad = base;
    bad.replace(bad.find("tp=2,pp=1,dp=2,devices=0-3"), 26, "tp=1,pp=1,dp=3,devices=0-2");
    CHECK(has(error_of([&] { compile(base, bad); }), "dp 3 does not divide the global batch of 64"));
  }
  SUBCASE("a swap of two training stages at a tight budget is infeasible, and says why") {
    std::string to = base;
    to.replace(to.find("\"actor/train\": \"tp=4,pp=1,dp=1,devices=0-3\""), 43, "\"actor/train\": \"tp=4,pp=1,dp=1,devices=4-7\"");
    to.replace(to.find("\"critic/train\": \"tp=4,pp=1,dp=1,devices=4-7\""), 44, "\"critic/train\": \"tp=4,pp=1,dp=1,devices=0-3\"");
    TransitionRequest req;
    req.job = &job;
    req.from = plan_collections(job, load_global_plan(job, base));
    req.to = plan_collections(job, load_global_plan(job, to));
    TransitionGraph open = compile_transition(req);
    std::uint64_t need = 0;
    for (const GpuMemory& m : open.memory) need = std::max({need, m.before, m.after});
    req.memory.capacity = need * 11 / 10 / 9 * 10;  // a budget just over what each plan needs
    const TransitionGraph g = compile_transition(req);
    CHECK_FALSE(g.feasibility.ok);
    CHECK(has(g.feasibility.reason, "cannot be built"));
    CHECK(has(g.feasibility.reason, "can only be destroyed after"));
  }
}

TEST_CASE("execution-overlap graph") {
  const JobSpec job = load_job("ppo-tiny");
  const GlobalPlan p = load_global_plan(job, R"({"actor/generate": "tp=2,pp=1,dp=4,devices=0-7",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=6-7",
    "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})");
  const OverlapGraph g = overlap_graph(job, p);
  const int ai = g.index("actor/infer"), ci = g.index("critic/infer"), ri = g.index("reference/infer");
  const int at = g.index("actor/train"), ct = g.index("critic/train"), gen = g.index("actor/generate");
  CHECK(g.concurrent(ai, ci));   // disjoint GPUs, same phase
  CHECK(!g.concurrent(ai, ri));  // share GPUs 0-1: serialize
  CHECK(g.concurrent(at, ct));
  CHECK(!g.concurrent(gen, at));  // phases
  std::vector<double> secs(g.stages.size(), 1.0);
  CHECK(g.step_seconds(secs) == doctest::Approx(4.0));  // generate, actor+reference infer in series, train
}
