// Compiling S → S*: which new units are kept, which primitive builds each of the others
// and from which old units, which old units are destroyed, and the data and commit edges.
// The memory schedule and the cost are in transition_schedule.cpp.
#include "nereus/plan/transition_graph.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <cstdio>

#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/stage_state.hpp"
#include "transition_compiler.hpp"

namespace nereus {

std::string_view to_string(NodeKind k) {
  switch (k) {
    case NodeKind::split: return "split";
    case NodeKind::merge: return "merge";
    case NodeKind::extend: return "extend";
    case NodeKind::sync: return "sync";
    case NodeKind::reshard: return "reshard";
    case NodeKind::destroy: return "destroy";
  }
  return "?";
}

std::string_view to_string(EdgeKind k) {
  switch (k) {
    case EdgeKind::data: return "data";
    case EdgeKind::commit: return "commit";
    case EdgeKind::resource: return "resource";
  }
  return "?";
}

std::uint64_t MemoryModel::budget() const {
  if (capacity == 0) return std::numeric_limits<std::uint64_t>::max() / 4;
  return static_cast<std::uint64_t>(static_cast<double>(capacity) * (1.0 - headroom));
}

std::uint64_t MemoryModel::workspace_of(std::string_view model_stage) const {
  for (const auto& [name, bytes] : workspace)
    if (name == model_stage) return bytes;
  return 0;
}

std::string TransitionGraph::describe(const UnitRef& u) const {
  return stages[u.stage] + (u.target ? " new unit " : " old unit ") + std::to_string(u.unit) + " (GPUs " +
         device_list_string(emu(u).gpus) + ")";
}

namespace detail {

TransitionCompiler::TransitionCompiler(const TransitionRequest& req) : req_(req) {}

double TransitionCompiler::link_gbps(DeviceId a, DeviceId b) const {
  const LinkModel& l = req_.links;
  if (node_of(a) == node_of(b)) return l.intra_node_gbps;
  return l.inter_node_gbps * l.nics_per_node / std::max(1, l.gpus_per_node);  // a GPU's share of its node's NICs
}

const std::vector<std::uint64_t>& TransitionCompiler::footprint(std::size_t stage, const Layout& layout) {
  const int id = geo_[stage]->intern(layout);
  auto& f = footprints_[stage][id];
  if (f.empty())
    for (int s = 0; s < layout.pp; ++s)
      for (int r = 0; r < layout.stage_size(); ++r)
        f.push_back(geo_[stage]->held(UnitGeometry::code(id, s, r)).bytes(train_[stage]));
  return f;
}

std::uint64_t TransitionCompiler::add_touches(std::size_t stage, const Emu& e, std::uint64_t extra) {
  const auto& f = footprint(stage, e.layout);
  std::uint64_t total = 0;
  touch_.start();
  for (std::size_t k = 0; k < e.gpus.size(); ++k) {
    touch_.add({e.gpus[k], f[k] + extra});
    total += f[k];
  }
  return total;
}

void TransitionCompiler::validate() {
  if (!req_.job) throw Error("transition: no job given");
  const auto stages = model_stages(*req_.job);
  n_ = stages.size();
  if (req_.from.size() != n_ || req_.to.size() != n_)
    throw Error("transition: the job has " + std::to_string(n_) + " model-stages but the plans give " +
                std::to_string(req_.from.size()) + " and " + std::to_string(req_.to.size()));
  if (!req_.stale.empty() && req_.stale.size() != n_) throw Error("transition: stale flags must be given for every model-stage");
  const std::int64_t batch = req_.job->prompts_per_step * req_.job->samples_per_prompt;
  std::vector<std::string> roles;
  for (std::size_t i = 0; i < n_; ++i) {
    const ModelStage& st = stages[i];
    for (const Collection* c : {&req_.from[i], &req_.to[i]}) {
      if (c->model_stage != st.name())
        throw Error("transition: model-stage " + std::to_string(i) + " is '" + c->model_stage + "', expected '" + st.name() + "'");
      if (!c->model || !same_model(*c->model, *st.model))
        throw Error("transition: model-stage '" + st.name() + "' is not a " + st.model->name() + " collection");
      if (c->train != (st.kind == StageKind::train))
        throw Error("transition: model-stage '" + st.name() + "' must " + (c->train ? "not " : "") + "carry training slots");
      c->validate();
      for (DeviceId d : c->devices()) max_device_ = std::max(max_device_, d);
    }
    if (batch > 0 && !dp_allowed(batch, req_.to[i].dp()))
      throw Error("transition: model-stage '" + st.name() + "': dp " + std::to_string(req_.to[i].dp()) +
                  " does not divide the global batch of " + std::to_string(batch) +
                  " sequences (prompts_per_step x samples_per_prompt), which DP scaling keeps");
    auto it = std::find(roles.begin(), roles.end(), st.role);
    role_.push_back(static_cast<int>(it - roles.begin()));
    if (it == roles.end()) roles.push_back(st.role);
    train_.push_back(st.kind == StageKind::train);
    stale_.push_back(!req_.stale.empty() && req_.stale[i]);
    auto& geo = geometries_[st.model.get()];
    if (!geo) geo = std::make_unique<UnitGeometry>(st.model);
    geo_.push_back(geo.get());
    g_.stages.push_back(st.name());
    g_.phase.push_back(static_cast<int>(st.kind));
  }
  // A role's training stage holds the only optimizer state, so it can never be stale.
  for (std::size_t i = 0; i < n_; ++i)
    if (stale_[i] && train_[i]) throw Error("transition: training model-stage '" + g_.stages[i] + "' cannot be stale");
  g_.from = req_.from;
  g_.to = req_.to;
  holders_on_.assign(static_cast<std::size_t>(max_device_) + 1, {});
  load_.assign(static_cast<std::size_t>(max_device_) + 1, {});
  stamp_.assign(static_cast<std::size_t>(max_device_) + 1, 0);
  footprints_.resize(n_);
  for (std::size_t i = 0; i < n_; ++i)
    for (std::uint32_t j = 0; j < g_.from[i].units.size(); ++j) {
      const Emu& e = g_.from[i].units[j];
      const int id = geo_[i]->intern(e.layout);
      for (int s = 0; s < e.layout.pp; ++s)
        for (int r = 0; r < e.layout.stage_size(); ++r)
          holders_on_[static_cast<std::size_t>(e.device(s, r))].push_back(
              {static_cast<std::uint16_t>(i), j, UnitGeometry::code(id, s, r)});
    }
}

void TransitionCompiler::find_kept() {
  g_.kept.resize(n_);
  for (std::size_t i = 0; i < n_; ++i) {
    const auto& olds = g_.from[i].units;
    std::map<DeviceId, std::uint32_t> by_first;
    for (std::uint32_t j = 0; j < olds.size(); ++j) by_first[olds[j].gpus[0]] = j;
    for (const Emu& e : g_.to[i].units) {
      auto it = by_first.find(e.gpus[0]);
      const bool same = it != by_first.end() && olds[it->second].gpus == e.gpus && olds[it->second].layout == e.layout;
      g_.kept[i].push_back(same ? static_cast<std::int32_t>(it->second) : -1);
    }
  }
}

namespace {

/// Picks donor replicas round-robin so that each serves about as many builds, preferring
/// one on the new unit's node.
class DonorPicker {
 public:
  void add(UnitRef u, int node) {
    by_node_[node].push_back(static_cast<std::uint32_t>(all_.size()));
    all_.push_back(u);
    load_.push_back(0);
  }
  bool empty() const { return all_.empty(); }
  UnitRef pick(int node) {
    const std::uint32_t cap = picks_ / static_cast<std::uint32_t>(all_.size()) + 1;
    ++picks_;
    auto it = by_node_.find(node);
    if (it != by_node_.end()) {
      auto& [list, next] = it->second;
      for (std::size_t k = 0; k < list.size(); ++k) {
        const std::uint32_t c = list[(next + k) % list.size()];
        if (load_[c] < cap) {
          next = (next + k + 1) % list.size();
          return take(c);
        }
      }
    }
    for (;; global_ = (global_ + 1) % all_.size())
      if (load_[global_] < cap) return take(global_);
  }

