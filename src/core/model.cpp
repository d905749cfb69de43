#include "nereus/core/model.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "json_fields.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

using detail::json;

std::string_view to_string(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
    case Arch::qwen3_moe: return "qwen3_moe";
    case Arch::deepseek_v3: return "deepseek_v3";
  }
  return "?";
}

namespace {

/// The architecture, and whether `architectures` names a score-head class.
struct ArchClass {
  Arch arch;
  bool score = false;
};

ArchClass parse_arch(const json& j, std::string_view origin) {
  static constexpr std::pair<const char*, Arch> kFamilies[] = {{"Llama", Arch::llama}, {"Qwen2", Arch::qwen2}, {"Qwen3", Arch::qwen3},
                                                                      {"Qwen3Moe", Arch::qwen3_moe}, {"DeepseekV3", Arch::deepseek_v3}};
  static constexpr const char* kHeads[] = {"ForCausalLM", "ForTokenClassification", "ForSequenceClassification"};
  std::optional<ArchClass> from_class;
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    const std::string cls = (*a)[0].get<std::string>();
    for (const auto& [family, arch] : kFamilies)
      for (const char* head : kHeads)
        if (cls == std::string(family) + head) from_class = ArchClass{arch, head != kHeads[0]};
    if (!from_class)
      throw Error(std::string(origin) + ": unknown architecture '" + cls +
                  "' (supported: Llama, Qwen2, Qwen3, Qwen3Moe and DeepseekV3 with ForCausalLM, ForTokenClassification "
                  "or ForSequenceClassification)");
  }
  std::string type;
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw Error(std::string(origin) + ": field 'model_type' must be a string");
    type = it->get<std::string>();
  } else if (from_class) {
    return *from_class;
  } else {
    throw Error(std::string(origin) + ": missing required field 'model_type' (or 'architectures')");
  }
  Arch arch;
  if (type == "llama") arch = Arch::llama;
  else if (type == "qwen2") arch = Arch::qwen2;
  else if (type == "qwen3") arch = Arch::qwen3;
  else if (type == "qwen3_moe") arch = Arch::qwen3_moe;
  else if (type == "deepseek_v3" || type == "kimi_k2") arch = Arch::deepseek_v3;
  else
    throw Error(std::string(origin) + ": unknown architecture '" + type +
                "' in 'model_type' (supported: llama, qwen2, qwen3, qwen3_moe, deepseek_v3, kimi_k2)");
  return {arch, from_class && from_class->score};
}

/// num_labels, or the length of id2label; 1 when neither is given.
std::int64_t parse_labels(const json& j, std::string_view origin) {
  if (j.contains("num_labels") && !j["num_labels"].is_null()) {
    const std::int64_t n = detail::integer_field(j, "num_labels", origin);
    if (n < 1) throw Error(std::string(origin) + ": field 'num_labels' must be at least 1");
    return n;
  }
  if (auto it = j.find("id2label"); it != j.end() && it->is_object() && !it->empty())
    return static_cast<std::int64_t>(it->size());
  return 1;
}

DType parse_dtype(const json& j, std::string_view origin) {
  const char* key = j.contains("torch_dtype") ? "torch_dtype" : "dtype";
  if (!j.contains(key)) key = "torch_dtype";  // name the classic field in the error
  const std::string s = detail::string_field(j, key, origin);
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  if (s == "float32") return DType::f32;
  throw Error(std::string(origin) + ": field '" + key + "' has unsupported dtype '" + s +
              "' (supported: bfloat16, float16, float32)");
}

/// The routed experts' fields; `count` names the number of experts (num_experts in
/// qwen3_moe, n_routed_experts in deepseek_v3).
void parse_experts(const json& j, ModelConfig& c, const char* count, std::string_view origin) {
  c.experts = detail::integer_field(j, count, origin);
  c.experts_per_token = detail::integer_field(j, "num_experts_per_tok", origin);
  c.expert_intermediate = detail::integer_field(j, "moe_intermediate_size", origin);
  if (c.experts_per_token > c.experts)
    throw Error(std::string(origin) + ": field 'num_experts_per_tok' (" + std::to_string(c.experts_per_token) +
                ") exceeds " + count + " (" + std::to_string(c.experts) + ")");
}

