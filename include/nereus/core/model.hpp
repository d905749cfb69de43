#pragma once
// Model specs: a Hugging Face config.json reduced to what sharding needs, and the tensor
// list it implies (sharding.md, "Tensors").
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "nereus/core/dtype.hpp"

namespace nereus {

/// Architecture families whose tensor lists sharding.md defines. deepseek_v3 is also
/// Kimi-K2's `kimi_k2` (sharding.md, "DeepSeek-V3-style models").
enum class Arch : std::uint8_t { llama, qwen2, qwen3, qwen3_moe, deepseek_v3 };

std::string_view to_string(Arch a);

/// The fields of config.json that determine tensors and shards.
struct ModelConfig {
  Arch arch = Arch::llama;
  std::int64_t hidden = 0;        ///< H
  std::int64_t intermediate = 0;  ///< I
  std::int64_t layers = 0;        ///< L
  std::int64_t heads = 0;         ///< nh
  std::int64_t kv_heads = 0;      ///< nkv
  std::int64_t head_dim = 0;      ///< hd; with MLA the query/key head width dn + dr
  std::int64_t vocab = 0;         ///< V
  bool tied_embeddings = false;   ///< never with a score head
  /// num_labels of a score head (`...ForTokenClassification` / `...ForSequenceClassification`:
  /// value and reward models); 0 for a language-model head.
  std::int64_t score_labels = 0;
  bool qkv_bias = false;  ///< qwen2 always; llama with attention_bias
  bool qk_norm = false;   ///< qwen3
  DType dtype = DType::bf16;
  // Mixture of experts (qwen3_moe; sharding.md, "Mixture-of-experts models"). A dense
  // model has experts == 0.
  std::int64_t experts = 0;               ///< E (num_experts)
  std::int64_t experts_per_token = 0;     ///< num_experts_per_tok
  std::int64_t expert_intermediate = 0;   ///< Ie (moe_intermediate_size)
  std::int64_t sparse_step = 1;           ///< decoder_sparse_step
  std::vector<std::int64_t> dense_layers; ///< mlp_only_layers
  // DeepSeek-V3-style models: multi-head latent attention (MLA), dense-first layers,
  // shared experts (sharding.md, "DeepSeek-V3-style models").
  std::int64_t q_lora_rank = 0;      ///< qr; 0: q_proj instead of q_a_proj/q_b_proj (null)
  std::int64_t kv_lora_rank = 0;     ///< kvr
  std::int64_t qk_nope_dim = 0;      ///< dn
  std::int64_t qk_rope_dim = 0;      ///< dr
  std::int64_t v_head_dim = 0;       ///< dv
  std::int64_t shared_experts = 0;   ///< Es (n_shared_experts)
  std::int64_t first_dense = 0;      ///< first_k_dense_replace
  std::int64_t moe_layer_freq = 1;   ///< moe_layer_freq
  bool router_bias = false;          ///< mlp.gate.e_score_correction_bias (topk_method noaux_tc), float32
  /// quantization_config.weight_block_size [bo, bi]: the FP8 blocks (sharding.md, "Per-tensor dtypes").
  std::array<std::int64_t, 2> fp8_block{128, 128};

