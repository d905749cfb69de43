#pragma once
// Random transition cases for property tests: tiny models, random layouts, device
// orders, train/no-train, packings, one or two source model-stages.
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nereus/core/emu.hpp"
#include "reference.hpp"

namespace testcase {

/// A tiny qwen3 (q_norm/k_norm), a llama with attention biases, and a qwen3_moe whose
/// experts (5) and Ie (30) divide unevenly, with every second layer sparse and biases, for
/// coverage the shared tiny models lack.
inline std::shared_ptr<const nereus::ModelSpec> synthetic(const std::string& name) {
  std::string json;
  if (name == "tiny-mla-odd")  // MLA without q compression, uneven experts, dense-first, every second layer sparse
    json = R"({"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3","hidden_size":32,"intermediate_size":40,
      "num_hidden_layers":5,"num_attention_heads":6,"num_key_value_heads":6,"vocab_size":61,"q_lora_rank":null,
      "kv_lora_rank":10,"qk_nope_head_dim":8,"qk_rope_head_dim":4,"v_head_dim":6,"n_routed_experts":6,
      "n_shared_experts":2,"num_experts_per_tok":2,"moe_intermediate_size":20,"first_k_dense_replace":1,
      "moe_layer_freq":2,"topk_method":"greedy","torch_dtype":"float32"})";
  else if (name == "tiny-moe-odd")
    json = R"({"model_type":"qwen3_moe","hidden_size":32,"intermediate_size":56,"num_hidden_layers":4,
      "num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"vocab_size":67,"attention_bias":true,
      "num_experts":5,"num_experts_per_tok":2,"moe_intermediate_size":30,"decoder_sparse_step":2,
      "torch_dtype":"float32"})";
  else if (name == "tiny-qwen3")
    json = R"({"model_type":"qwen3","hidden_size":64,"intermediate_size":96,"num_hidden_layers":4,
      "num_attention_heads":8,"num_key_value_heads":4,"head_dim":8,"vocab_size":131,"torch_dtype":"bfloat16"})";
  else
    json = R"({"model_type":"llama","hidden_size":48,"intermediate_size":80,"num_hidden_layers":3,
      "num_attention_heads":6,"num_key_value_heads":2,"vocab_size":97,"attention_bias":true,
      "tie_word_embeddings":true,"torch_dtype":"float32"})";
  return std::make_shared<const nereus::ModelSpec>(name, nereus::parse_model_config(json, name));
}

inline std::shared_ptr<const nereus::ModelSpec> model(const std::string& name) {
  if (name == "tiny-qwen3" || name == "tiny-llama-bias" || name == "tiny-moe-odd" || name == "tiny-mla-odd") return synthetic(name);
  return nereus::load_model(name);
}

inline std::vector<int> valid_tps(const nereus::ModelConfig& c, int max_tp) {
  std::vector<int> out;
  for (int t = 1; t <= max_tp; ++t)
    if (c.heads % t == 0 && (c.kv_heads % t == 0 || t % c.kv_heads == 0)) out.push_back(t);
  return out;
}

struct Case {
  std::shared_ptr<const nereus::ModelSpec> model;
  std::vector<nereus::Collection> sources;
  nereus::Collection target;
  int gpus_per_node = 8;
  std::string describe() const;
};

inline std::string describe_collection(const nereus::Collection& c) {
  std::string s = c.model_stage + (c.train ? "[train]" : "") + "{";
  for (const auto& u : c.units)
    s += nereus::to_string(u.layout) + "@" + nereus::device_list_string(u.gpus) + "; ";
  return s + "}";
}

