#pragma once
// An independent reading of sharding.md for tests: tensor list, shard boxes, packed
// buffers and the fill, written from the document without the library's sharding code.
// Only ModelConfig (parsed by the library, tested on its own) is shared.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nereus/core/fill.hpp"
#include "nereus/core/model.hpp"

namespace ref {

using Box = std::vector<std::pair<std::int64_t, std::int64_t>>;  // [lo, hi) per dim

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  char rule;  // 'v' vocab rows, 'q' heads rows, 'k' kv rows, 'o' heads cols, 'i' I rows, 'd' I cols, 'r' replicated,
              // 'x' expert Ie rows, 'y' expert Ie cols; MLA: 'Q' heads rows of width dn+dr, 'B' heads rows of
              // width dn+dv, 'O' heads cols of width dv; shared experts: 's' Es·Ie rows, 't' Es·Ie cols
  int layer;  // -1 outside layers
  char where; // 'e' embedding, 'l' layer, 'n' final norm, 'h' lm_head or score
  int expert = -1;
  bool f32 = false;  // param always float32 (the router's e_score_correction_bias)
};

inline bool deepseek(const nereus::ModelConfig& c) { return c.arch == nereus::Arch::deepseek_v3; }

/// sharding.md: a qwen3_moe layer l is sparse when l is not in mlp_only_layers and
/// (l + 1) mod decoder_sparse_step = 0; a DeepSeek-V3-style layer when l ≥
/// first_k_dense_replace and l mod moe_layer_freq = 0.
inline bool sparse(const nereus::ModelConfig& c, int l) {
  if (c.experts == 0) return false;
  if (deepseek(c)) return l >= c.first_dense && l % c.moe_layer_freq == 0;
  for (auto d : c.dense_layers)
    if (d == l) return false;
  return (l + 1) % c.sparse_step == 0;
}

/// The attention tensors of a DeepSeek-V3-style layer (sharding.md's MLA table).
inline void mla_attention(const nereus::ModelConfig& c, const std::string& p, int l, std::vector<Tensor>& out) {
  const std::int64_t H = c.hidden, nh = c.heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim;
  if (c.q_lora_rank > 0) {
    out.push_back({p + "self_attn.q_a_proj.weight", {c.q_lora_rank, H}, 'r', l, 'l'});
    out.push_back({p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}, 'r', l, 'l'});
    out.push_back({p + "self_attn.q_b_proj.weight", {nh * (dn + dr), c.q_lora_rank}, 'Q', l, 'l'});
  } else {
    out.push_back({p + "self_attn.q_proj.weight", {nh * (dn + dr), H}, 'Q', l, 'l'});
  }
  out.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + dr, H}, 'r', l, 'l'});
  out.push_back({p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, 'r', l, 'l'});
  out.push_back({p + "self_attn.kv_b_proj.weight", {nh * (dn + dv), c.kv_lora_rank}, 'B', l, 'l'});
  out.push_back({p + "self_attn.o_proj.weight", {H, nh * dv}, 'O', l, 'l'});
}

