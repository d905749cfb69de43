#include "reshard_index.hpp"

#include <algorithm>
#include <map>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/sharding.hpp"

namespace nereus {

namespace {

/// Shard class of a tensor: its kind, or kTensorKinds + 3·expert + (expert kind offset).
std::uint32_t class_of(const TensorInfo& t) {
  if (!is_expert(t.kind)) return static_cast<std::uint32_t>(t.kind);
  return static_cast<std::uint32_t>(kTensorKinds + 3 * t.expert + (static_cast<int>(t.kind) - static_cast<int>(TensorKind::expert_gate)));
}

HoldingLists group_by(const std::vector<Holding>& hs, std::int64_t keys, auto key_of) {
  HoldingLists out;
  out.start.assign(static_cast<std::size_t>(keys + 1), 0);
  for (const Holding& h : hs) ++out.start[static_cast<std::size_t>(key_of(h)) + 1];
  for (std::size_t k = 1; k < out.start.size(); ++k) out.start[k] += out.start[k - 1];
  out.items.resize(hs.size());
  std::vector<std::uint32_t> fill(out.start.begin(), out.start.end() - 1);
  for (std::uint32_t i = 0; i < hs.size(); ++i) out.items[fill[key_of(hs[i])]++] = i;
  return out;
}

}  // namespace

void ReshardIndex::push_template(Template t) {
  if (bands_[t.cls].empty()) {
    templates.push_back(std::move(t));
    return;
  }
  for (const auto& [rows, cls] : bands_[t.cls]) {
    Template b = t;
    b.cls = cls;
    b.band = rows;
    b.slab_width = rows.size();
    templates.push_back(std::move(b));
  }
}

std::uint16_t ReshardIndex::layout_index(const Layout& l) {
  for (std::size_t i = 0; i < layouts.size(); ++i)
    if (layouts[i].same_sharding(l)) return static_cast<std::uint16_t>(i);
  layouts.push_back(l);
  return static_cast<std::uint16_t>(layouts.size() - 1);
}

ReshardIndex::ReshardIndex(std::span<const Collection> srcs, const Collection& tgt, int gpn)
    : model_(tgt.model), sources(srcs.begin(), srcs.end()), target(tgt), gpus_per_node(gpn) {
  if (gpus_per_node < 1) throw Error("gpus per node must be at least 1");
  if (sources.empty()) throw Error("no source collection");
  target.validate();
  for (const Collection& c : sources) {
    c.validate();
    if (!same_model(*c.model, *target.model))
      throw Error("source model-stage '" + c.model_stage + "' (" + c.model->name() +
                  ") and target model-stage '" + target.model_stage + "' (" + target.model->name() +
                  ") are different models");
  }
  const ModelConfig& cfg = model_->config();

  // Layouts, and per layout the ranges of each shard class by in-stage index (tensors of
  // a class share shapes). A class is a kind, or for experts one expert's kind.
  for (const Collection& c : sources) {
    auto& v = source_layout.emplace_back();
    for (const Emu& u : c.units) v.push_back(layout_index(u.layout));
  }
  for (const Emu& u : target.units) target_layout.push_back(layout_index(u.layout));
  std::vector<const TensorInfo*> rep(static_cast<std::size_t>(kTensorKinds + 3 * cfg.experts), nullptr);
  for (const TensorInfo& t : model_->tensors())
    if (!rep[class_of(t)]) rep[class_of(t)] = &t;
  // Row bands of column-split kinds when a layout uses FSDP: cut at every chunk boundary
  // of every layout; band 0 keeps the kind's class, the others get classes of their own.
  std::vector<Range> band_rows(rep.size());
  bands_.resize(rep.size());
  const bool fsdp = std::any_of(layouts.begin(), layouts.end(), [](const Layout& l) { return l.fsdp > 1; });
  for (std::size_t k = 0; fsdp && k < bands_.size(); ++k) {
    if (!rep[k] || split_axis(rep[k]->kind) != 1) continue;
    const std::int64_t n = rep[k]->shape[0];
    std::vector<std::int64_t> cuts{0, n};
    for (const Layout& l : layouts)
      for (int f = 0; f < l.fsdp; ++f) cuts.push_back(fsdp_chunk({0, n}, l.fsdp, f).lo);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const Range band{cuts[i], cuts[i + 1]};
      std::uint32_t cls = static_cast<std::uint32_t>(k);
      if (i > 0) {
        cls = static_cast<std::uint32_t>(rep.size());
        rep.push_back(rep[k]);
        band_rows.resize(rep.size());
      }
      band_rows[cls] = band;
      bands_[k].push_back({band, cls});
    }
  }
  ranges_.resize(layouts.size());
  by_lo_.resize(layouts.size());
  holders_.resize(layouts.size());
  for (std::size_t li = 0; li < layouts.size(); ++li) {
    ranges_[li].resize(rep.size());
    by_lo_[li].resize(rep.size());
    holders_[li].resize(rep.size());
    for (std::size_t k = 0; k < rep.size(); ++k) {
      if (!rep[k]) continue;
      for (int g = 0; g < layouts[li].stage_size(); ++g) {
        Range r = stage_range(cfg, *rep[k], layouts[li], g);
        if (!band_rows[k].empty() && !fsdp_rows(*rep[k], layouts[li], g).contains(band_rows[k])) r = {0, 0};
        ranges_[li][k].push_back(r);
        if (!r.empty()) by_lo_[li][k].push_back({r, g});
        if (!r.empty()) holders_[li][k].push_back(g);
      }
      std::stable_sort(by_lo_[li][k].begin(), by_lo_[li][k].end(),
                       [](const RangeAt& a, const RangeAt& b) { return a.range.lo < b.range.lo; });
    }
  }