inline std::string Case::describe() const {
  std::string s = model->name() + " gpn=" + std::to_string(gpus_per_node) + " sources: ";
  for (const auto& c : sources) s += describe_collection(c) + " ";
  return s + "target: " + describe_collection(target);
}

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }

  nereus::Layout layout(const nereus::ModelConfig& c, int max_tp) {
    nereus::Layout l;
    const auto tps = valid_tps(c, max_tp);
    l.tp = tps[static_cast<std::size_t>(uniform(0, static_cast<int>(tps.size()) - 1))];
    l.pp = uniform(1, static_cast<int>(std::min<std::int64_t>(c.layers, 3)));
    if (l.pp > 1 && coin(0.3)) {
      // A random composition of L into pp positive parts.
      std::vector<int> cuts(static_cast<std::size_t>(c.layers - 1));
      std::iota(cuts.begin(), cuts.end(), 1);
      std::shuffle(cuts.begin(), cuts.end(), rng_);
      cuts.resize(static_cast<std::size_t>(l.pp - 1));
      std::sort(cuts.begin(), cuts.end());
      int prev = 0;
      for (int x : cuts) { l.partition.push_back(x - prev); prev = x; }
      l.partition.push_back(static_cast<int>(c.layers) - prev);
    }
    l.packing = coin() ? nereus::Packing::fused : nereus::Packing::hf;
    if (megatron && !c.mla() && l.tp <= c.kv_heads && coin(0.5)) l.packing = nereus::Packing::megatron;
    if (fsdp_here_ > 1 && c.experts == 0 && l.packing != nereus::Packing::megatron && coin(0.7)) {
      // Units that fit the pool: fewer stages, then fewer chunks, when tp·pp·fsdp is large.
      l.fsdp = uniform(2, fsdp_here_);
      if (l.tp * l.pp * l.fsdp > 10 && l.pp > 1) l.pp = 1, l.partition.clear();
      while (l.tp * l.fsdp > 10 && l.fsdp > 2) --l.fsdp;
    }
    if (c.experts > 0) {
      // Expert parallelism: ep in 1..3, then an etp dividing tp·ep with at most E groups
      // and etp <= Ie (sharding.md); the default (etp = tp) when it is one of them.
      l.tp = std::min(l.tp, 4);
      while (c.heads % l.tp != 0 || (c.kv_heads % l.tp != 0 && l.tp % c.kv_heads != 0)) --l.tp;
      l.ep = uniform(1, 3);
      std::vector<int> etps;
      for (int k = 1; k <= l.tp * l.ep; ++k)
        if ((l.tp * l.ep) % k == 0 && l.tp * l.ep / k <= c.experts && k <= c.expert_intermediate) etps.push_back(k);
      if (etps.empty()) l.ep = 1, etps.push_back(l.tp);
      const int k = etps[static_cast<std::size_t>(uniform(0, static_cast<int>(etps.size()) - 1))];
      l.etp = coin(0.3) && std::find(etps.begin(), etps.end(), l.tp) != etps.end() ? 0 : k;
    }
    return l;
  }

  nereus::Collection collection(std::shared_ptr<const nereus::ModelSpec> m, std::string stage, bool train,
                                int pool, int max_tp) {
    nereus::Collection c{m, std::move(stage), train, {}};
    const int dp = uniform(1, 2);
    std::vector<nereus::DeviceId> ids(static_cast<std::size_t>(pool));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    std::size_t next = 0;
    for (int j = 0; j < dp; ++j) {
      const nereus::Layout l = layout(m->config(), max_tp);
      if (next + static_cast<std::size_t>(l.size()) > ids.size()) break;
      c.units.push_back({l, {ids.begin() + static_cast<std::ptrdiff_t>(next),
                             ids.begin() + static_cast<std::ptrdiff_t>(next + l.size())}});
      next += static_cast<std::size_t>(l.size());
    }
    if (c.units.empty()) c.units.push_back({nereus::Layout{}, {ids[0]}});
    // DP replicas of one model-stage share a layout in a settled plan; keep mixed ones
    // sometimes (the state between primitives), else give all units the first layout.
    if (!coin(0.25))
      for (auto& u : c.units) {
        const nereus::Layout first = c.units[0].layout;
        if (u.layout.size() == first.size()) u.layout = first;
      }
    return c;
  }

  Case next(const std::vector<std::string>& models) {
    Case k;
    k.model = model(models[static_cast<std::size_t>(uniform(0, static_cast<int>(models.size()) - 1))]);
    const int pool = uniform(4, 16);
    const int max_tp = 8;
    k.gpus_per_node = std::vector<int>{1, 2, 4, 8}[static_cast<std::size_t>(uniform(0, 3))];
    const bool target_train = coin();
    const int nsrc = coin(0.3) ? 2 : 1;
    fsdp_here_ = max_fsdp;
    for (int i = 0; i < nsrc; ++i)
      k.sources.push_back(collection(k.model, "source" + std::to_string(i), i == 0 ? target_train || coin() : coin(),
                                     pool, max_tp));
    fsdp_here_ = fsdp_target ? max_fsdp : 1;
    k.target = collection(k.model, "target", target_train, pool + uniform(0, 4), max_tp);
    return k;
  }

  /// FSDP degrees up to this on dense models' layouts (1: none, the default, which keeps
  /// the other tests' sequences), and whether targets get them too.
  int max_fsdp = 1;
  bool fsdp_target = true;
  /// Megatron packing where it is valid (tp ≤ kv heads, no MLA), half the time.
  bool megatron = false;

 private:
  std::mt19937_64 rng_;
  int fsdp_here_ = 1;
};

}  // namespace testcase
