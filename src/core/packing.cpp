#include "nereus/core/packing.hpp"

#include "nereus/core/sharding.hpp"

namespace nereus {

namespace {

using K = TensorKind;

/// Fused groups: the kinds stacked by rows into one buffer, in order.
std::vector<K> fused_group(const ModelConfig& c, K kind) {
  switch (kind) {
    case K::q: case K::k: case K::v: return {K::q, K::k, K::v};
    case K::q_bias: case K::k_bias: case K::v_bias:
      return c.qkv_bias ? std::vector<K>{K::q_bias, K::k_bias, K::v_bias} : std::vector<K>{};
    case K::gate: case K::up: return {K::gate, K::up};
    default: return {};
  }
}

}  // namespace

ShardPlace place_shard(const ModelSpec& m, TensorId t, const Layout& layout, int r) {
  const TensorInfo& info = m.tensor(t);
  const Box shard = slab_box(info, tp_range(m.config(), info, layout.tp, r));
  if (layout.packing == Packing::hf) return {t, 0, shard};
  const auto group = fused_group(m.config(), info.kind);
  if (group.empty()) return {t, 0, shard};
  std::int64_t base = 0;
  TensorId first = t;
  for (std::size_t i = 0; i < group.size(); ++i) {
    const TensorId part_id = *m.find(group[i], info.layer);
    if (i == 0) first = part_id;
    if (group[i] == info.kind) break;
    const TensorInfo& p = m.tensor(part_id);
    base += slab_box(p, tp_range(m.config(), p, layout.tp, r)).elements();
  }
  return {first, base, shard};
}

bool shares_buffer(const ModelConfig& m, TensorKind kind, Packing packing) {
  return packing == Packing::fused && !fused_group(m, kind).empty();
}

std::string buffer_name(const ModelSpec& m, TensorId buffer, Packing packing) {
  const TensorInfo& info = m.tensor(buffer);
  if (packing == Packing::fused && !fused_group(m.config(), info.kind).empty()) {
    const std::string p = "model.layers." + std::to_string(info.layer) + ".";
    switch (info.kind) {
      case K::q: return p + "self_attn.qkv_proj.weight";
      case K::q_bias: return p + "self_attn.qkv_proj.bias";
      case K::gate: return p + "mlp.gate_up_proj.weight";
      default: break;
    }
  }
  return info.name;
}

}  // namespace nereus