inline std::vector<Tensor> tensors(const nereus::ModelConfig& c) {
  std::vector<Tensor> out;
  const std::int64_t H = c.hidden, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab, H}, 'v', -1, 'e'});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {H}, 'r', l, 'l'});
    if (deepseek(c)) {
      mla_attention(c, p, l, out);
    } else {
    out.push_back({p + "self_attn.q_proj.weight", {q, H}, 'q', l, 'l'});
    out.push_back({p + "self_attn.k_proj.weight", {kv, H}, 'k', l, 'l'});
    out.push_back({p + "self_attn.v_proj.weight", {kv, H}, 'k', l, 'l'});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}, 'q', l, 'l'});
      out.push_back({p + "self_attn.k_proj.bias", {kv}, 'k', l, 'l'});
      out.push_back({p + "self_attn.v_proj.bias", {kv}, 'k', l, 'l'});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, 'r', l, 'l'});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, 'r', l, 'l'});
    }
    out.push_back({p + "self_attn.o_proj.weight", {H, q}, 'o', l, 'l'});
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}, 'r', l, 'l'});
    if (sparse(c, l)) {
      const std::int64_t Ie = c.expert_intermediate;
      out.push_back({p + "mlp.gate.weight", {c.experts, H}, 'r', l, 'l'});
      if (deepseek(c) && c.router_bias)
        out.push_back({p + "mlp.gate.e_score_correction_bias", {c.experts}, 'r', l, 'l', -1, true});
      if (deepseek(c) && c.shared_experts > 0) {
        const std::int64_t S = c.shared_experts * Ie;
        out.push_back({p + "mlp.shared_experts.gate_proj.weight", {S, H}, 's', l, 'l'});
        out.push_back({p + "mlp.shared_experts.up_proj.weight", {S, H}, 's', l, 'l'});
        out.push_back({p + "mlp.shared_experts.down_proj.weight", {H, S}, 't', l, 'l'});
      }
      for (int x = 0; x < c.experts; ++x) {
        const std::string e = p + "mlp.experts." + std::to_string(x) + ".";
        out.push_back({e + "gate_proj.weight", {Ie, H}, 'x', l, 'l', x});
        out.push_back({e + "up_proj.weight", {Ie, H}, 'x', l, 'l', x});
        out.push_back({e + "down_proj.weight", {H, Ie}, 'y', l, 'l', x});
      }
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate, H}, 'i', l, 'l'});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate, H}, 'i', l, 'l'});
    out.push_back({p + "mlp.down_proj.weight", {H, c.intermediate}, 'd', l, 'l'});
  }
  out.push_back({"model.norm.weight", {H}, 'r', -1, 'n'});
  // A score head (value and reward models) replaces lm_head: [num_labels, H], replicated.
  if (c.score_labels > 0) out.push_back({"score.weight", {c.score_labels, H}, 'r', -1, 'h'});
  else if (!c.tied_embeddings) out.push_back({"lm_head.weight", {c.vocab, H}, 'v', -1, 'h'});
  return out;
}

struct Layout {
  int tp = 1, pp = 1;
  std::vector<int> partition;
  bool fused = false;
  int ep = 1, etp = 0;  // etp: the expert TP degree; 0 when not given, which means tp
  int fsdp = 1;         // FSDP chunks of each TP box (dense models)
  bool megatron = false;  // Megatron-Core packing (dense models)
  int expert_tp() const { return etp > 0 ? etp : tp; }
};

/// Index in R of position (stage s, EP rank e, tensor rank r), written as g = e·tp + r;
/// with FSDP, position (s, f, r) written as g = f·tp + r is R[(s·fsdp + f)·tp + r].
inline std::size_t device_index(const Layout& l, int s, int g) {
  if (l.fsdp > 1) return static_cast<std::size_t>((s * l.fsdp + g / l.tp) * l.tp + g % l.tp);
  return static_cast<std::size_t>((s * l.ep) * l.tp + g);
}

inline std::pair<std::int64_t, std::int64_t> nth(std::int64_t n, std::int64_t k, std::int64_t i) {
  return {i * n / k, (i + 1) * n / k};
}

/// Layers of stage s, by walking the partition (or part(L, pp, s)).
inline std::pair<int, int> stage_layers(const nereus::ModelConfig& c, const Layout& l, int s) {
  if (l.partition.empty()) {
    auto [a, b] = nth(c.layers, l.pp, s);
    return {static_cast<int>(a), static_cast<int>(b)};
  }
  int a = 0;
  for (int i = 0; i < s; ++i) a += l.partition[i];
  return {a, a + l.partition[s]};
}

