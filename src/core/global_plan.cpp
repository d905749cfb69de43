#include "nereus/core/global_plan.hpp"

#include <algorithm>
#include <set>

#include "json_fields.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

const CollectionSpec* GlobalPlan::find(std::string_view model_stage) const {
  for (const auto& [name, spec] : stages)
    if (name == model_stage) return &spec;
  return nullptr;
}

std::vector<DeviceId> GlobalPlan::devices() const {
  std::set<DeviceId> all;
  for (const auto& [name, spec] : stages) all.insert(spec.devices.begin(), spec.devices.end());
  return {all.begin(), all.end()};
}

std::vector<ModelStage> model_stages(const JobSpec& job) {
  std::vector<ModelStage> out;
  for (auto& phase : job.phases())
    for (auto& s : phase) out.push_back(std::move(s));
  return out;
}

std::string_view role_of(std::string_view model_stage) { return model_stage.substr(0, model_stage.find('/')); }

GlobalPlan parse_global_plan(const JobSpec& job, std::string_view text, std::string_view origin) {
  using namespace detail;
  const json j = parse_json(text, origin);
  if (!j.is_object())
    throw Error(std::string(origin) + ": a plan is a JSON object of model-stage: layout spec");
  const auto stages = model_stages(job);
  GlobalPlan plan;
  std::string names;
  for (const ModelStage& s : stages) names += (names.empty() ? "" : ", ") + s.name();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const bool known = std::any_of(stages.begin(), stages.end(), [&](const ModelStage& s) { return s.name() == it.key(); });
    if (!known)
      throw Error(std::string(origin) + ": '" + it.key() + "' is not a model-stage of this " +
                  std::string(to_string(job.algorithm)) + " job (it has " + names + ")");
  }
  for (const ModelStage& s : stages) {
    auto it = j.find(s.name());
    if (it == j.end()) throw Error(std::string(origin) + ": model-stage '" + s.name() + "' has no layout");
    if (!it->is_string())
      throw Error(std::string(origin) + ": model-stage '" + s.name() + "' must be a layout spec string, got " + it->dump());
    try {
      plan.stages.emplace_back(s.name(), parse_collection_spec(it->get<std::string>()));
    } catch (const Error& e) {
      throw Error(std::string(origin) + ": model-stage '" + s.name() + "': " + e.what());
    }
  }
  return plan;
}

GlobalPlan load_global_plan(const JobSpec& job, std::string_view arg) {
  std::size_t first = arg.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && arg[first] == '{') return parse_global_plan(job, arg, "plan");
  return parse_global_plan(job, read_text_file(std::string(arg)), arg);
}

std::string to_json_text(const GlobalPlan& plan) {
  std::string out = "{";
  for (std::size_t i = 0; i < plan.stages.size(); ++i)
    out += std::string(i ? ",\n " : "\n ") + nlohmann::json(plan.stages[i].first).dump() + ": " +
           nlohmann::json(to_string(plan.stages[i].second)).dump();
  return out + "\n}\n";
}

bool outside_pool(const GlobalPlan& plan, int gpus) {
  for (const auto& [name, spec] : plan.stages)
    for (DeviceId d : spec.devices)
      if (d >= gpus) return true;
  return false;
}

std::string streams_sharing_gpu(const JobSpec& job, const GlobalPlan& plan) {
  const std::vector<ModelStage> stages = model_stages(job);
  for (const ModelStage& g : stages) {
    const CollectionSpec* gen = g.kind == StageKind::generate ? plan.find(g.name()) : nullptr;
    if (!gen) continue;
    for (const ModelStage& t : stages) {
      const CollectionSpec* train = t.kind == StageKind::train ? plan.find(t.name()) : nullptr;
      if (!train) continue;
      for (DeviceId d : train->devices)
        if (std::find(gen->devices.begin(), gen->devices.end(), d) != gen->devices.end())
          return g.name() + " and " + t.name() + " share GPU " + std::to_string(d);
    }
  }
  return {};
}

std::string to_string(const GlobalPlan& plan) {
  std::string out;
  for (const auto& [name, spec] : plan.stages) out += (out.empty() ? "" : " ") + name + "=" + to_string(spec);
  return out;
}

std::vector<Collection> plan_collections(const JobSpec& job, const GlobalPlan& plan, std::int64_t device_count) {
  std::vector<Collection> out;
  for (const ModelStage& s : model_stages(job)) {
    const CollectionSpec* spec = plan.find(s.name());
    if (!spec) throw Error("plan: model-stage '" + s.name() + "' has no layout");
    try {
      out.push_back(Collection::from_spec(s.model, s.name(), *spec, s.kind == StageKind::train));
      out.back().validate(device_count);
    } catch (const Error& e) {
      const std::string what = e.what();
      const std::string named = "model-stage '" + s.name() + "'";
      throw Error("plan: " + (what.rfind(named, 0) == 0 ? what : named + ": " + what));
    }
  }
  // A weight sync quantizes the training stage's blocks where they are read, so its
  // splits, too, must fall on FP8 block boundaries (sharding.md): refused here, up front,
  // rather than at the first end_step.
  const std::vector<ModelStage> stages = model_stages(job);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const bool fp8 = std::any_of(out[i].units.begin(), out[i].units.end(), [](const Emu& u) { return u.layout.fp8; });
    if (!fp8) continue;
    for (std::size_t t = 0; t < stages.size(); ++t)
      if (stages[t].kind == StageKind::train && stages[t].role == stages[i].role)
        for (std::size_t u = 0; u < out[t].units.size(); ++u)
          if (u == 0 || !(out[t].units[u].layout == out[t].units[u - 1].layout))
            check_fp8_blocks(*stages[t].model, out[t].units[u].layout,
                             "model-stage '" + stages[t].name() + "', whose weight sync feeds FP8 '" + stages[i].name() + "'");
  }
  return out;
}

}  // namespace nereus
