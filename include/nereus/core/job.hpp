#pragma once
// RL jobs (interfaces.md, "Job"): the algorithm, its models, and the model-stages it runs,
// in the phase order the execution-overlap graph builds on.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/core/model.hpp"

namespace nereus {

enum class Algorithm : std::uint8_t { ppo, grpo, remax };
/// What a model-stage does in a step.
enum class StageKind : std::uint8_t { generate, infer, train };

std::string_view to_string(Algorithm a);
std::string_view to_string(StageKind s);

/// One model in one stage, e.g. actor/train.
struct ModelStage {
  std::string role;  ///< actor, critic, reference, reward
  StageKind kind;
  std::shared_ptr<const ModelSpec> model;
  std::string name() const { return role + "/" + std::string(to_string(kind)); }
  /// Whether a unit of this model-stage holds the state of a unit of `other`, so that
  /// `other`'s unit may be freed: the same model, and the optimizer state too when
  /// `other` trains.
  bool holds_state_of(const ModelStage& other) const {
    return role == other.role && (other.kind != StageKind::train || kind == StageKind::train);
  }
};

struct JobSpec {
  Algorithm algorithm = Algorithm::ppo;
  std::vector<std::pair<std::string, std::shared_ptr<const ModelSpec>>> models;  ///< role → model, in role order
  std::int64_t prompts_per_step = 0;
  std::int64_t samples_per_prompt = 1;
  std::int64_t prompt_len = 0;
  std::int64_t max_response_len = 0;
  /// `"mode": "async"`: generation runs on while training computes, and weight updates
  /// reach generation in flight (runtime/weight_update.hpp).
  bool async = false;
  /// Async: generation never runs with params more than this many versions behind the
  /// trainer (`"max_staleness"`, ≥ 1; default 1: one-step off-policy).
  std::int64_t max_staleness = 1;
  /// `"reward": "rule"`: a verifiable reward the framework computes (RLVR); the job has no
  /// reward model and no reward model-stage.
  bool rule_reward = false;

  /// The model-stages of one step, grouped by phase: generation, then inference (the
  /// stages of a phase may run side by side on disjoint GPUs), then training.
  std::vector<std::vector<ModelStage>> phases() const;
  std::shared_ptr<const ModelSpec> model(std::string_view role) const;
};

/// Parses a job JSON; every error names the field. Models are paths or presets.
JobSpec parse_job(std::string_view json_text, std::string_view origin);
/// A path to a job JSON, or a preset name (e.g. "ppo-llama-3.1-8b").
JobSpec load_job(std::string_view arg);
/// `job` in `mode` ("sync" or "async", empty: the job's own) with `max_staleness` (0: the
/// job's own); the command line's --mode and --max-staleness over the job file's fields.
/// Throws naming a bad mode, a staleness < 0, or a staleness for a sync job.
JobSpec with_mode(JobSpec job, std::string_view mode, std::int64_t max_staleness);

}  // namespace nereus