/// The sparse-layer fields of qwen3_moe (sharding.md, "Mixture-of-experts models").
void parse_moe(const json& j, ModelConfig& c, std::string_view origin) {
  parse_experts(j, c, "num_experts", origin);
  if (j.contains("decoder_sparse_step") && !j["decoder_sparse_step"].is_null())
    c.sparse_step = detail::integer_field(j, "decoder_sparse_step", origin);
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      throw Error(std::string(origin) + ": field 'mlp_only_layers' must be a list of layer indices, got " + it->dump());
    for (const json& v : *it) {
      const std::int64_t l = detail::integer(v, "mlp_only_layers", origin, true);
      if (l >= c.layers)
        throw Error(std::string(origin) + ": field 'mlp_only_layers' names layer " + std::to_string(l) +
                    " but num_hidden_layers is " + std::to_string(c.layers));
      c.dense_layers.push_back(l);
    }
    std::sort(c.dense_layers.begin(), c.dense_layers.end());
    c.dense_layers.erase(std::unique(c.dense_layers.begin(), c.dense_layers.end()), c.dense_layers.end());
  }
}

/// An optional integer field: `fallback` when absent or null.
std::int64_t integer_or(const json& j, const char* key, std::int64_t fallback, std::string_view origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return detail::integer_field(j, key, origin);
}

/// MLA and DeepSeek's sparse layers (sharding.md, "DeepSeek-V3-style models").
void parse_mla(const json& j, ModelConfig& c, std::string_view origin) {
  if (detail::bool_field(j, "attention_bias", false, origin))
    throw Error(std::string(origin) + ": field 'attention_bias' is true; DeepSeek-V3-style attention biases are not modelled yet");
  c.q_lora_rank = integer_or(j, "q_lora_rank", 0, origin);
  c.kv_lora_rank = detail::integer_field(j, "kv_lora_rank", origin);
  c.qk_nope_dim = detail::integer_field(j, "qk_nope_head_dim", origin);
  c.qk_rope_dim = detail::integer_field(j, "qk_rope_head_dim", origin);
  c.v_head_dim = detail::integer_field(j, "v_head_dim", origin);
  c.head_dim = c.qk_nope_dim + c.qk_rope_dim;
  c.kv_heads = c.heads;  // MLA: every head has its own keys and values, decompressed from the latent
  parse_experts(j, c, "n_routed_experts", origin);
  c.shared_experts = integer_or(j, "n_shared_experts", 0, origin);
  c.first_dense = integer_or(j, "first_k_dense_replace", 0, origin);
  c.moe_layer_freq = integer_or(j, "moe_layer_freq", 1, origin);
  if (c.moe_layer_freq < 1) throw Error(std::string(origin) + ": field 'moe_layer_freq' must be at least 1");
  if (auto it = j.find("topk_method"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw Error(std::string(origin) + ": field 'topk_method' must be a string");
    c.router_bias = it->get<std::string>() == "noaux_tc";
  }
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    if (!q->is_object()) throw Error(std::string(origin) + ": field 'quantization_config' must be an object");
    if (q->contains("scale_fmt") && !(*q)["scale_fmt"].is_null())
      throw Error(std::string(origin) + ": field 'quantization_config.scale_fmt' (" + (*q)["scale_fmt"].dump() +
                  ") is not supported yet: FP8 scales are plain float32 (sharding.md)");
    if (auto b = q->find("weight_block_size"); b != q->end() && !b->is_null()) {
      if (!b->is_array() || b->size() != 2)
        throw Error(std::string(origin) + ": field 'quantization_config.weight_block_size' must be [rows, columns], got " + b->dump());
      for (std::size_t i = 0; i < 2; ++i)
        c.fp8_block[i] = detail::integer((*b)[i], "quantization_config.weight_block_size", origin, false);
    }
  }
}

}  // namespace