 private:
  struct NodeList {
    std::vector<std::uint32_t> list;
    std::size_t next = 0;
    void push_back(std::uint32_t c) { list.push_back(c); }
  };
  UnitRef take(std::uint32_t c) {
    ++load_[c];
    return all_[c];
  }
  std::vector<UnitRef> all_;
  std::vector<std::uint32_t> load_;
  std::map<int, NodeList> by_node_;
  std::uint32_t picks_ = 0;
  std::uint32_t global_ = 0;
};

}  // namespace

const std::map<DeviceId, std::uint32_t>& TransitionCompiler::new_unit_on(std::size_t i) {
  auto [it, fresh] = new_unit_on_.try_emplace(i);
  if (fresh)
    for (std::uint32_t k = 0; k < g_.to[i].units.size(); ++k)
      if (g_.kept[i][k] < 0)
        for (DeviceId d : g_.to[i].units[k].gpus) it->second[d] = k;
  return it->second;
}

std::optional<UnitRef> TransitionCompiler::far_donor(std::size_t i, std::uint32_t u) {
  const Emu& e = g_.to[i].units[u];
  auto overlaps = [&](const Emu& x) {
    return std::any_of(x.gpus.begin(), x.gpus.end(), [&](DeviceId d) { return stamp_[static_cast<std::size_t>(d)] == stamp_now_; });
  };
  ++stamp_now_;
  for (DeviceId d : e.gpus) stamp_[static_cast<std::size_t>(d)] = stamp_now_;
  const auto& need = new_unit_on(i);
  // Best: an old replica on GPUs no later new unit needs; then one whose GPUs are needed
  // soonest after this unit (it is freed right after it is read). Never one whose GPUs an
  // earlier new unit needed: that one had to go first.
  std::optional<UnitRef> best;
  long best_score = 0;
  for (std::size_t k = 0; k < n_; ++k) {
    if (!eligible(k, i)) continue;
    for (std::uint32_t j = 0; j < g_.from[k].units.size(); ++j) {
      const Emu& o = g_.from[k].units[j];
      if (overlaps(o)) continue;
      long first = -1;
      for (DeviceId d : o.gpus)
        if (auto it = need.find(d); it != need.end() && k == i) first = first < 0 ? it->second : std::min<long>(first, it->second);
      if (first >= 0 && first < static_cast<long>(u)) continue;
      const long score = first < 0 ? -1 : first;
      if (!best || score < best_score) best = UnitRef{static_cast<std::uint16_t>(k), false, j}, best_score = score;
    }
  }
  if (best) return best;
  // A new unit of this stage built before, on other GPUs.
  for (std::uint32_t k = 0; k < u; ++k)
    if (g_.kept[i][k] < 0 && build_of_[i][k] >= 0 && !overlaps(g_.to[i].units[k]))
      return UnitRef{static_cast<std::uint16_t>(i), true, k};
  return std::nullopt;
}

void TransitionCompiler::classify_builds() {
  std::size_t units = 0;
  for (std::size_t i = 0; i < n_; ++i) units += g_.from[i].units.size() + g_.to[i].units.size();
  g_.nodes.reserve(units);
  build_of_.resize(n_);
  reshard_class_.resize(n_);
  const LinkModel& links = req_.links;
  const double hbm = std::max(1.0, links.hbm_gbps) * 1e9;
  std::vector<std::uint32_t> here;
  std::vector<UnitRef> src;
  for (std::size_t i = 0; i < n_; ++i) {
    build_of_[i].assign(g_.to[i].units.size(), -1);
    reshard_class_[i].assign(g_.to[i].units.size(), false);
    // Donors for new units on GPUs that hold nothing of the role: same sharding first
    // (rank-aligned copies), own model-stage first.
    std::map<int, DonorPicker> donors;  // by layout key: 0 same sharding as unit 0 of the new plan, 1 any
    const Layout& new_layout = g_.to[i].units[0].layout;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < n_; ++k) {
        if (!eligible(k, i) || ((k == i) != (pass == 0))) continue;
        for (std::uint32_t j = 0; j < g_.from[k].units.size(); ++j) {
          const Emu& e = g_.from[k].units[j];
          const UnitRef ref{static_cast<std::uint16_t>(k), false, j};
          if (e.layout.same_sharding(new_layout)) donors[0].add(ref, node_of(e.gpus[0]));
          donors[1].add(ref, node_of(e.gpus[0]));
        }
      }
    if (donors[1].empty())
      throw Error("transition: model-stage '" + g_.stages[i] + "' has no old unit to take its state from (" +
                  (stale_[i] ? "its own units are stale and " : "") + "no other model-stage of role '" +
                  std::string(role_of(g_.stages[i])) + "' holds " + (train_[i] ? "the optimizer state" : "its params") + ")");

    for (std::uint32_t u = 0; u < g_.to[i].units.size(); ++u) {
      if (g_.kept[i][u] >= 0) continue;
      const Emu& e = g_.to[i].units[u];
      GraphNode node;
      node.unit = {static_cast<std::uint16_t>(i), true, u};
      src.clear();
      for (DeviceId d : e.gpus)
        for (const Holder& h : holders_on_[static_cast<std::size_t>(d)])
          if (eligible(h.stage, i)) {
            const UnitRef ref{h.stage, false, h.unit};
            if (std::find(src.begin(), src.end(), ref) == src.end()) src.push_back(ref);
          }
      ++stamp_now_;
      for (DeviceId d : e.gpus) stamp_[static_cast<std::size_t>(d)] = stamp_now_;
      auto mine = [&](DeviceId d) { return stamp_[static_cast<std::size_t>(d)] == stamp_now_; };
      UnitRef donor{};
      bool has_donor = false;
      std::optional<UnitRef> far;
      if (req_.memory_first) far = far_donor(i, u);
      if (far) {
        donor = *far;
        has_donor = true;
        src.assign(1, donor);
        const bool aligned = g_.emu(donor).layout.same_sharding(e.layout);
        node.kind = donor.stage != i ? NodeKind::sync : aligned ? NodeKind::extend : NodeKind::reshard;
      } else if (src.empty()) {
        DonorPicker& p = donors[0].empty() ? donors[1] : donors[0];
        donor = p.pick(node_of(e.gpus[0]));
        has_donor = true;
        src.push_back(donor);
        const bool aligned = g_.emu(donor).layout.same_sharding(e.layout);
        node.kind = donor.stage != i ? NodeKind::sync : aligned ? NodeKind::extend : NodeKind::reshard;
      } else {
        std::vector<UnitRef> own;
        for (const UnitRef& r : src)
          if (r.stage == i) own.push_back(r);
        auto inside_new = [&](const UnitRef& r) {
          return std::all_of(g_.emu(r).gpus.begin(), g_.emu(r).gpus.end(), mine);
        };
        if (own.empty()) {
          node.kind = NodeKind::sync;
        } else if (own.size() == 1 && g_.emu(own[0]).layout.size() > e.layout.size() &&
                   std::all_of(e.gpus.begin(), e.gpus.end(), [&](DeviceId d) {
                     const auto& og = g_.emu(own[0]).gpus;
                     return std::find(og.begin(), og.end(), d) != og.end();
                   })) {
          node.kind = NodeKind::split;
        } else if (own.size() >= 2 && std::all_of(own.begin(), own.end(), inside_new) &&
                   std::accumulate(own.begin(), own.end(), std::size_t{0},
                                   [&](std::size_t n, const UnitRef& r) { return n + g_.emu(r).gpus.size(); }) ==
                       e.gpus.size()) {
          node.kind = NodeKind::merge;
        } else {
          node.kind = NodeKind::reshard;
        }
      }
      reshard_class_[i][u] = node.kind == NodeKind::reshard;
      std::sort(src.begin(), src.end(), [](const UnitRef& a, const UnitRef& b) {
        return std::tie(a.stage, a.unit) < std::tie(b.stage, b.unit);
      });
      node.sources = src;

      // Bytes and duration, position by position: what its own device already holds stays
      // local; the rest crosses a link from the donor or from the old units on these GPUs.
      double slowest = 0;
      const int lid = geo_[i]->intern(e.layout);
      const auto& fp = footprint(i, e.layout);
      for (int s = 0; s < e.layout.pp; ++s)
        for (int r = 0; r < e.layout.stage_size(); ++r) {
          const DeviceId d = e.device(s, r);
          here.clear();
          if (!far)  // a far donor holds nothing here
            for (const Holder& h : holders_on_[static_cast<std::size_t>(d)])
              if (eligible(h.stage, i)) here.push_back(h.code);
          const std::uint64_t want = fp[static_cast<std::size_t>(s * e.layout.stage_size() + r)];
          const std::uint64_t local = geo_[i]->overlap(UnitGeometry::code(lid, s, r), here).bytes(train_[i]);
          const std::uint64_t remote = want - local;
          node.unit_bytes += want;
          node.local_bytes += local;
          node.moved_bytes += remote;
          // The sender: the donor's matching position, else the old units' devices nearby.
          DeviceId from = d;
          if (has_donor) {
            const Emu& de = g_.emu(donor);
            from = de.gpus[static_cast<std::size_t>(s * e.layout.stage_size() + r) % de.gpus.size()];
          } else if (remote > 0) {
            for (const UnitRef& x : src)
              for (DeviceId o : g_.emu(x).gpus)
                if (o != d && (from == d || node_of(o) == node_of(d))) from = o;
          }
          const double bw = from == d ? hbm : link_gbps(from, d) * 1e9;
          const double t = static_cast<double>(remote) / bw + 2.0 * static_cast<double>(local) / hbm;
          slowest = std::max(slowest, t);
          load_[static_cast<std::size_t>(d)].recv_seconds += static_cast<double>(remote) / bw;
          if (from != d) load_[static_cast<std::size_t>(from)].send_seconds += static_cast<double>(remote) / bw;
        }
      // Per-transfer setup: one transfer per tensor and slot of a position, roughly.
      const double tensors = static_cast<double>(geo_[i]->model().tensors().size()) / e.layout.pp;
      node.seconds = slowest + links.setup_seconds * tensors * (train_[i] ? 4 : 1);
      build_of_[i][u] = static_cast<std::int32_t>(g_.nodes.size());
      add_touches(i, e, req_.memory.staging);
      g_.nodes.push_back(std::move(node));
    }
  }
}

void TransitionCompiler::add_destroys_and_edges() {
  destroy_of_.resize(n_);
  std::vector<std::vector<bool>> is_kept(n_);
  for (std::size_t i = 0; i < n_; ++i) {
    is_kept[i].assign(g_.from[i].units.size(), false);
    for (std::int32_t k : g_.kept[i])
      if (k >= 0) is_kept[i][static_cast<std::size_t>(k)] = true;
    destroy_of_[i].assign(g_.from[i].units.size(), -1);
    for (std::uint32_t j = 0; j < g_.from[i].units.size(); ++j) {
      if (is_kept[i][j]) continue;
      GraphNode node;
      node.kind = NodeKind::destroy;
      node.unit = {static_cast<std::uint16_t>(i), false, j};
      node.unit_bytes = add_touches(i, g_.from[i].units[j], 0);
      destroy_of_[i][j] = static_cast<std::int32_t>(g_.nodes.size());
      g_.nodes.push_back(std::move(node));
    }
  }
  // Data edges: an old unit is freed only after every build that reads it.
  std::vector<std::uint64_t> acquired(static_cast<std::size_t>(max_device_) + 1, 0);
  for (std::uint32_t b = 0; b < g_.nodes.size(); ++b) {
    if (!g_.nodes[b].is_build()) continue;
    for (const UnitRef& s : g_.nodes[b].sources) {
      if (s.target) {  // built from a new unit built before
        g_.nodes[b].after.push_back({static_cast<std::uint32_t>(build_of_[s.stage][s.unit]), EdgeKind::data});
        continue;
      }
      if (const std::int32_t d = destroy_of_[s.stage][s.unit]; d >= 0)
        g_.nodes[static_cast<std::size_t>(d)].after.push_back({b, EdgeKind::data});
    }
    for (const Touch& t : touch_[b]) acquired[static_cast<std::size_t>(t.device)] += t.bytes;
  }

  // Commit edges: until all its new units are committed, a model-stage keeps one old unit
  // (unless a kept unit already spans both plans), so a transition that stops part-way
  // leaves every model-stage a complete collection of its old plan or of its new one. The
  // anchor is the old unit whose GPUs the new plan needs least.
  for (std::size_t i = 0; i < n_; ++i) {
    std::vector<std::uint32_t> builds;
    for (std::int32_t b : build_of_[i])
      if (b >= 0) builds.push_back(static_cast<std::uint32_t>(b));
    const bool spans = std::any_of(g_.kept[i].begin(), g_.kept[i].end(), [](std::int32_t k) { return k >= 0; });
    if (builds.empty() || spans) continue;
    std::int32_t anchor = -1;
    std::uint64_t best = 0;
    for (std::uint32_t j = 0; j < g_.from[i].units.size(); ++j) {
      std::uint64_t need = 0;
      for (DeviceId d : g_.from[i].units[j].gpus) need += acquired[static_cast<std::size_t>(d)];
      if (anchor < 0 || need < best) anchor = static_cast<std::int32_t>(j), best = need;
    }
    if (req_.memory_first) {
      // The old unit whose GPUs the new units of this stage need last (new units are built
      // in order, each from the replica needed next, so the anchor goes last).
      const auto& first_need = new_unit_on(i);  // no unit is kept here: the anchor exists
      long latest = -2;
      for (std::uint32_t j = 0; j < g_.from[i].units.size(); ++j) {
        long first = std::numeric_limits<long>::max();
        for (DeviceId d : g_.from[i].units[j].gpus)
          if (auto it = first_need.find(d); it != first_need.end()) first = std::min<long>(first, it->second);
        if (first > latest) latest = first, anchor = static_cast<std::int32_t>(j);
      }
    }
    GraphNode& a = g_.nodes[static_cast<std::size_t>(destroy_of_[i][static_cast<std::size_t>(anchor)])];
    if (req_.memory_first) {
      // Memory first: the anchor waits only for the new units that do not need its GPUs,
      // so that one replica, old or new, always holds the state.
      const auto& ag = g_.from[i].units[static_cast<std::size_t>(anchor)].gpus;
      std::vector<std::uint32_t> away;
      for (std::uint32_t b : builds) {
        const auto& bg = g_.emu(g_.nodes[b].unit).gpus;
        if (std::none_of(bg.begin(), bg.end(), [&](DeviceId d) { return std::find(ag.begin(), ag.end(), d) != ag.end(); }))
          away.push_back(b);
      }
      if (!away.empty()) builds = away;
    }
    std::set<std::uint32_t> readers;
    for (const Edge& e : a.after) readers.insert(e.node);
    for (std::uint32_t b : builds)
      if (!readers.count(b)) a.after.push_back({b, EdgeKind::commit});
  }
}

TransitionGraph TransitionCompiler::run() {
  const auto t0 = std::chrono::steady_clock::now();
  validate();
  find_kept();
  classify_builds();
  add_destroys_and_edges();
  decide_strategies();
  schedule();
  estimate_cost();
  g_.summary.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  g_.summary.memory_first = req_.memory_first;
  return std::move(g_);
}

}  // namespace detail