  bool moe() const { return experts > 0; }
  bool mla() const { return arch == Arch::deepseek_v3; }
  /// Per-head width of o_proj's columns: dv with MLA, hd otherwise.
  std::int64_t o_head_width() const { return mla() ? v_head_dim : head_dim; }
  /// Whether layer l has the router and experts instead of the dense MLP.
  bool sparse_layer(std::int64_t l) const;
  /// How many layers are sparse.
  std::int64_t sparse_layers() const;
  bool operator==(const ModelConfig&) const = default;
};

/// Parses config.json text; `origin` names the file or preset in error messages.
ModelConfig parse_model_config(std::string_view json_text, std::string_view origin);

/// What a tensor is; decides its TP rule and its pipeline stage.
/// MLA (deepseek_v3) uses q (q_b_proj, or q_proj without q compression) and o with its own
/// head widths, and q_a, q_a_norm, kv_a, kv_a_norm, kv_b; its sparse layers add the
/// router's bias and the shared experts. Expert kinds come last (is_expert).
enum class TensorKind : std::uint8_t {
  embed, input_norm, q, q_bias, k, k_bias, v, v_bias, q_norm, k_norm, o, post_norm,
  gate, up, down, final_norm, lm_head, score,
  q_a, q_a_norm, kv_a, kv_a_norm, kv_b,            // MLA
  shared_gate, shared_up, shared_down,             // shared experts (deepseek_v3)
  router, router_bias, expert_gate, expert_up, expert_down  // sparse layers
};
/// How many TensorKinds there are (arrays indexed by kind).
inline constexpr int kTensorKinds = static_cast<int>(TensorKind::expert_down) + 1;
/// Whether a kind is one expert's projection (held by its expert group only).
inline bool is_expert(TensorKind k) { return k >= TensorKind::expert_gate; }

/// One Hugging Face tensor: name, kind, layer (-1 outside layers), shape, and the expert
/// (-1 unless an expert kind).
struct TensorInfo {
  std::string name;
  TensorKind kind;
  std::int32_t layer;
  int rank;                          ///< 1 or 2
  std::array<std::int64_t, 2> shape; ///< [out, in]; shape[1] unused when rank is 1
  std::int32_t expert = -1;
  DType dtype = DType::bf16;         ///< of its param slot: the config's, or float32 where sharding.md says so
  std::int64_t elements() const { return rank == 1 ? shape[0] : shape[0] * shape[1]; }
};

/// Index of a tensor in ModelSpec::tensors.
using TensorId = std::uint32_t;

/// A model: its config and the tensor list of sharding.md, in a fixed order
/// (embedding, each layer in order, final norm, then lm_head or a score head's score).
/// A sparse layer lists attention, post norm, the router, then per expert gate, up, down.
class ModelSpec {
 public:
  ModelSpec(std::string name, ModelConfig config);

  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& tensor(TensorId id) const { return tensors_[id]; }
  /// Kinds of a dense (or, with sparse, a sparse) layer, in tensor-list order; each expert
  /// kind stands for E tensors.
  const std::vector<TensorKind>& layer_kinds(bool sparse = false) const {
    return sparse ? sparse_kinds_ : layer_kinds_;
  }
  /// The tensor of `kind` in `layer` (layer ignored for non-layer kinds; expert only for
  /// expert kinds), if present.
  std::optional<TensorId> find(TensorKind kind, std::int32_t layer = -1, std::int32_t expert = 0) const;
  std::optional<TensorId> find(std::string_view name) const;
  /// Parameter count of one full replica (a tied embedding counted once).
  std::int64_t parameters() const;

 private:
  std::string name_;
  ModelConfig config_;
  std::vector<TensorInfo> tensors_;
  std::vector<TensorKind> layer_kinds_;   // dense layers
  std::vector<TensorKind> sparse_kinds_;  // sparse layers (empty for a dense model)
  std::vector<TensorId> layer_start_;     // first tensor of each layer, then the final norm
  // Position of a per-layer kind in a dense / sparse layer, -1 if absent (an expert kind:
  // the position of expert 0's tensor).
  std::array<std::int32_t, kTensorKinds> kind_slot_{};
  std::array<std::int32_t, kTensorKinds> sparse_slot_{};
  std::unordered_map<std::string, TensorId> by_name_;
};

/// Loads `arg`: a path to a config.json, or the name of a built-in preset.
std::shared_ptr<const ModelSpec> load_model(std::string_view arg);

/// True when two models have the same tensors and shards (names of origin may differ).
inline bool same_model(const ModelSpec& a, const ModelSpec& b) { return a.config() == b.config(); }

}  // namespace nereus