bool ModelConfig::sparse_layer(std::int64_t l) const {
  if (!moe()) return false;
  if (mla()) return l >= first_dense && l % moe_layer_freq == 0;
  return (l + 1) % sparse_step == 0 && !std::binary_search(dense_layers.begin(), dense_layers.end(), l);
}

std::int64_t ModelConfig::sparse_layers() const {
  std::int64_t n = 0;
  for (std::int64_t l = 0; l < layers; ++l) n += sparse_layer(l);
  return n;
}

ModelConfig parse_model_config(std::string_view json_text, std::string_view origin) {
  const json top = detail::parse_json(json_text, origin);
  if (!top.is_object()) throw Error(std::string(origin) + ": expected a JSON object");
  // A multimodal wrapper (Kimi's) keeps the language model's fields under text_config.
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& j = nested ? top["text_config"] : top;
  ModelConfig c;
  const ArchClass ac = parse_arch(nested && !j.contains("architectures") && !j.contains("model_type") ? top : j, origin);
  c.arch = ac.arch;
  c.hidden = detail::integer_field(j, "hidden_size", origin);
  c.intermediate = detail::integer_field(j, "intermediate_size", origin);
  c.layers = detail::integer_field(j, "num_hidden_layers", origin);
  c.heads = detail::integer_field(j, "num_attention_heads", origin);
  c.vocab = detail::integer_field(j, "vocab_size", origin);
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? detail::integer_field(j, "num_key_value_heads", origin)
                   : c.heads;
  if (c.arch == Arch::deepseek_v3) {
    // MLA's head widths come from its own fields (parse_mla).
  } else if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = detail::integer_field(j, "head_dim", origin);
  } else {
    if (c.hidden % c.heads != 0)
      throw Error(std::string(origin) + ": 'head_dim' is absent and hidden_size " +
                  std::to_string(c.hidden) + " is not a multiple of num_attention_heads " +
                  std::to_string(c.heads));
    c.head_dim = c.hidden / c.heads;
  }
  if (c.kv_heads > c.heads || c.heads % c.kv_heads != 0)
    throw Error(std::string(origin) + ": num_key_value_heads " + std::to_string(c.kv_heads) +
                " must divide num_attention_heads " + std::to_string(c.heads));
  // A score head never ties (it has no lm_head to tie).
  c.tied_embeddings = !ac.score && detail::bool_field(j, "tie_word_embeddings", false, origin);
  c.score_labels = ac.score ? parse_labels(j, origin) : 0;
  c.qkv_bias = c.arch == Arch::qwen2 ||
               (c.arch == Arch::llama && detail::bool_field(j, "attention_bias", false, origin));
  c.qkv_bias = c.qkv_bias || (c.arch == Arch::qwen3_moe && detail::bool_field(j, "attention_bias", false, origin)) ||
               (c.arch == Arch::qwen3 && detail::bool_field(j, "attention_bias", false, origin));
  c.qk_norm = c.arch == Arch::qwen3 || c.arch == Arch::qwen3_moe;
  c.dtype = parse_dtype(j, origin);
  if (c.arch == Arch::qwen3_moe) parse_moe(j, c, origin);
  if (c.arch == Arch::deepseek_v3) parse_mla(j, c, origin);
  return c;
}