TransitionGraph compile_transition(const TransitionRequest& request) {
  TransitionGraph g = detail::TransitionCompiler(request).run();
  if (g.feasibility.ok || request.memory_first || !request.allow_memory_first || request.memory.capacity == 0) return g;
  TransitionRequest again = request;
  again.memory_first = true;
  TransitionGraph m = detail::TransitionCompiler(again).run();
  if (!m.feasibility.ok) return g;  // the lower-bound graph's reason is the clearer one
  m.summary.plan_ms += g.summary.plan_ms;
  return m;
}

BuildPlan plan_build(const TransitionGraph& g, const GraphNode& build, const LinkModel& links) {
  if (!build.is_build()) throw Error("plan_build: node is a destroy");
  std::vector<Collection> sources;
  std::vector<std::vector<UnitRef>> units;
  for (const UnitRef& s : build.sources) {
    std::size_t k = 0;
    while (k < units.size() && !(units[k][0].stage == s.stage && units[k][0].target == s.target)) ++k;
    if (k == units.size()) {
      const Collection& c = g.collection(s);
      sources.push_back(Collection{c.model, c.model_stage, c.train, {}});
      units.emplace_back();
    }
    sources[k].units.push_back(g.emu(s));
    units[k].push_back(s);
  }
  const Collection& tc = g.collection(build.unit);
  const Collection target{tc.model, tc.model_stage, tc.train, {g.emu(build.unit)}};
  return {std::move(units), plan_reshard(sources, target, {links})};
}

}  // namespace nereus