/// Shard of t at (stage s, in-stage GPU g = e·tp + r).
inline std::optional<Box> shard(const nereus::ModelConfig& c, const Tensor& t, const Layout& l, int s, int g) {
  const int r = g % l.tp;
  bool held = false;
  if (t.where == 'e') held = s == 0 || (c.tied_embeddings && s == l.pp - 1);
  else if (t.where == 'n' || t.where == 'h') held = s == l.pp - 1;
  else {
    auto [a, b] = stage_layers(c, l, s);
    held = a <= t.layer && t.layer < b;
  }
  if (held && t.expert >= 0) {
    // Expert group q = floor(g / etp) of tp·ep/etp groups holds experts part(E, groups, q).
    const auto mine = nth(c.experts, l.tp * l.ep / l.expert_tp(), g / l.expert_tp());
    held = mine.first <= t.expert && t.expert < mine.second;
  }
  if (!held) return std::nullopt;
  Box b;
  for (auto n : t.shape) b.push_back({0, n});
  std::pair<std::int64_t, std::int64_t> heads;
  switch (t.rule) {
    case 'v': b[0] = nth(c.vocab, l.tp, r); break;
    case 'i': b[0] = nth(c.intermediate, l.tp, r); break;
    case 'd': b[1] = nth(c.intermediate, l.tp, r); break;
    case 'x': b[0] = nth(c.expert_intermediate, l.expert_tp(), g % l.expert_tp()); break;
    case 'y': b[1] = nth(c.expert_intermediate, l.expert_tp(), g % l.expert_tp()); break;
    case 'q': heads = nth(c.heads, l.tp, r); b[0] = {heads.first * c.head_dim, heads.second * c.head_dim}; break;
    case 'o': heads = nth(c.heads, l.tp, r); b[1] = {heads.first * c.head_dim, heads.second * c.head_dim}; break;
    case 'Q': case 'B': case 'O': {
      // MLA: heads part(nh, tp, r), each w wide: dn+dr (queries), dn+dv (kv_b), dv (o's columns).
      const std::int64_t w = t.rule == 'Q' ? c.qk_nope_dim + c.qk_rope_dim : t.rule == 'B' ? c.qk_nope_dim + c.v_head_dim : c.v_head_dim;
      heads = nth(c.heads, l.tp, r);
      b[t.rule == 'O' ? 1 : 0] = {heads.first * w, heads.second * w};
      break;
    }
    case 's': b[0] = nth(c.shared_experts * c.expert_intermediate, l.tp, r); break;
    case 't': b[1] = nth(c.shared_experts * c.expert_intermediate, l.tp, r); break;
    case 'k':
      if (l.tp <= c.kv_heads) heads = nth(c.kv_heads, l.tp, r);
      else heads = {r * c.kv_heads / l.tp, r * c.kv_heads / l.tp + 1};
      b[0] = {heads.first * c.head_dim, heads.second * c.head_dim};
      break;
    default: break;
  }
  if (l.fsdp > 1) {
    // FSDP: the TP box's first dimension in F chunks as torch.chunk cuts it (chunk size
    // ⌈n/F⌉, the last ones short or empty); chunk f = g / tp.
    const std::int64_t n = b[0].second - b[0].first, size = (n + l.fsdp - 1) / l.fsdp, f = g / l.tp;
    const std::int64_t lo = std::min(f * size, n), hi = std::min((f + 1) * size, n);
    if (hi <= lo) return std::nullopt;
    b[0] = {b[0].first + lo, b[0].first + hi};
  }
  return b;
}

inline std::int64_t volume(const Box& b) {
  std::int64_t n = 1;
  for (auto [lo, hi] : b) n *= hi > lo ? hi - lo : 0;
  return n;
}

/// One local buffer: its parts (tensor index, shard box), stacked by rows in order.
struct Buffer {
  std::vector<std::pair<std::size_t, Box>> parts;
};

