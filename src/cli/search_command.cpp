// `nereus search`: the plan the controller would pick for a job on a pool (interfaces.md).
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/base/error.hpp"
#include "nereus/control/planner.hpp"
#include "output.hpp"

namespace nereus::cli {

namespace {

struct SearchArgs {
  std::string cluster, job;
  int gpus = 0;
  double response_len = 0, response_p95 = 0;
  bool json = false, exhaustive = false;
  std::string mode;
  std::int64_t max_staleness = 0;
};

void run_search(const SearchArgs& a) {
  const ClusterSpec cluster = load_cluster(a.cluster);
  const JobSpec job = with_mode(load_job(a.job), a.mode, a.max_staleness);
  if (a.gpus < 1) throw Error("--gpus must be positive");
  if (a.gpus > cluster.gpus())
    throw Error("--gpus " + std::to_string(a.gpus) + " is more than the cluster's " + std::to_string(cluster.gpus()));
  if (!(a.response_len > 0)) throw Error("--response-len must be positive");
  const Workload w = Workload::of(job, a.response_len, a.response_p95 > 0 ? a.response_p95 : a.response_len * 1.2);
  const CostModel model(cluster);
  const PlanChoice c = a.exhaustive ? plan_job_exhaustive(model, job, a.gpus, w) : plan_job(model, job, a.gpus, w);
  if (a.json) {
    nlohmann::json j = {{"feasible", c.feasible},
                        {"predicted_step_seconds", c.step_seconds},
                        {"peak_memory_bytes", c.peak_memory_bytes},
                        {"decision_ms", c.decision_ms},
                        {"candidates", c.candidates},
                        {"frontier", c.frontier},
                        {"gpus", a.gpus},
                        {"mode", job.async ? "async" : "sync"}};
    if (!c.feasible) j["reason"] = c.reason;
    if (job.async && c.feasible) {
      const PlanEstimate e = estimate_plan(model, job, c.plan, w);
      j["max_staleness"] = job.max_staleness;
      j["generation_gpus"] = c.generation_gpus;
      j["generation_seconds"] = e.generation_seconds;
      j["training_seconds"] = e.training_seconds;
      j["update_seconds"] = e.update_seconds;
    }
    auto plan = nlohmann::json::object();
    for (const PlannedStage& s : c.stages) {
      const CollectionSpec* spec = c.plan.find(s.model_stage);
      plan[s.model_stage] = {{"tp", s.candidate.tp},
                             {"pp", s.candidate.pp},
                             {"ep", s.candidate.ep},
                             {"etp", s.candidate.expert_tp()},
                             {"dp", s.candidate.dp},
                             {"recompute", s.candidate.recompute},
                             {"devices", spec ? spec->devices : std::vector<DeviceId>{}},
                             {"spec", spec ? to_string(*spec) : ""},
                             {"predicted_seconds", s.seconds},
                             {"resident_bytes", s.memory.resident},
                             {"transient_bytes", s.memory.transient}};
    }
    j["plan"] = std::move(plan);
    std::cout << j.dump() << "\n";
  } else if (c.feasible) {
    std::cout << fmt::format("{} on {} GPUs of {}, responses of {:.0f} tokens\n", a.job, a.gpus, cluster.name, a.response_len);
    std::cout << fmt::format("predicted step {:.2f} s, peak {} per GPU, decided in {:.3f} ms ({} candidates, {} on frontiers)\n\n",
                             c.step_seconds, human_bytes(c.peak_memory_bytes), c.decision_ms, c.candidates, c.frontier);
    if (job.async && !a.exhaustive) {
      const PlanEstimate e = estimate_plan(model, job, c.plan, w);
      std::cout << fmt::format("async (max_staleness {}): generation on the last {} GPUs {:.2f} s, training {:.2f} s, "
                               "weight update {:.3f} s; the step is their period\n\n",
                               job.max_staleness, c.generation_gpus, e.generation_seconds, e.training_seconds, e.update_seconds);
    }
    for (const PlannedStage& s : c.stages)
      std::cout << fmt::format("{:<18} {:<22} dp={:<4}{} {:>8.2f} s  {}\n", s.model_stage, to_string(s.candidate.layout()),
                               s.candidate.dp, s.candidate.recompute ? " recompute" : "          ", s.seconds,
                               c.plan.find(s.model_stage) ? device_list_string(c.plan.find(s.model_stage)->devices) : "");
  }
  if (!c.feasible) throw Error("no plan fits: " + c.reason);
}

}  // namespace

void add_search_command(CLI::App& app) {
  auto a = std::make_shared<SearchArgs>();
  CLI::App* cmd = app.add_subcommand("search", "The plan the controller picks for a job on a GPU pool");
  cmd->add_option("--cluster", a->cluster, "cluster JSON or preset")->required();
  cmd->add_option("--job", a->job, "job JSON or preset")->required();
  cmd->add_option("--gpus", a->gpus, "GPUs in the pool")->required();
  cmd->add_option("--response-len", a->response_len, "mean response length (tokens)")->required();
  cmd->add_option("--response-p95", a->response_p95, "95th percentile response length (default 1.2x the mean)");
  cmd->add_flag("--exhaustive", a->exhaustive, "try every combination instead (small cases only)");
  cmd->add_option("--mode", a->mode, "sync | async: over the job file's mode (async: generation and training on GPUs apart)");
  cmd->add_option("--max-staleness", a->max_staleness, "async: versions generation may run behind training (default the job's, 1)");
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a] { refusing_input([&] { run_search(*a); }); });
}

}  // namespace nereus::cli
