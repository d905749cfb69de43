#include "nereus/core/packing.hpp"

#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/sharding.hpp"

namespace nereus {

namespace {

using K = TensorKind;

/// Fused groups: the kinds stacked by rows into one buffer, in order.
std::vector<K> fused_group(const ModelConfig& c, K kind) {
  switch (kind) {
    case K::q: case K::k: case K::v:
      return c.mla() ? std::vector<K>{} : std::vector<K>{K::q, K::k, K::v};  // MLA's q_b/q_proj stands alone
    case K::q_a: case K::kv_a:  // vLLM's fused_qkv_a_proj: both latents' down-projections, replicated
      return c.q_lora_rank > 0 ? std::vector<K>{K::q_a, K::kv_a} : std::vector<K>{};
    case K::shared_gate: case K::shared_up: return {K::shared_gate, K::shared_up};
    case K::q_bias: case K::k_bias: case K::v_bias:
      return c.qkv_bias ? std::vector<K>{K::q_bias, K::k_bias, K::v_bias} : std::vector<K>{};
    case K::gate: case K::up: return {K::gate, K::up};
    default: return {};
  }
}

}  // namespace

namespace {

/// Where t's shard sits in its buffer, measured by `measure` (a weight box → the box the
/// buffer stores of it): elements for the shards themselves, block scales for the scale
/// buffers of FP8 units, which stack their parts in the same order.
template <class Measure>
ShardPlace place(const ModelSpec& m, TensorId t, const Layout& layout, int g, Measure measure) {
  const TensorInfo& info = m.tensor(t);
  const Box shard = held_box(m.config(), info, layout, g);
  if (layout.packing == Packing::hf) return {t, 0, measure(shard)};
  if (is_expert(info.kind) && layout.packing == Packing::megatron) {
    // Megatron's SequentialMLP: a buffer per local expert, linear_fc1 = [gate rows; up
    // rows] (named by the expert's gate), linear_fc2 its down.
    if (info.kind == K::expert_down) return {t, 0, measure(shard)};
    const TensorId gate = *m.find(K::expert_gate, info.layer, info.expert);
    return {gate, info.kind == K::expert_up ? measure(shard).elements() : 0, measure(shard)};
  }
  if (is_expert(info.kind)) {
    // vLLM's stacked experts: w13 = per local expert [gate rows; up rows], w2 = per local
    // expert [H, local Ie]; both named by the first local expert's gate or down.
    const std::int64_t first = group_experts(m.config(), layout, expert_group(layout, g).group).lo;
    const std::int64_t j = info.expert - first;
    const std::int64_t block = measure(shard).elements();  // one local gate, up or down
    const bool down = info.kind == K::expert_down;
    const TensorId lead = *m.find(down ? K::expert_down : K::expert_gate, info.layer, static_cast<std::int32_t>(first));
    const std::int64_t base = down ? j * block : j * 2 * block + (info.kind == K::expert_up ? block : 0);
    return {lead, base, measure(shard)};
  }
  const auto group = fused_group(m.config(), info.kind);
  if (group.empty()) return {t, 0, measure(shard)};
  if (const std::int64_t rows = interleave_rows(m.config(), info.kind, layout.packing); rows > 0) {
    // Megatron's linear_qkv: per local query group g, [q rows of g's heads; k rows of g;
    // v rows of g]. A rank holds whole groups (tp ≤ nkv), nkv/tp of them.
    const ModelConfig& c = m.config();
    const std::int64_t cols = info.rank == 2 ? info.shape[1] : 1, hd = c.head_dim, qpg = c.heads / c.kv_heads;
    const std::int64_t at = info.kind == K::q || info.kind == K::q_bias ? 0 : info.kind == K::k || info.kind == K::k_bias ? qpg * hd : (qpg + 1) * hd;
    ShardPlace p{*m.find(group[0], info.layer), at * cols, measure(shard)};
    p.groups = static_cast<int>(shard.dims[0].size() / rows);
    p.group_stride = (qpg + 2) * hd * cols;
    return p;
  }
  std::int64_t base = 0;
  TensorId first = t;
  for (std::size_t i = 0; i < group.size(); ++i) {
    const TensorId part_id = *m.find(group[i], info.layer);
    if (i == 0) first = part_id;
    if (group[i] == info.kind) break;
    const TensorInfo& p = m.tensor(part_id);
    base += measure(held_box(m.config(), p, layout, g)).elements();  // empty where an FSDP chunk is
  }
  return {first, base, measure(shard)};
}

}  // namespace

ShardPlace place_shard(const ModelSpec& m, TensorId t, const Layout& layout, int g) {
  return place(m, t, layout, g, [](const Box& b) { return b; });
}

ShardPlace place_scale(const ModelSpec& m, TensorId t, const Layout& layout, int g) {
  return place(m, t, layout, g, [&](const Box& b) { return fp8_scale_box(m.config(), b); });
}

bool shares_buffer(const ModelConfig& m, TensorKind kind, Packing packing) {
  return packing != Packing::hf && (is_expert(kind) || !fused_group(m, kind).empty());
}

std::int64_t interleave_rows(const ModelConfig& m, TensorKind kind, Packing packing) {
  if (packing != Packing::megatron) return 0;
  switch (kind) {
    case K::q: case K::q_bias: return m.heads / m.kv_heads * m.head_dim;
    case K::k: case K::k_bias: case K::v: case K::v_bias: return m.head_dim;
    default: return 0;
  }
}

Box ShardPlace::block(int j) const {
  Box b = shard;
  if (groups > 1) {
    const std::int64_t rows = shard.dims[0].size() / groups;
    b.dims[0] = {shard.dims[0].lo + j * rows, shard.dims[0].lo + (j + 1) * rows};
  }
  return b;
}

LocalView ShardPlace::view(const Box& b) const {
  if (groups == 1) return local_view(b, shard, base);
  const int j = static_cast<int>((b.dims[0].lo - shard.dims[0].lo) / (shard.dims[0].size() / groups));
  return local_view(b, block(j), block_base(j));
}

namespace {

/// Megatron-Core's name of the buffer that starts with `buffer` (sharding.md, "Megatron
/// packing"); a score head keeps its Hugging Face name.
std::string megatron_name(const TensorInfo& info, bool sparse) {
  const std::string p = "decoder.layers." + std::to_string(info.layer) + ".";
  switch (info.kind) {
    case K::embed: return "embedding.word_embeddings.weight";
    case K::final_norm: return "decoder.final_layernorm.weight";
    case K::lm_head: return "output_layer.weight";
    case K::input_norm: return p + "self_attention.linear_qkv.layer_norm_weight";
    case K::q: return p + "self_attention.linear_qkv.weight";
    case K::q_bias: return p + "self_attention.linear_qkv.bias";
    case K::q_norm: return p + "self_attention.q_layernorm.weight";
    case K::k_norm: return p + "self_attention.k_layernorm.weight";
    case K::o: return p + "self_attention.linear_proj.weight";
    case K::post_norm: return p + (sparse ? "pre_mlp_layernorm.weight" : "mlp.linear_fc1.layer_norm_weight");
    case K::router: return p + "mlp.router.weight";
    case K::gate: return p + "mlp.linear_fc1.weight";
    case K::down: return p + "mlp.linear_fc2.weight";
    default: return info.name;
  }
}

}  // namespace

std::string buffer_name(const ModelSpec& m, TensorId buffer, Packing packing, int expert_groups) {
  const TensorInfo& info = m.tensor(buffer);
  if (packing == Packing::megatron) {
    if (!is_expert(info.kind)) return megatron_name(info, info.layer >= 0 && m.config().sparse_layer(info.layer));
    int q = 0;  // the expert group holding it: experts part(E, groups, q)
    while (q + 1 < expert_groups && part(m.config().experts, expert_groups, q + 1).lo <= info.expert) ++q;
    const std::string p = "decoder.layers." + std::to_string(info.layer) + ".mlp.experts.local_experts." +
                          std::to_string(info.expert - part(m.config().experts, expert_groups, q).lo) + ".";
    return p + (info.kind == K::expert_down ? "linear_fc2.weight" : "linear_fc1.weight");
  }
  if (packing == Packing::fused && shares_buffer(m.config(), info.kind, packing)) {
    const std::string p = "model.layers." + std::to_string(info.layer) + ".";
    switch (info.kind) {
      case K::expert_gate: return p + "mlp.experts.w13_weight";
      case K::expert_down: return p + "mlp.experts.w2_weight";
      case K::q: return p + "self_attn.qkv_proj.weight";
      case K::q_bias: return p + "self_attn.qkv_proj.bias";
      case K::gate: return p + "mlp.gate_up_proj.weight";
      case K::q_a: return p + "self_attn.fused_qkv_a_proj.weight";
      case K::shared_gate: return p + "mlp.shared_experts.gate_up_proj.weight";
      default: break;
    }
  }
  return info.name;
}

std::string scale_buffer_name(const ModelSpec& m, TensorId buffer, Packing packing) {
  std::string name = buffer_name(m, buffer, packing);
  if (name.ends_with("weight")) name += "_scale_inv";  // q_proj.weight_scale_inv, w13_weight_scale_inv
  return name;
}

}  // namespace nereus