/// sharding.md, "Megatron packing": the Megatron-Core name of a Hugging Face tensor's
/// local buffer; `sparse`: its layer is a mixture-of-experts layer; `local`: for a routed
/// expert, its index among the experts of the device's group.
inline std::string megatron_name(const std::string& hf, bool sparse = false, int local = -1) {
  if (hf == "model.embed_tokens.weight") return "embedding.word_embeddings.weight";
  if (hf == "model.norm.weight") return "decoder.final_layernorm.weight";
  if (hf == "lm_head.weight") return "output_layer.weight";
  if (hf.rfind("model.layers.", 0) != 0) return hf;  // score.weight keeps its name
  const auto dot = hf.find('.', 13);
  const std::string p = "decoder.layers." + hf.substr(13, dot - 13) + ".", rest = hf.substr(dot + 1);
  if (local >= 0)  // mlp.experts.{x}.{gate,up,down}_proj.weight: SequentialMLP's local_experts
    return p + "mlp.experts.local_experts." + std::to_string(local) +
           (rest.find("down_proj") != std::string::npos ? ".linear_fc2.weight" : ".linear_fc1.weight");
  if (sparse && rest == "post_attention_layernorm.weight") return p + "pre_mlp_layernorm.weight";
  if (rest == "mlp.gate.weight") return p + "mlp.router.weight";
  const std::pair<const char*, const char*> names[] = {
      {"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"},
      {"self_attn.q_proj.weight", "self_attention.linear_qkv.weight"}, {"self_attn.k_proj.weight", "self_attention.linear_qkv.weight"},
      {"self_attn.v_proj.weight", "self_attention.linear_qkv.weight"}, {"self_attn.q_proj.bias", "self_attention.linear_qkv.bias"},
      {"self_attn.k_proj.bias", "self_attention.linear_qkv.bias"}, {"self_attn.v_proj.bias", "self_attention.linear_qkv.bias"},
      {"self_attn.q_norm.weight", "self_attention.q_layernorm.weight"}, {"self_attn.k_norm.weight", "self_attention.k_layernorm.weight"},
      {"self_attn.o_proj.weight", "self_attention.linear_proj.weight"},
      {"post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"},
      {"mlp.gate_proj.weight", "mlp.linear_fc1.weight"}, {"mlp.up_proj.weight", "mlp.linear_fc1.weight"},
      {"mlp.down_proj.weight", "mlp.linear_fc2.weight"}};
  for (auto [from, to] : names)
    if (rest == from) return p + to;
  return hf;
}

/// linear_qkv's parts [q; k; v] (whole local shards, in that order) as Megatron stores
/// them: for each local query group, its q heads' rows, then its k rows, then its v rows.
inline std::vector<std::pair<std::size_t, Box>> interleave_groups(const nereus::ModelConfig& c, const std::vector<Tensor>& ts,
                                                                  const std::vector<std::pair<std::size_t, Box>>& qkv) {
  auto find = [&](const char* what) {
    for (const auto& p : qkv)
      if (ts[p.first].name.find(what) != std::string::npos) return p;
    return qkv.front();
  };
  const auto q = find("q_proj"), k = find("k_proj"), v = find("v_proj");
  const std::int64_t qrows = c.heads / c.kv_heads * c.head_dim, kvrows = c.head_dim;
  const std::int64_t groups = (k.second[0].second - k.second[0].first) / kvrows;
  std::vector<std::pair<std::size_t, Box>> out;
  for (std::int64_t g = 0; g < groups; ++g)
    for (const auto& [part, rows] : {std::pair{q, qrows}, std::pair{k, kvrows}, std::pair{v, kvrows}}) {
      Box b = part.second;
      b[0] = {part.second[0].first + g * rows, part.second[0].first + (g + 1) * rows};
      out.push_back({part.first, b});
    }
  return out;
}

