#include "nereus/plan/geometry.hpp"

#include <algorithm>

#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/sharding.hpp"

namespace nereus {

UnitGeometry::UnitGeometry(std::shared_ptr<const ModelSpec> model) : model_(std::move(model)) {
  // One representative layer of each class (dense, sparse): the first of its class.
  const ModelConfig& c = model_->config();
  std::int32_t rep[2] = {-1, -1};
  for (std::int32_t l = 0; l < c.layers; ++l) {
    const int k = c.sparse_layer(l) ? 1 : 0;
    if (rep[k] < 0) rep[k] = l;
  }
  for (TensorId t = 0; t < model_->tensors().size(); ++t) {
    const TensorInfo& info = model_->tensor(t);
    if (info.layer < 0) outside_.push_back(t);
    else if (info.layer == rep[0]) layer_rep_[0].push_back(t);
    else if (info.layer == rep[1]) layer_rep_[1].push_back(t);
  }
}

std::size_t UnitGeometry::KeyHash::operator()(const Key& k) const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint32_t c : k.codes) h = (h ^ c) * 0x100000001b3ull;
  return static_cast<std::size_t>(h);
}

int UnitGeometry::intern(const Layout& l) {
  for (std::size_t i = 0; i < layouts_.size(); ++i)
    if (layouts_[i].same_sharding(l)) return static_cast<int>(i);
  layouts_.push_back(l);
  return static_cast<int>(layouts_.size() - 1);
}

Held UnitGeometry::held(std::uint32_t position) {
  auto it = held_.find(position);
  if (it != held_.end()) return it->second;
  const Position p = this->position(position);
  const Held n = compute_overlap(p, std::span<const Position>(&p, 1));
  held_.emplace(position, n);
  return n;
}

Held UnitGeometry::overlap(std::uint32_t target, std::span<const std::uint32_t> holders) {
  if (holders.empty()) return {};
  if (holders.size() > 5) {
    std::vector<Position> hs;
    for (std::uint32_t h : holders) hs.push_back(position(h));
    return compute_overlap(position(target), hs);
  }
  Key k;
  k.codes[0] = target;
  for (std::size_t i = 0; i < holders.size(); ++i) k.codes[i + 1] = holders[i] + 1;  // 0 marks "none"
  // Holders are a set: sort them (insertion sort; at most five).
  for (std::size_t i = 2; i <= holders.size(); ++i)
    for (std::size_t j = i; j > 1 && k.codes[j - 1] > k.codes[j]; --j) std::swap(k.codes[j - 1], k.codes[j]);
  auto it = memo_.find(k);
  if (it != memo_.end()) return it->second;
  std::array<Position, 5> hs{};
  for (std::size_t i = 0; i < holders.size(); ++i) hs[i] = position(holders[i]);
  const Held v = compute_overlap(position(target), std::span<const Position>(hs.data(), holders.size()));
  memo_.emplace(k, v);
  return v;
}

namespace {

/// Elements of `want` covered by the union of `have` (ranges along the split axis).
std::int64_t covered(Range want, std::vector<Range>& have) {
  std::sort(have.begin(), have.end(), [](Range a, Range b) { return a.lo < b.lo; });
  std::int64_t n = 0, cur = want.lo;
  for (Range h : have) {
    const Range x = h.intersect({cur, want.hi});
    if (x.empty()) continue;
    n += x.size();
    cur = x.hi;
  }
  return n;
}

}  // namespace

Held UnitGeometry::compute_overlap(const Position& target, std::span<const Position> holders) const {
  const ModelConfig& m = model_->config();
  std::vector<Range> have;
  const bool fsdp = target.layout->fsdp > 1 ||
                    std::any_of(holders.begin(), holders.end(), [](const Position& h) { return h.layout->fsdp > 1; });
  auto tensor_overlap = [&](const TensorInfo& t, auto&& holds) {
    const Range want = stage_range(m, t, *target.layout, target.r);
    if (want.empty()) return Held{};
    std::int64_t n = 0, e = 0;
    if (fsdp && split_axis(t.kind) == 1) {
      // FSDP cuts a column-split tensor's rows: count in row bands, in each of which every
      // holder holds its columns or nothing. n: covered columns as one run (for blocks).
      const Range rows = fsdp_rows(t, *target.layout, target.r);
      std::vector<std::int64_t> cuts{rows.lo, rows.hi};
      for (const Position& h : holders)
        for (std::int64_t c : {fsdp_rows(t, *h.layout, h.r).lo, fsdp_rows(t, *h.layout, h.r).hi})
          if (rows.lo < c && c < rows.hi) cuts.push_back(c);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
        const Range band{cuts[i], cuts[i + 1]};
        have.clear();
        for (const Position& h : holders)
          if (holds(h) && fsdp_rows(t, *h.layout, h.r).contains(band)) have.push_back(stage_range(m, t, *h.layout, h.r));
        e += covered(want, have) * band.size();
      }
      n = rows.empty() ? 0 : e / rows.size();
    } else {
      have.clear();
      for (const Position& h : holders)
        if (holds(h)) have.push_back(stage_range(m, t, *h.layout, h.r));
      n = covered(want, have);
      e = n * slab_width(t);
    }
    // An FP8 unit holds a quantized weight at one byte an element plus a float32 scale a
    // block; the blocks are counted as if the covered part were one run from want.lo,
    // exact for what a position holds and for block-aligned holders (sharding.md).
    if (target.layout->fp8 && quantizable(t)) return Held{e, e + 4 * fp8_block_count(m, t, {want.lo, want.lo + n})};
    return Held{e, e * static_cast<std::int64_t>(width(t.dtype))};
  };
  Held n;
  for (TensorId id : outside_) {
    const TensorInfo& t = model_->tensor(id);
    if (!stage_holds(m, *target.layout, target.s, t)) continue;
    n += tensor_overlap(t, [&](const Position& h) { return stage_holds(m, *h.layout, h.s, t); });
  }
  // Layers: the target's layer range cut where a holder's stage range starts or ends; in
  // each segment the same holders hold every layer, so one layer's overlap counts for all
  // layers of its class (dense or sparse).
  const Range layers = target.layout->stage_layers(target.s, m.layers);
  std::vector<std::int64_t> cuts{layers.lo, layers.hi};
  std::vector<Range> held(holders.size());
  for (std::size_t i = 0; i < holders.size(); ++i) {
    held[i] = holders[i].layout->stage_layers(holders[i].s, m.layers);
    for (std::int64_t c : {held[i].lo, held[i].hi})
      if (layers.lo < c && c < layers.hi) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const std::int64_t lo = cuts[c], len = cuts[c + 1] - cuts[c];
    std::int64_t sparse = 0;
    for (std::int64_t l = lo; l < cuts[c + 1]; ++l) sparse += m.sparse_layer(l);
    for (int k = 0; k < 2; ++k) {
      const std::int64_t count = k == 1 ? sparse : len - sparse;
      if (count == 0) continue;
      for (TensorId id : layer_rep_[k]) {
        const TensorInfo& t = model_->tensor(id);
        const Held one = tensor_overlap(t, [&](const Position& h) {
          return held[static_cast<std::size_t>(&h - holders.data())].contains(lo);
        });
        n += Held{count * one.elements, count * one.param_bytes};
      }
    }
  }
  return n;
}

}  // namespace nereus