  // Templates: embedding, layer groups × kinds (× experts), final norm, lm_head or score.
  auto stage_sets = [&](const TensorInfo& t) {
    std::vector<StageSet> sets(layouts.size());
    for (std::size_t li = 0; li < layouts.size(); ++li)
      for (int s = 0; s < layouts[li].pp; ++s)
        if (stage_holds(cfg, layouts[li], s, t) && sets[li].n < 2) sets[li].s[sets[li].n++] = static_cast<std::int16_t>(s);
    return sets;
  };
  auto single = [&](TensorId id) {
    const TensorInfo& t = model_->tensor(id);
    push_template({t.kind, class_of(t), {id}, stage_sets(t), slab_width(t), t.dtype, quantizable(t)});
  };
  single(*model_->find(TensorKind::embed));
  // Layers group by their stage in every layout and by class (dense or sparse).
  std::map<std::vector<std::int16_t>, std::size_t> group_of;
  std::vector<std::vector<std::int32_t>> layer_groups;
  for (std::int32_t l = 0; l < cfg.layers; ++l) {
    std::vector<std::int16_t> key{static_cast<std::int16_t>(cfg.sparse_layer(l))};
    for (const Layout& lay : layouts) key.push_back(static_cast<std::int16_t>(lay.stage_of(l, cfg.layers)));
    auto [it, fresh] = group_of.try_emplace(key, layer_groups.size());
    if (fresh) layer_groups.emplace_back();
    layer_groups[it->second].push_back(l);
  }
  for (const auto& layers : layer_groups) {
    const bool sparse = cfg.sparse_layer(layers[0]);
    for (TensorKind k : model_->layer_kinds(sparse)) {
      const std::int32_t experts = is_expert(k) ? static_cast<std::int32_t>(cfg.experts) : 1;
      for (std::int32_t x = 0; x < experts; ++x) {
        const TensorInfo& first = model_->tensor(*model_->find(k, layers[0], x));
        Template t{k, class_of(first), {}, stage_sets(first), slab_width(first), first.dtype, quantizable(first)};
        for (std::int32_t l : layers) t.tensors.push_back(*model_->find(k, l, x));
        push_template(std::move(t));
      }
    }
  }
  single(*model_->find(TensorKind::final_norm));
  if (auto head = model_->find(TensorKind::lm_head)) single(*head);
  if (auto score = model_->find(TensorKind::score)) single(*score);

  // Slot groups: optimizer slots can only come from training sources.
  auto group = [&](std::vector<Slot> slots, bool train_only) {
    SlotGroup g{std::move(slots), {}};
    for (const Collection& c : sources) g.eligible.push_back(!train_only || c.train);
    groups.push_back(std::move(g));
  };
  const bool all_train = std::all_of(sources.begin(), sources.end(), [](const Collection& c) { return c.train; });
  const bool any_train = std::any_of(sources.begin(), sources.end(), [](const Collection& c) { return c.train; });
  if (!target.train || all_train) {
    group({target.slots().begin(), target.slots().end()}, false);
  } else {
    if (!any_train)
      throw Error("target model-stage '" + target.model_stage +
                  "' is a training stage (slots master, exp_avg, exp_avg_sq) but no source model-stage holds them");
    group({Slot::param}, false);
    group({Slot::master, Slot::exp_avg, Slot::exp_avg_sq}, true);
  }

  // Source positions, by device and by node.
  for (std::uint32_t c = 0; c < sources.size(); ++c)
    for (std::uint32_t u = 0; u < sources[c].units.size(); ++u) {
      const Emu& e = sources[c].units[u];
      for (int s = 0; s < e.layout.pp; ++s)
        for (int g = 0; g < e.layout.stage_size(); ++g)
          holdings.push_back({c, u, static_cast<std::uint16_t>(s), static_cast<std::uint16_t>(g),
                              source_layout[c][u], e.device(s, g)});
    }
  for (const Holding& h : holdings) max_device = std::max(max_device, h.dev);
  for (DeviceId d : target.devices()) max_device = std::max(max_device, d);
  by_device = group_by(holdings, max_device + 1, [](const Holding& h) { return h.dev; });
  by_node = group_by(holdings, max_device / gpus_per_node + 1,
                     [this](const Holding& h) { return node_of(h.dev); });
}

}  // namespace nereus
