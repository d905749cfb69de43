// Compiling S → S*, per model-stage: a direct reshard of the new units, or the
// primitives' route (Split → Destroy → Extend → Merge) through a common sub-layout,
// whichever the cost model prefers (transition_graph.cpp builds the rest of the graph).
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"
#include "transition_compiler.hpp"

namespace nereus::detail {

namespace {

/// The largest layout both `a` and `b` split into: gcd of TP, of PP and of EP (and of the
/// expert TP degrees); none when that layout is invalid for the model.
std::optional<Layout> common_sub_layout(const ModelConfig& m, const Layout& a, const Layout& b) {
  if (a.fsdp > 1 || b.fsdp > 1) return std::nullopt;  // the primitives split TP/PP/EP units, not FSDP chunks
  Layout c;
  c.tp = std::gcd(a.tp, b.tp);
  c.pp = std::gcd(a.pp, b.pp);
  c.ep = std::gcd(a.ep, b.ep);
  if (m.moe()) c.etp = std::gcd(a.expert_tp(), b.expert_tp());
  if (c.pp == b.pp) c.partition = b.partition;
  else if (c.pp == a.pp) c.partition = a.partition;
  c.packing = b.packing;
  try {
    validate_layout(m, c);
  } catch (const Error&) {
    return std::nullopt;
  }
  return c;
}


}  // namespace

void TransitionCompiler::decide_strategies() {
  std::vector<std::uint32_t> here;
  for (std::size_t i = 0; i < n_; ++i) {
    StageDecision d;
    d.model_stage = g_.stages[i];
    std::map<NodeKind, int> kinds;
    std::vector<std::uint32_t> reshards;
    for (std::uint32_t u = 0; u < g_.to[i].units.size(); ++u) {
      if (g_.kept[i][u] >= 0) {
        ++d.kept;
        continue;
      }
      const GraphNode& b = g_.nodes[static_cast<std::size_t>(build_of_[i][u])];
      ++d.built;
      ++kinds[b.kind];
      d.moved_bytes += b.moved_bytes;
      if (reshard_class_[i][u]) reshards.push_back(u);
    }
    for (std::int32_t x : destroy_of_[i]) d.destroyed += x >= 0;
    const Layout& old_l = g_.from[i].units[0].layout;
    const Layout& new_l = g_.to[i].units[0].layout;
    const auto common = common_sub_layout(geo_[i]->model().config(), old_l, new_l);
    if (common) d.common_layout = to_string(*common);
    std::string counts;
    for (const auto& [k, c] : kinds) counts += (counts.empty() ? "" : ", ") + std::to_string(c) + " " + std::string(to_string(k));
    if (d.built == 0 && d.destroyed == 0) {
      d.strategy = "unchanged";
      d.why = "every unit is kept as is";
    } else if (d.built == 0) {
      d.strategy = "primitives";
      d.why = "DP shrinks: " + std::to_string(d.kept) + " unit(s) kept, " + std::to_string(d.destroyed) + " destroyed";
    } else if (reshards.empty()) {
      d.strategy = "primitives";
      d.why = "every new unit is a Split, Merge, Extend or Sync of old units (" + counts + "), moving the lower bound " +
              human_bytes(d.moved_bytes);
    } else {
      // Cost the primitive path through the common sub-layout for the units that need a
      // reshard: Split/Extend into units of the common layout on the new GPUs, then Merge.
      d.strategy = "direct";
      std::uint64_t path = d.moved_bytes;
      std::uint64_t extra_memory = 0;
      if (common && !common->same_sharding(new_l)) {
        const int cid = geo_[i]->intern(*common);
        const Layout& c = *common;
        for (std::uint32_t u : reshards) {
          const Emu& e = g_.to[i].units[u];
          path -= g_.nodes[static_cast<std::size_t>(build_of_[i][u])].moved_bytes;
          const int cs = c.size();
          for (int k = 0; k < e.layout.size(); ++k) {
            const DeviceId dev = e.gpus[static_cast<std::size_t>(k)];
            const std::uint32_t mid = UnitGeometry::code(cid, (k % cs) / c.stage_size(), (k % cs) % c.stage_size());
            here.clear();
            for (const Holder& h : holders_on_[static_cast<std::size_t>(dev)])
              if (eligible(h.stage, i)) here.push_back(h.code);
            const Held mid_held = geo_[i]->held(mid);
            path += (mid_held - geo_[i]->overlap(mid, here)).bytes(train_[i]);
            extra_memory = std::max(extra_memory, mid_held.bytes(train_[i]));
            here.push_back(mid);
            const std::uint32_t p = UnitGeometry::code(geo_[i]->intern(e.layout), k / e.layout.stage_size(), k % e.layout.stage_size());
            path += (geo_[i]->held(p) - geo_[i]->overlap(p, here)).bytes(train_[i]);
          }
        }
        d.via_common_bytes = path;
      }
      const std::string which = std::to_string(reshards.size()) + " new unit(s) are no Split, Merge or Extend of old units";
      if (!common) d.why = which + " and the layouts share no valid sub-layout; direct copies move " + human_bytes(d.moved_bytes);
      else if (d.via_common_bytes == 0)
        d.why = which + "; the common sub-layout " + d.common_layout + " is the new layout itself, so direct copies move " +
                human_bytes(d.moved_bytes);
      else if (d.via_common_bytes > d.moved_bytes)
        d.why = which + "; direct copies move " + human_bytes(d.moved_bytes) + ", the path through " + d.common_layout +
                " would move " + human_bytes(d.via_common_bytes);
      else
        d.why = which + "; direct copies and the path through " + d.common_layout + " both move " +
                human_bytes(d.moved_bytes) + ", but the path holds intermediate units (" + human_bytes(extra_memory) + " per GPU)";
    }
    g_.decisions.push_back(std::move(d));
  }
}

}  // namespace nereus::detail