/// Buffers of position (s, g), keyed by buffer name. Fused experts stack in expert order:
/// w13 = per expert [gate; up], w2 = per expert down (the tensor list's order).
inline std::map<std::string, Buffer> buffers(const nereus::ModelConfig& c, const std::vector<Tensor>& ts,
                                             const Layout& l, int s, int g) {
  std::map<std::string, Buffer> out;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    auto b = shard(c, ts[i], l, s, g);
    if (!b) continue;
    std::string name = ts[i].name;
    if (l.fused && ts[i].expert >= 0) {
      const auto at = name.find(".experts.");
      name = name.substr(0, at) + (ts[i].rule == 'y' ? ".experts.w2_weight" : ".experts.w13_weight");
    } else if (l.fused && deepseek(c)) {
      // vLLM's DeepSeek: [q_a_proj; kv_a_proj_with_mqa] when q is compressed, and the
      // shared experts' [gate; up]; q_b_proj (or q_proj), kv_b_proj and o_proj as they are.
      const std::pair<const char*, const char*> fused_names[] = {
          {".q_a_proj.", ".fused_qkv_a_proj."}, {".kv_a_proj_with_mqa.", ".fused_qkv_a_proj."},
          {".shared_experts.gate_proj.", ".shared_experts.gate_up_proj."}, {".shared_experts.up_proj.", ".shared_experts.gate_up_proj."},
          {".mlp.gate_proj.", ".mlp.gate_up_proj."}, {".mlp.up_proj.", ".mlp.gate_up_proj."}};
      for (auto [from, to] : fused_names) {
        const auto pos = name.find(from);
        if (pos == std::string::npos || (c.q_lora_rank == 0 && std::strstr(from, "kv_a"))) continue;
        name = name.substr(0, pos) + to + name.substr(pos + std::strlen(from));
        break;
      }
    } else if (l.fused) {
      const std::pair<const char*, const char*> fused_names[] = {
          {".q_proj.", ".qkv_proj."}, {".k_proj.", ".qkv_proj."}, {".v_proj.", ".qkv_proj."},
          {".gate_proj.", ".gate_up_proj."}, {".up_proj.", ".gate_up_proj."}};
      for (auto [from, to] : fused_names) {
        const auto pos = name.find(from);
        if (pos == std::string::npos) continue;
        name = name.substr(0, pos) + to + name.substr(pos + std::strlen(from));
        break;
      }
    }
    if (l.megatron) {
      const int local = ts[i].expert < 0 ? -1
                                         : ts[i].expert - static_cast<int>(nth(c.experts, l.tp * l.ep / l.expert_tp(), g / l.expert_tp()).first);
      name = megatron_name(name, ts[i].layer >= 0 && sparse(c, ts[i].layer), local);
    }
    out[name].parts.push_back({i, *b});
  }
  if (l.megatron)
    for (auto& [name, buf] : out)
      if (name.find("linear_qkv.weight") != std::string::npos || name.find("linear_qkv.bias") != std::string::npos)
        buf.parts = interleave_groups(c, ts, buf.parts);
  return out;
}

/// sharding.md, FP8: a `dtype=fp8` unit quantizes each 2-D `*_proj.weight` inside a decoder
/// layer (q_a_proj and kv_a_proj_with_mqa included; never the router `mlp.gate.weight`).
inline bool quantized(const Tensor& t) {
  const std::string& n = t.name;
  const std::string w = ".weight";
  return t.layer >= 0 && t.shape.size() == 2 && n.find("_proj") != std::string::npos &&
         n.size() > w.size() && n.compare(n.size() - w.size(), w.size(), w) == 0;
}

/// FP8 block (i, j) of a weight covers rows [i·bo, (i+1)·bo) and columns [j·bi, (j+1)·bi),
/// cut at the edges: the blocks a box touches, per dimension [first, last + 1).
inline Box block_span(const nereus::ModelConfig& c, const Box& b) {
  Box out;
  for (std::size_t d = 0; d < b.size(); ++d) {
    const std::int64_t n = c.fp8_block[d];
    out.push_back({b[d].first / n, (b[d].second + n - 1) / n});
  }
  return out;
}

/// Whether every boundary of a shard box falls on a block boundary or the tensor's end.
inline bool block_aligned(const nereus::ModelConfig& c, const Tensor& t, const Box& b) {
  for (std::size_t d = 0; d < b.size(); ++d)
    for (std::int64_t x : {b[d].first, b[d].second})
      if (x % c.fp8_block[d] != 0 && x != t.shape[d]) return false;
  return true;
}

/// Global row-major index of element (i, j) / (i) of a tensor.
inline std::uint64_t global_index(const Tensor& t, std::int64_t i, std::int64_t j) {
  return t.shape.size() == 1 ? static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i * t.shape[1] + j);
}

}  // namespace ref
