#pragma once
// Random RL jobs and global plans on small pools of GPUs, for the transition-graph and
// job-runtime tests: tiny models of two architectures, random layouts, DP degrees, GPU
// sets and orders, stale generation stages and memory budgets.
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cases.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/plan/transition_graph.hpp"

namespace testcase {

/// A made-up cluster small enough for exhaustive planner checks: 4 nodes, slow links.
inline nereus::ClusterSpec small_cluster(double memory_gib, int gpus_per_node) {
  nereus::ClusterSpec c;
  c.name = "test";
  c.nodes = 4;
  c.gpus_per_node = gpus_per_node;
  c.gpu_memory_gib = memory_gib;
  c.gpu_bf16_tflops = 100;
  c.hbm_gbps = 1000;
  c.intra_node_gbps = 100;
  c.inter_node_gbps = 10;
  c.nics_per_node = 1;
  return c;
}

/// A PPO job over very small models: actor and reference a qwen3 (q/k norms; with `moe`,
/// the qwen3_moe of cases.hpp), critic and reward a llama with attention biases and tied
/// embeddings (different architectures, so roles never mix up). 16 sequences a step.
/// Two plans of ppo-tiny on 8 devices: every model-stage on its own GPUs, then most changed.
inline constexpr const char* kPlanA = R"({"actor/generate": "tp=2,pp=1,dp=4,devices=0-7",
  "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=2,pp=1,dp=1,devices=4-5", "reward/infer": "tp=2,pp=1,dp=1,devices=6-7",
  "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})";
inline constexpr const char* kPlanB = R"({"actor/generate": "tp=1,pp=1,dp=8,devices=0-7",
  "actor/infer": "tp=1,pp=1,dp=2,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=1,pp=1,dp=2,devices=4-5", "reward/infer": "tp=2,pp=1,dp=1,devices=6-7",
  "actor/train": "tp=2,pp=2,dp=1,devices=4-7", "critic/train": "tp=2,pp=2,dp=1,devices=0-3"})";

inline nereus::JobSpec tiny_ppo_job(bool moe = false) {
  nereus::JobSpec j;
  j.algorithm = nereus::Algorithm::ppo;
  auto qwen = synthetic(moe ? "tiny-moe-odd" : "tiny-qwen3");
  auto llama = synthetic("tiny-llama-bias");
  j.models = {{"actor", qwen}, {"critic", llama}, {"reference", qwen}, {"reward", llama}};
  j.prompts_per_step = 16;
  j.samples_per_prompt = 1;
  j.prompt_len = 16;
  j.max_response_len = 32;
  return j;
}

/// ReMax: the actor's generation and training, the reference and a reward model; no
/// critic, and no actor/infer (its single baseline rollout needs no old log-probs).
inline nereus::JobSpec tiny_remax_job() {
  nereus::JobSpec j = tiny_ppo_job();
  j.algorithm = nereus::Algorithm::remax;
  std::erase_if(j.models, [](const auto& m) { return m.first == "critic"; });
  return j;
}

class JobGenerator {
 public:
  explicit JobGenerator(std::uint64_t seed) : g_(seed), rng_(seed * 7919 + 1) {}

  int uniform(int lo, int hi) { return g_.uniform(lo, hi); }
  bool coin(double p = 0.5) { return g_.coin(p); }

  /// A random spec for one model-stage on a pool of `pool` GPUs.
  nereus::CollectionSpec spec(const nereus::ModelConfig& c, int pool) {
    for (;;) {
      nereus::Layout l = g_.layout(c, 4);
      if (l.pp > 2) l.pp = 2, l.partition.clear();
      if (l.size() > pool) continue;
      std::vector<int> dps;
      for (int dp : {1, 2, 4})
        if (dp * l.size() <= pool) dps.push_back(dp);
      const int dp = dps[static_cast<std::size_t>(uniform(0, static_cast<int>(dps.size()) - 1))];
      std::vector<nereus::DeviceId> ids(static_cast<std::size_t>(pool));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng_);
      ids.resize(static_cast<std::size_t>(l.size() * dp));
      return {l, dp, ids};
    }
  }

  /// A random plan: each model-stage independently, or (with `keep`) copied from `base`.
  nereus::GlobalPlan plan(const nereus::JobSpec& job, int pool, const nereus::GlobalPlan* base = nullptr,
                          double keep = 0) {
    nereus::GlobalPlan p;
    for (const auto& s : nereus::model_stages(job)) {
      if (base && coin(keep)) p.stages.emplace_back(s.name(), *base->find(s.name()));
      else p.stages.emplace_back(s.name(), spec(s.model->config(), pool));
    }
    return p;
  }

  /// Random stale flags: only generation/inference stages of trained roles.
  std::vector<bool> stale(const nereus::JobSpec& job) {
    std::vector<bool> out;
    for (const auto& s : nereus::model_stages(job))
      out.push_back(s.kind != nereus::StageKind::train && (s.role == "actor" || s.role == "critic") && coin(0.3));
    return out;
  }

 private:
  Generator g_;
  std::mt19937_64 rng_;
};

}  // namespace testcase
