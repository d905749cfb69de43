// The memory schedule of a transition graph: a static order in which every GPU stays
// within its budget, the release-before-acquire edges that make every execution order
// the edges allow stay within it too, and the critical-path cost.
//
// Why the edges suffice: let a* be the latest acquisition (in the static order) of GPU d
// that has happened at some moment of a run. Everything acquired on d by then precedes a*
// in the static order, and every release chosen for a* is its ancestor, so has happened.
// Memory is then at most before(d) + (acquisitions up to a*) − (releases chosen for a*),
// which is the `worst` figure checked against the budget here.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <unordered_set>
#include <tuple>

#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/fill.hpp"
#include "transition_compiler.hpp"

namespace nereus::detail {

namespace {

/// Depth-first search for an order in which every build fits: after each build, every
/// release that became possible is applied (releasing never hurts), so a state is the set
/// of nodes done. States known not to finish are remembered by a hash of that set. Gives
/// up (returns empty, with `exhausted` false) after `limit` expansions.
template <class Fits, class Apply>
std::vector<std::uint32_t> search_order_impl(std::size_t nodes, const std::vector<bool>& is_build,
                                             std::vector<std::uint32_t> left, const std::vector<std::uint32_t>& first,
                                             const std::vector<std::uint32_t>& succ, std::vector<std::uint64_t> mem,
                                             Fits&& fits, Apply&& apply, std::size_t limit, bool& exhausted) {
  std::vector<char> done(nodes, 0);
  std::vector<std::uint32_t> order;
  std::unordered_set<std::uint64_t> dead;
  std::uint64_t hash = 0;
  std::size_t expansions = 0;
  auto mark = [](std::uint32_t x) { return splitmix64(x + 1); };
  auto run = [&](std::uint32_t x) {
    apply(x, mem, +1);
    done[x] = 1;
    hash ^= mark(x);
    order.push_back(x);
    for (std::uint32_t k = first[x]; k < first[x + 1]; ++k) --left[succ[k]];
  };
  auto undo = [&](std::uint32_t x) {
    for (std::uint32_t k = first[x]; k < first[x + 1]; ++k) ++left[succ[k]];
    order.pop_back();
    hash ^= mark(x);
    done[x] = 0;
    apply(x, mem, -1);
  };
  std::function<bool()> dfs = [&]() -> bool {
    if (++expansions > limit) return false;  // every call costs a scan: count them all
    const std::size_t mark_order = order.size();
    for (bool more = true; more;) {  // every release that is ready
      more = false;
      for (std::uint32_t x = 0; x < nodes; ++x)
        if (!done[x] && !is_build[x] && left[x] == 0) run(x), more = true;
    }
    if (order.size() == nodes) return true;
    bool found = false;
    if (!dead.count(hash)) {
      for (std::uint32_t x = 0; x < nodes && !found; ++x) {
        if (done[x] || !is_build[x] || left[x] != 0 || !fits(x, mem)) continue;
        run(x);
        found = dfs();
        if (!found) undo(x);
      }
      if (!found && expansions <= limit) dead.insert(hash);  // only states searched to the end
    }
    if (!found)
      while (order.size() > mark_order) undo(order.back());
    return found;
  };
  const bool found = dfs();
  exhausted = expansions <= limit;
  if (found) return order;
  return {};
}

}  // namespace


template <class Fits, class Apply>
std::vector<std::uint32_t> TransitionCompiler::search_order(std::size_t nodes, const std::vector<std::uint32_t>& indeg,
                                                            const std::vector<std::uint32_t>& first,
                                                            const std::vector<std::uint32_t>& succ,
                                                            const std::vector<std::uint64_t>& before, Fits&& fits,
                                                            Apply&& apply) {
  std::vector<bool> is_build(nodes);
  for (std::size_t x = 0; x < nodes; ++x) is_build[x] = g_.nodes[x].is_build();
  // Each expansion scans the nodes: about 2·10^6 node visits at most (tens of
  // milliseconds), which is exhaustive for small graphs.
  const std::size_t limit = std::max<std::size_t>(2000, 2000000 / std::max<std::size_t>(1, nodes));
  return search_order_impl(nodes, is_build, indeg, first, succ, before, fits, apply, limit, search_exhausted_);
}

void TransitionCompiler::schedule() {
  const std::size_t nodes = g_.nodes.size();
  const std::size_t devs = static_cast<std::size_t>(max_device_) + 1;
  const std::uint64_t budget = req_.memory.budget();
  g_.feasibility.budget = budget;

  const TouchTable& touch = touch_;
  // Before and after: units and the largest workspace of a stage placed on the GPU.
  std::vector<std::uint64_t> before(devs, 0), after(devs, 0), workspace(devs, 0);
  std::vector<bool> used(devs, false);
  for (std::size_t i = 0; i < n_; ++i) {
    const std::uint64_t w = req_.memory.workspace_of(g_.stages[i]);
    for (int side = 0; side < 2; ++side) {
      const Collection& c = side ? g_.to[i] : g_.from[i];
      for (const Emu& e : c.units) {
        const auto& fp = footprint(i, e.layout);
        for (std::size_t k = 0; k < e.gpus.size(); ++k) {
          const auto d = static_cast<std::size_t>(e.gpus[k]);
          (side ? after : before)[d] += fp[k];
          workspace[d] = std::max(workspace[d], w);
          used[d] = true;
        }
      }
    }
  }
  for (std::size_t d = 0; d < devs; ++d) {
    before[d] += workspace[d];
    after[d] += workspace[d];
  }
  auto fail = [&](std::string why) {
    if (g_.feasibility.ok) {
      g_.feasibility.ok = false;
      g_.feasibility.reason = std::move(why);
    }
  };
  for (std::size_t d = 0; d < devs; ++d) {
    if (!used[d]) continue;
    if (after[d] > budget)
      fail("the new plan needs " + human_bytes(after[d]) + " on GPU " + std::to_string(d) + " (units and workspace), over its budget of " +
           human_bytes(budget));
  }
  // A GPU the old plan already fills past its budget may not grow further: the transition
  // can only help it.
  std::vector<std::uint64_t> cap(devs, budget);
  for (std::size_t d = 0; d < devs; ++d) cap[d] = std::max(budget, before[d]);

  // Successors, stored flat: succ[first[x] .. first[x + 1]).
  std::vector<std::uint32_t> indeg(nodes, 0), first(nodes + 1, 0), succ;
  for (std::uint32_t x = 0; x < nodes; ++x)
    for (const Edge& e : g_.nodes[x].after) {
      ++first[e.node + 1];
      ++indeg[x];
    }
  for (std::size_t x = 0; x < nodes; ++x) first[x + 1] += first[x];
  succ.resize(first[nodes]);
  {
    std::vector<std::uint32_t> fill(first.begin(), first.end() - 1);
    for (std::uint32_t x = 0; x < nodes; ++x)
      for (const Edge& e : g_.nodes[x].after) succ[fill[e.node]++] = x;
  }
  const bool limited = req_.memory.capacity > 0;
  auto fits = [&](std::uint32_t x, const std::vector<std::uint64_t>& mem) {
    if (!limited) return true;
    for (const Touch& t : touch[x])
      if (mem[static_cast<std::size_t>(t.device)] + t.bytes > cap[static_cast<std::size_t>(t.device)]) return false;
    return true;
  };
  auto apply = [&](std::uint32_t x, std::vector<std::uint64_t>& mem, int sign) {
    for (const Touch& t : touch[x]) {
      auto& m = mem[static_cast<std::size_t>(t.device)];
      m = (g_.nodes[x].is_build() == (sign > 0)) ? m + t.bytes : m - t.bytes;
    }
  };

  // 1. List scheduling: releases as soon as they are ready; then, among the ready builds
  // that fit, first one whose completion lets an old unit go (release before acquire),
  // then generate → infer → train order. A build that does not fit waits on the GPU that
  // is short until something is released there.
  using Key = std::tuple<int, int, std::uint16_t, std::uint32_t, std::uint32_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  auto key = [&](std::uint32_t x, bool frees) {
    const GraphNode& n = g_.nodes[x];
    return Key{frees ? 0 : 1, g_.phase[n.unit.stage], n.unit.stage, n.unit.unit, x};
  };
  std::vector<std::uint32_t> releases;  // ready destroys, a stack
  std::vector<char> done(nodes, 0);
  auto make_ready = [&](std::uint32_t x) {
    if (g_.nodes[x].is_build()) ready.push(key(x, false));
    else releases.push_back(x);
  };
  std::vector<std::uint32_t> left = indeg;
  for (std::uint32_t x = 0; x < nodes; ++x)
    if (left[x] == 0) make_ready(x);
  std::vector<std::uint64_t> mem = before;
  std::vector<std::vector<std::uint32_t>> parked(devs);
  std::vector<std::uint32_t> order;
  order.reserve(nodes);
  auto finish = [&](std::uint32_t x) {
    order.push_back(x);
    done[x] = 1;
    for (std::uint32_t k = first[x]; k < first[x + 1]; ++k) {
      const std::uint32_t y = succ[k];
      if (--left[y] == 0) make_ready(y);
      else if (left[y] == 1 && !g_.nodes[y].is_build())
        // One build stands between this old unit and its release: hurry it.
        for (const Edge& e : g_.nodes[y].after)
          if (!done[e.node] && g_.nodes[e.node].is_build() && left[e.node] == 0) ready.push(key(e.node, true));
    }
  };
  for (;;) {
    while (!releases.empty()) {
      const std::uint32_t x = releases.back();
      releases.pop_back();
      apply(x, mem, +1);
      for (const Touch& t : touch[x]) {
        for (std::uint32_t b : parked[static_cast<std::size_t>(t.device)]) ready.push(key(b, false));
        parked[static_cast<std::size_t>(t.device)].clear();
      }
      finish(x);
    }
    if (ready.empty()) break;
    const std::uint32_t x = std::get<4>(ready.top());
    ready.pop();
    if (done[x]) continue;  // queued twice
    if (!fits(x, mem)) {
      for (const Touch& t : touch[x])
        if (mem[static_cast<std::size_t>(t.device)] + t.bytes > cap[static_cast<std::size_t>(t.device)]) {
          auto& p = parked[static_cast<std::size_t>(t.device)];
          if (std::find(p.begin(), p.end(), x) == p.end()) p.push_back(x);
          break;
        }
      continue;
    }
    apply(x, mem, +1);
    finish(x);
  }

  // 2. When list scheduling gets stuck, search the orders exhaustively (depth first,
  // remembering states that cannot finish) up to a bounded number of steps.
  if (order.size() < nodes) {
    std::vector<std::uint32_t> found = search_order(nodes, indeg, first, succ, before, fits, apply);
    if (!found.empty()) order = std::move(found);
  }

  if (order.size() < nodes) {
    // Stuck: name the first blocked build, the GPU it is short on, and why nothing there
    // can be released first.
    std::uint32_t blocked = 0;
    Key best{2, 1 << 30, 0, 0, 0};
    for (std::size_t d = 0; d < devs; ++d)
      for (std::uint32_t b : parked[d]) {
        const Key k = key(b, false);
        if (k < best) best = k, blocked = b;
      }
    if (std::get<1>(best) == (1 << 30))
      throw Error("internal: the transition graph has a cycle");  // edges only go from builds to later nodes
    const GraphNode& n = g_.nodes[blocked];
    std::string why = g_.describe(n.unit) + " cannot be built: ";
    for (const Touch& t : touch[blocked]) {
      const auto d = static_cast<std::size_t>(t.device);
      if (mem[d] + t.bytes <= cap[d]) continue;
      why += "it needs " + human_bytes(t.bytes) + " on GPU " + std::to_string(d) + ", which has " +
             human_bytes(cap[d] > mem[d] ? cap[d] - mem[d] : 0) + " of its " + human_bytes(cap[d]) + " budget free";
      std::string waiting;
      for (std::uint32_t y = 0; y < nodes; ++y) {
        const GraphNode& r = g_.nodes[y];
        if (r.is_build() || done[y]) continue;
        const auto tg = touch[y];
        if (std::none_of(tg.begin(), tg.end(), [&](const Touch& z) { return static_cast<std::size_t>(z.device) == d; })) continue;
        waiting += (waiting.empty() ? "" : "; ") + g_.describe(r.unit) + " can only be destroyed after ";
        std::string deps;
        for (const Edge& e : r.after)
          if (!done[e.node]) deps += (deps.empty() ? "" : ", ") + g_.describe(g_.nodes[e.node].unit) + " is built";
        waiting += deps;
      }
      why += waiting.empty() ? ", and no old unit there is left to destroy" : ", and " + waiting;
      break;
    }
    fail(why + (search_exhausted_ ? " (no order of the remaining builds fits)"
                                  : " (no order found within the search limit)"));
    // Keep a usable order for reporting: the rest in node order.
    for (std::uint32_t x = 0; x < nodes; ++x)
      if (!done[x]) order.push_back(x);
  }

  // Release-before-acquire edges: for each acquisition, the earliest releases on that GPU
  // that bring the worst case within the budget.
  std::vector<std::uint32_t> pos(nodes);
  for (std::uint32_t k = 0; k < order.size(); ++k) pos[order[k]] = k;
  std::vector<std::vector<std::uint32_t>> rel_on(devs);
  std::vector<std::uint64_t> acquired(devs, 0);
  std::vector<std::uint64_t> worst = before;
  std::vector<std::uint32_t> added;
  for (std::uint32_t x : order) {
    GraphNode& n = g_.nodes[x];
    if (!n.is_build()) {
      for (const Touch& t : touch[x]) rel_on[static_cast<std::size_t>(t.device)].push_back(x);
      continue;
    }
    added.clear();
    for (const Touch& t : touch[x]) {
      const auto d = static_cast<std::size_t>(t.device);
      acquired[d] += t.bytes;
      std::uint64_t level = before[d] + acquired[d];
      for (std::size_t k = 0; k < rel_on[d].size() && level > cap[d]; ++k) {
        const std::uint32_t r = rel_on[d][k];
        for (const Touch& z : touch[r])
          if (static_cast<std::size_t>(z.device) == d) level -= std::min(level, z.bytes);
        if (std::find(added.begin(), added.end(), r) == added.end()) added.push_back(r);
      }
      worst[d] = std::max(worst[d], level);
    }
    for (std::uint32_t r : added)
      if (std::none_of(n.after.begin(), n.after.end(), [&](const Edge& e) { return e.node == r; }))
        n.after.push_back({r, EdgeKind::resource});
  }

  // Renumber the nodes in the static order, permuting in place (node k moves to pos[k]).
  for (GraphNode& n : g_.nodes) {
    for (Edge& e : n.after) e.node = pos[e.node];
    std::sort(n.after.begin(), n.after.end(), [](const Edge& a, const Edge& b) { return a.node < b.node; });
  }
  for (std::uint32_t k = 0; k < nodes; ++k)
    while (pos[k] != k) {
      const std::uint32_t t = pos[k];
      std::swap(g_.nodes[k], g_.nodes[t]);
      std::swap(pos[k], pos[t]);
    }

  for (std::size_t d = 0; d < devs; ++d) {
    if (!used[d]) continue;
    g_.memory.push_back({static_cast<DeviceId>(d), before[d], after[d], worst[d]});
    if (worst[d] > g_.feasibility.worst_bytes || g_.feasibility.worst_device < 0) {
      g_.feasibility.worst_bytes = worst[d];
      g_.feasibility.worst_device = static_cast<DeviceId>(d);
    }
  }
  for (const GpuMemory& m : g_.memory)
    if (g_.feasibility.ok && limited && m.worst > cap[static_cast<std::size_t>(m.device)])
      throw Error("internal: the memory schedule exceeds the budget on GPU " + std::to_string(m.device));
}

void TransitionCompiler::estimate_cost() {
  TransitionSummary& s = g_.summary;
  double cp = 0;
  for (GraphNode& n : g_.nodes) {
    n.start = 0;
    for (const Edge& e : n.after) n.start = std::max(n.start, g_.nodes[e.node].start + g_.nodes[e.node].seconds);
    cp = std::max(cp, n.start + n.seconds);
    if (n.is_build()) {
      ++s.builds;
      s.moved_bytes += n.moved_bytes;
      s.local_bytes += n.local_bytes;
      s.target_bytes += n.unit_bytes;
    } else {
      ++s.destroys;
    }
    for (const Edge& e : n.after)
      ++(e.kind == EdgeKind::data ? s.data_edges : e.kind == EdgeKind::commit ? s.commit_edges : s.resource_edges);
  }
  for (const auto& k : g_.kept)
    for (std::int32_t x : k) s.kept_units += x >= 0;
  double busiest = 0;
  for (const DeviceLoad& l : load_) busiest = std::max({busiest, l.send_seconds, l.recv_seconds});
  s.critical_path_seconds = cp;
  s.link_bound_seconds = busiest;
  s.l_tran_seconds = std::max(cp, busiest);
}

}  // namespace nereus::detail
