// `nereus model`: a model's tensor list and checkpoint check; `nereus presets`.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/presets.hpp"
#include "nereus/core/safetensors.hpp"
#include "output.hpp"

namespace nereus::cli {

namespace {

struct ModelArgs {
  std::string model, weights;
  bool tensors = false, json = false;
};

void run_model(const ModelArgs& a) {
  const auto model = load_model(a.model);
  std::size_t checked = 0;
  if (!a.weights.empty()) {
    const auto list = read_checkpoint_tensors(a.weights);
    check_checkpoint(*model, list);
    checked = list.size();
  }
  const ModelConfig& c = model->config();
  std::uint64_t bytes = 0;  // each tensor at its own width (DeepSeek's router bias is float32)
  for (const TensorInfo& t : model->tensors()) bytes += static_cast<std::uint64_t>(t.elements()) * width(t.dtype);
  if (a.json) {
    nlohmann::json j = {{"model", a.model},        {"arch", std::string(to_string(c.arch))},
                        {"hidden_size", c.hidden}, {"intermediate_size", c.intermediate},
                        {"num_hidden_layers", c.layers}, {"num_attention_heads", c.heads},
                        {"num_key_value_heads", c.kv_heads}, {"head_dim", c.head_dim},
                        {"vocab_size", c.vocab},   {"tie_word_embeddings", c.tied_embeddings},
                        {"dtype", std::string(to_string(c.dtype))}, {"parameters", model->parameters()},
                        {"param_bytes", bytes},    {"tensor_count", model->tensors().size()},
                        {"fp8_block", {c.fp8_block[0], c.fp8_block[1]}}};
    if (c.moe()) {
      j["num_experts"] = c.experts;
      j["num_experts_per_tok"] = c.experts_per_token;
      j["moe_intermediate_size"] = c.expert_intermediate;
      j["sparse_layers"] = c.sparse_layers();
    }
    if (c.mla()) {
      j["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::json(c.q_lora_rank) : nlohmann::json(nullptr);
      j["kv_lora_rank"] = c.kv_lora_rank;
      j["qk_nope_head_dim"] = c.qk_nope_dim;
      j["qk_rope_head_dim"] = c.qk_rope_dim;
      j["v_head_dim"] = c.v_head_dim;
      j["n_shared_experts"] = c.shared_experts;
      j["first_k_dense_replace"] = c.first_dense;
      j["e_score_correction_bias"] = c.router_bias;
    }
    if (!a.weights.empty()) j["checkpoint_tensors_checked"] = checked;
    if (a.tensors) {
      auto arr = nlohmann::json::array();
      for (const auto& t : model->tensors()) {
        auto shape = nlohmann::json::array({t.shape[0]});
        if (t.rank == 2) shape.push_back(t.shape[1]);
        arr.push_back({{"name", t.name}, {"shape", shape}, {"dtype", std::string(to_string(t.dtype))}});
      }
      j["tensors"] = std::move(arr);
    }
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << fmt::format("{}: {} H={} I={} L={} heads={} kv_heads={} head_dim={} V={}{}\n", a.model,
                           to_string(c.arch), c.hidden, c.intermediate, c.layers, c.heads, c.kv_heads,
                           c.head_dim, c.vocab, c.tied_embeddings ? " tied" : "");
  if (c.mla())
    std::cout << fmt::format("MLA: q_lora_rank={} kv_lora_rank={} qk_nope={} qk_rope={} v_head_dim={}\n",
                             c.q_lora_rank > 0 ? std::to_string(c.q_lora_rank) : "none", c.kv_lora_rank, c.qk_nope_dim,
                             c.qk_rope_dim, c.v_head_dim);
  if (c.moe())
    std::cout << fmt::format("experts: {} of {} per token, Ie={}, in {} sparse layers of {}{}\n", c.experts_per_token,
                             c.experts, c.expert_intermediate, c.sparse_layers(), c.layers,
                             c.shared_experts > 0 ? fmt::format(", {} shared", c.shared_experts) : "");
  std::cout << fmt::format("{:.3f} B parameters, {} in {} ({} tensors)\n",
                           static_cast<double>(model->parameters()) / 1e9, human_bytes(bytes),
                           to_string(c.dtype), model->tensors().size());
  if (!a.weights.empty()) std::cout << fmt::format("checkpoint {} matches ({} tensors)\n", a.weights, checked);
  if (a.tensors)
    for (const auto& t : model->tensors())
      std::cout << (t.rank == 2 ? fmt::format("  {:<52} [{}, {}]{}\n", t.name, t.shape[0], t.shape[1],
                                              t.dtype != c.dtype ? " " + std::string(to_string(t.dtype)) : "")
                                : fmt::format("  {:<52} [{}]{}\n", t.name, t.shape[0],
                                              t.dtype != c.dtype ? " " + std::string(to_string(t.dtype)) : ""));
}

}  // namespace

void add_model_command(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  CLI::App* cmd = app.add_subcommand("model", "A model's shape and tensor list; checks a checkpoint");
  cmd->add_option("--model", args->model, "config.json path or preset name")->required();
  cmd->add_option("--weights", args->weights, ".safetensors file or model.safetensors.index.json to check");
  cmd->add_flag("--tensors", args->tensors, "list every tensor");
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] { refusing_input([&] { run_model(*args); }); });
}

void add_presets_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("presets", "List the built-in model, cluster and job presets");
  cmd->callback([] {
    std::cout << "models:\n";
    for (const auto& n : preset_names(PresetKind::model)) std::cout << "  " << n << "\n";
    std::cout << "clusters:\n";
    for (const auto& n : preset_names(PresetKind::cluster)) std::cout << "  " << n << "\n";
    std::cout << "jobs:\n";
    for (const auto& n : preset_names(PresetKind::job)) std::cout << "  " << n << "\n";
  });
}

}  // namespace nereus::cli