ModelSpec::ModelSpec(std::string name, ModelConfig config)
    : name_(std::move(name)), config_(config) {
  const auto& c = config_;
  const std::int64_t H = c.hidden, q_rows = c.heads * c.head_dim, kv_rows = c.kv_heads * c.head_dim;
  using K = TensorKind;
  auto add = [&](std::string n, TensorKind k, std::int32_t layer, int rank, std::int64_t a, std::int64_t b,
                 std::int32_t expert = -1) {
    by_name_.emplace(n, static_cast<TensorId>(tensors_.size()));
    const DType dt = k == K::router_bias ? DType::f32 : c.dtype;  // sharding.md: the router's bias is always float32
    tensors_.push_back({std::move(n), k, layer, rank, {a, rank == 2 ? b : 0}, expert, dt});
  };
  std::vector<K> attention = {K::input_norm};
  if (c.mla()) {
    if (c.q_lora_rank > 0) attention.insert(attention.end(), {K::q_a, K::q_a_norm});
    attention.insert(attention.end(), {K::q, K::kv_a, K::kv_a_norm, K::kv_b});
  } else {
    attention.push_back(K::q);
    if (c.qkv_bias) attention.push_back(K::q_bias);
    attention.push_back(K::k);
    if (c.qkv_bias) attention.push_back(K::k_bias);
    attention.push_back(K::v);
    if (c.qkv_bias) attention.push_back(K::v_bias);
    if (c.qk_norm) attention.insert(attention.end(), {K::q_norm, K::k_norm});
  }
  attention.insert(attention.end(), {K::o, K::post_norm});
  layer_kinds_ = attention;
  layer_kinds_.insert(layer_kinds_.end(), {K::gate, K::up, K::down});
  kind_slot_.fill(-1);
  sparse_slot_.fill(-1);
  for (std::size_t i = 0; i < layer_kinds_.size(); ++i)
    kind_slot_[static_cast<int>(layer_kinds_[i])] = static_cast<std::int32_t>(i);
  if (c.moe()) {
    sparse_kinds_ = attention;
    sparse_kinds_.push_back(K::router);
    if (c.router_bias) sparse_kinds_.push_back(K::router_bias);
    if (c.shared_experts > 0) sparse_kinds_.insert(sparse_kinds_.end(), {K::shared_gate, K::shared_up, K::shared_down});
    sparse_kinds_.insert(sparse_kinds_.end(), {K::expert_gate, K::expert_up, K::expert_down});
    for (std::size_t i = 0; i < sparse_kinds_.size(); ++i)
      sparse_slot_[static_cast<int>(sparse_kinds_[i])] = static_cast<std::int32_t>(i);
  }

  add("model.embed_tokens.weight", K::embed, -1, 2, c.vocab, H);
  for (std::int32_t l = 0; l < c.layers; ++l) {
    layer_start_.push_back(static_cast<TensorId>(tensors_.size()));
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool sparse = c.sparse_layer(l);
    for (K k : sparse ? sparse_kinds_ : layer_kinds_) {
      switch (k) {
        case K::input_norm: add(p + "input_layernorm.weight", k, l, 1, H, 0); break;
        case K::q:  // with MLA: q_b_proj from the q latent, or q_proj when q is not compressed
          if (c.mla() && c.q_lora_rank > 0) add(p + "self_attn.q_b_proj.weight", k, l, 2, q_rows, c.q_lora_rank);
          else add(p + "self_attn.q_proj.weight", k, l, 2, q_rows, H);
          break;
        case K::q_a: add(p + "self_attn.q_a_proj.weight", k, l, 2, c.q_lora_rank, H); break;
        case K::q_a_norm: add(p + "self_attn.q_a_layernorm.weight", k, l, 1, c.q_lora_rank, 0); break;
        case K::kv_a: add(p + "self_attn.kv_a_proj_with_mqa.weight", k, l, 2, c.kv_lora_rank + c.qk_rope_dim, H); break;
        case K::kv_a_norm: add(p + "self_attn.kv_a_layernorm.weight", k, l, 1, c.kv_lora_rank, 0); break;
        case K::kv_b: add(p + "self_attn.kv_b_proj.weight", k, l, 2, c.heads * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank); break;
        case K::q_bias: add(p + "self_attn.q_proj.bias", k, l, 1, q_rows, 0); break;
        case K::k: add(p + "self_attn.k_proj.weight", k, l, 2, kv_rows, H); break;
        case K::k_bias: add(p + "self_attn.k_proj.bias", k, l, 1, kv_rows, 0); break;
        case K::v: add(p + "self_attn.v_proj.weight", k, l, 2, kv_rows, H); break;
        case K::v_bias: add(p + "self_attn.v_proj.bias", k, l, 1, kv_rows, 0); break;
        case K::q_norm: add(p + "self_attn.q_norm.weight", k, l, 1, c.head_dim, 0); break;
        case K::k_norm: add(p + "self_attn.k_norm.weight", k, l, 1, c.head_dim, 0); break;
        case K::o: add(p + "self_attn.o_proj.weight", k, l, 2, H, c.heads * c.o_head_width()); break;
        case K::post_norm: add(p + "post_attention_layernorm.weight", k, l, 1, H, 0); break;
        case K::gate: add(p + "mlp.gate_proj.weight", k, l, 2, c.intermediate, H); break;
        case K::up: add(p + "mlp.up_proj.weight", k, l, 2, c.intermediate, H); break;
        case K::down: add(p + "mlp.down_proj.weight", k, l, 2, H, c.intermediate); break;
        case K::router: add(p + "mlp.gate.weight", k, l, 2, c.experts, H); break;
        case K::router_bias: add(p + "mlp.gate.e_score_correction_bias", k, l, 1, c.experts, 0); break;
        case K::shared_gate: add(p + "mlp.shared_experts.gate_proj.weight", k, l, 2, c.shared_experts * c.expert_intermediate, H); break;
        case K::shared_up: add(p + "mlp.shared_experts.up_proj.weight", k, l, 2, c.shared_experts * c.expert_intermediate, H); break;
        case K::shared_down: add(p + "mlp.shared_experts.down_proj.weight", k, l, 2, H, c.shared_experts * c.expert_intermediate); break;
        case K::expert_gate:  // the three expert kinds: every expert's gate, up, down in turn
          for (std::int32_t x = 0; x < c.experts; ++x) {
            const std::string e = p + "mlp.experts." + std::to_string(x) + ".";
            add(e + "gate_proj.weight", K::expert_gate, l, 2, c.expert_intermediate, H, x);
            add(e + "up_proj.weight", K::expert_up, l, 2, c.expert_intermediate, H, x);
            add(e + "down_proj.weight", K::expert_down, l, 2, H, c.expert_intermediate, x);
          }
          break;
        default: break;
      }
    }
  }
  layer_start_.push_back(static_cast<TensorId>(tensors_.size()));
  add("model.norm.weight", K::final_norm, -1, 1, H, 0);
  if (c.score_labels > 0) add("score.weight", K::score, -1, 2, c.score_labels, H);
  else if (!c.tied_embeddings) add("lm_head.weight", K::lm_head, -1, 2, c.vocab, H);
}

