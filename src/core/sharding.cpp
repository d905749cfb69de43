#include "nereus/core/sharding.hpp"

#include <algorithm>

namespace nereus {

int split_axis(TensorKind k) {
  using K = TensorKind;
  switch (k) {
    case K::embed: case K::lm_head: case K::q: case K::q_bias: case K::k: case K::k_bias:
    case K::v: case K::v_bias: case K::gate: case K::up: case K::expert_gate: case K::expert_up:
    case K::kv_b: case K::shared_gate: case K::shared_up:
      return 0;
    case K::o: case K::down: case K::expert_down: case K::shared_down:
      return 1;
    default:
      return -1;
  }
}

namespace {
Range kv_heads_of_rank(const ModelConfig& m, int tp, int r) {
  if (tp <= m.kv_heads) return part(m.kv_heads, tp, r);
  const std::int64_t h = static_cast<std::int64_t>(r) * m.kv_heads / tp;
  return {h, h + 1};
}
Range times(Range r, std::int64_t f) { return {r.lo * f, r.hi * f}; }
}  // namespace

Range tp_range(const ModelConfig& m, const TensorInfo& t, int tp, int r) {
  using K = TensorKind;
  switch (t.kind) {
    case K::embed: case K::lm_head: return part(m.vocab, tp, r);
    case K::q: case K::q_bias: return times(part(m.heads, tp, r), m.head_dim);  // MLA: hd = dn + dr
    case K::o: return times(part(m.heads, tp, r), m.o_head_width());
    case K::kv_b: return times(part(m.heads, tp, r), m.qk_nope_dim + m.v_head_dim);
    case K::shared_gate: case K::shared_up: case K::shared_down:
      return part(m.shared_experts * m.expert_intermediate, tp, r);
    case K::k: case K::k_bias: case K::v: case K::v_bias:
      return times(kv_heads_of_rank(m, tp, r), m.head_dim);
    case K::gate: case K::up: case K::down: return part(m.intermediate, tp, r);
    case K::expert_gate: case K::expert_up: case K::expert_down: return part(m.expert_intermediate, tp, r);
    default: return {0, t.shape[0]};
  }
}

ExpertGroup expert_group(const Layout& l, int g) {
  const int k = l.expert_tp();
  return {g / k, g % k};
}

Range group_experts(const ModelConfig& m, const Layout& l, int q) { return part(m.experts, l.expert_groups(), q); }

Range fsdp_chunk(Range rows, int F, int f) {
  const std::int64_t n = rows.size();
  const std::int64_t c = (n + F - 1) / F;
  return {rows.lo + std::min(f * c, n), rows.lo + std::min((f + 1) * c, n)};
}

Range fsdp_rows(const TensorInfo& t, const Layout& l, int g) {
  return l.fsdp == 1 ? Range{0, t.shape[0]} : fsdp_chunk({0, t.shape[0]}, l.fsdp, g / l.tp);
}

Range stage_range(const ModelConfig& m, const TensorInfo& t, const Layout& l, int g) {
  if (l.fsdp > 1) {  // dense only (validate_layout)
    const Range tp = tp_range(m, t, l.tp, g % l.tp);
    if (split_axis(t.kind) == 1) return fsdp_rows(t, l, g).empty() ? Range{0, 0} : tp;
    return fsdp_chunk(tp, l.fsdp, g / l.tp);
  }
  if (!is_expert(t.kind)) return tp_range(m, t, l.tp, g % l.tp);
  const ExpertGroup eg = expert_group(l, g);
  if (!group_experts(m, l, eg.group).contains(t.expert)) return {0, 0};
  return tp_range(m, t, l.expert_tp(), eg.rank);
}

std::int64_t slab_width(const TensorInfo& t) {
  if (t.rank == 1) return 1;
  return split_axis(t.kind) == 1 ? t.shape[0] : t.shape[1];
}

bool stage_holds(const ModelConfig& m, const Layout& l, int s, const TensorInfo& t) {
  switch (t.kind) {
    case TensorKind::embed: return s == 0 || (m.tied_embeddings && s == l.pp - 1);
    case TensorKind::final_norm: case TensorKind::lm_head: case TensorKind::score: return s == l.pp - 1;
    default: return l.stage_of(t.layer, m.layers) == s;
  }
}

Box slab_box(const TensorInfo& t, Range range) {
  Box b = t.rank == 1 ? Box::of_shape({t.shape[0]}) : Box::of_shape({t.shape[0], t.shape[1]});
  b.dims[split_axis(t.kind) == 1 ? 1 : 0] = range;
  return b;
}

Box held_box(const ModelConfig& m, const TensorInfo& t, const Layout& l, int g) {
  Box b = slab_box(t, stage_range(m, t, l, g));
  if (l.fsdp > 1 && split_axis(t.kind) == 1) b.dims[0] = fsdp_rows(t, l, g);
  return b;
}

std::optional<Box> shard_box(const ModelConfig& m, const Layout& l, int s, int g, const TensorInfo& t) {
  if (!stage_holds(m, l, s, t)) return std::nullopt;
  const Box b = held_box(m, t, l, g);
  if (b.empty()) return std::nullopt;
  return b;
}

}  // namespace nereus
