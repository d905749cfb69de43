#include "nereus/core/job.hpp"

#include <algorithm>

#include "json_fields.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

std::string_view to_string(Algorithm a) {
  switch (a) {
    case Algorithm::ppo: return "ppo";
    case Algorithm::grpo: return "grpo";
    case Algorithm::remax: return "remax";
  }
  return "?";
}

std::string_view to_string(StageKind s) {
  switch (s) {
    case StageKind::generate: return "generate";
    case StageKind::infer: return "infer";
    case StageKind::train: return "train";
  }
  return "?";
}

namespace {

/// Roles each algorithm needs, and which of them train.
struct Recipe {
  std::vector<std::string> required;
  std::vector<std::string> trained;
};

Recipe recipe(Algorithm a) {
  switch (a) {
    case Algorithm::ppo: return {{"actor", "critic", "reference", "reward"}, {"actor", "critic"}};
    case Algorithm::grpo: return {{"actor", "reference", "reward"}, {"actor"}};
    case Algorithm::remax: return {{"actor", "reference", "reward"}, {"actor"}};
  }
  return {};
}

}  // namespace

JobSpec parse_job(std::string_view text, std::string_view origin) {
  using namespace detail;
  const json j = parse_json(text, origin);
  if (!j.is_object()) throw Error(std::string(origin) + ": expected a JSON object");
  JobSpec job;
  const std::string alg = string_field(j, "algorithm", origin);
  if (alg == "ppo") job.algorithm = Algorithm::ppo;
  else if (alg == "grpo") job.algorithm = Algorithm::grpo;
  else if (alg == "remax") job.algorithm = Algorithm::remax;
  else throw Error(std::string(origin) + ": field 'algorithm' is '" + alg + "' (supported: ppo, grpo, remax)");
  const json& models = field(j, "models", origin);
  if (!models.is_object()) throw Error(std::string(origin) + ": field 'models' must be an object of role: model");
  const Recipe r = recipe(job.algorithm);
  for (const std::string& role : r.required) {
    auto it = models.find(role);
    if (it == models.end())
      throw Error(std::string(origin) + ": algorithm " + alg + " needs models." + role);
    if (!it->is_string())
      throw Error(std::string(origin) + ": models." + role + " must be a model path or preset name" +
                  (role == "reward" ? " (or \"rule\" for a verifiable reward)" : ""));
    if (role == "reward" && it->get<std::string>() == "rule") {  // computed by the framework, no model
      job.rule_reward = true;
      continue;
    }
    try {
      job.models.emplace_back(role, load_model(it->get<std::string>()));
    } catch (const Error& e) {
      throw Error(std::string(origin) + ": models." + role + ": " + e.what());
    }
  }
  for (auto it = models.begin(); it != models.end(); ++it)
    if (std::find(r.required.begin(), r.required.end(), it.key()) == r.required.end())
      throw Error(std::string(origin) + ": models." + it.key() + " is not a role of " + alg);
  job.prompts_per_step = integer_field(j, "prompts_per_step", origin);
  job.samples_per_prompt = integer_field(j, "samples_per_prompt", origin);
  job.prompt_len = integer_field(j, "prompt_len", origin);
  job.max_response_len = integer_field(j, "max_response_len", origin);
  const std::string mode = j.contains("mode") ? string_field(j, "mode", origin) : std::string("sync");
  if (mode != "sync" && mode != "async")
    throw Error(std::string(origin) + ": field 'mode' is '" + mode + "' (supported: sync, async)");
  job.async = mode == "async";
  if (j.contains("max_staleness")) {
    job.max_staleness = integer(field(j, "max_staleness", origin), "max_staleness", origin, true);
    if (!job.async) throw Error(std::string(origin) + ": field 'max_staleness' is for async jobs (\"mode\": \"async\")");
    if (job.max_staleness < 1)
      throw Error(std::string(origin) + ": field 'max_staleness' is " + std::to_string(job.max_staleness) +
                  "; it must be at least 1 (generation uses params at most that many versions old)");
  }
  return job;
}

JobSpec load_job(std::string_view arg) { return parse_job(read_file_or_preset(PresetKind::job, arg, "job"), arg); }

JobSpec with_mode(JobSpec job, std::string_view mode, std::int64_t max_staleness) {
  if (!mode.empty() && mode != "sync" && mode != "async")
    throw Error("--mode '" + std::string(mode) + "' is not one of sync, async");
  if (!mode.empty()) job.async = mode == "async";
  if (max_staleness < 0) throw Error("--max-staleness must be at least 1");
  if (max_staleness > 0) {
    if (!job.async) throw Error("--max-staleness is for async jobs (--mode async, or \"mode\": \"async\" in the job)");
    job.max_staleness = max_staleness;
  }
  if (!job.async) job.max_staleness = 1;
  return job;
}

std::shared_ptr<const ModelSpec> JobSpec::model(std::string_view role) const {
  for (const auto& [r, m] : models)
    if (r == role) return m;
  return nullptr;
}

std::vector<std::vector<ModelStage>> JobSpec::phases() const {
  const Recipe r = recipe(algorithm);
  std::vector<std::vector<ModelStage>> out(3);
  out[0].push_back({"actor", StageKind::generate, model("actor")});
  // PPO and GRPO score old log-probs with the actor for the policy ratio; ReMax's single
  // on-policy update does not.
  for (const auto& [role, m] : models)
    if (role != "actor" || algorithm != Algorithm::remax) out[1].push_back({role, StageKind::infer, m});
  for (const std::string& role : r.trained) out[2].push_back({role, StageKind::train, model(role)});
  return out;
}

}  // namespace nereus