std::optional<TensorId> ModelSpec::find(TensorKind kind, std::int32_t layer, std::int32_t expert) const {
  const TensorId norm = layer_start_.back();
  switch (kind) {
    case TensorKind::embed: return 0;
    case TensorKind::final_norm: return norm;
    case TensorKind::lm_head:
      if (config_.tied_embeddings || config_.score_labels > 0) return std::nullopt;
      return norm + 1;
    case TensorKind::score:
      if (config_.score_labels == 0) return std::nullopt;
      return norm + 1;
    default: break;
  }
  if (layer < 0 || layer >= config_.layers) return std::nullopt;
  const bool sparse = config_.sparse_layer(layer);
  const std::int32_t slot = (sparse ? sparse_slot_ : kind_slot_)[static_cast<int>(kind)];
  if (slot < 0) return std::nullopt;
  const TensorId first = layer_start_[static_cast<std::size_t>(layer)];
  if (!is_expert(kind)) return first + static_cast<TensorId>(slot);
  if (expert < 0 || expert >= config_.experts) return std::nullopt;
  // Experts are listed gate, up, down per expert from the expert_gate slot on.
  const int offset = static_cast<int>(kind) - static_cast<int>(TensorKind::expert_gate);
  return first + static_cast<TensorId>(sparse_slot_[static_cast<int>(TensorKind::expert_gate)] + 3 * expert + offset);
}

std::optional<TensorId> ModelSpec::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::int64_t ModelSpec::parameters() const {
  std::int64_t n = 0;
  for (const auto& t : tensors_) n += t.elements();
  return n;
}

std::shared_ptr<const ModelSpec> load_model(std::string_view arg) {
  const std::string text = read_file_or_preset(PresetKind::model, arg, "model");
  return std::make_shared<const ModelSpec>(std::string(arg), parse_model_config(text, arg));
}

}  // namespace nereus
