// `nereus simulate`: replay a drift trace through the controller (interfaces.md).
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/progress.hpp"
#include "nereus/sim/report.hpp"

namespace nereus::cli {

namespace {

struct SimulateArgs {
  std::string cluster, job, trace, policy = "nereus", timeline, plot, perfetto;
  double gamma = 0.5, delta = 0.3;
  std::uint64_t seed = 1;
  long steps = 0;
  int profile_runs = 24;
  std::string transitions = "overlap";
  std::string mode;
  std::int64_t max_staleness = 0;
  bool json = false;
  bool quiet = false;
};

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path);
  out << text;
  if (!out) throw Error(std::string(flag) + ": cannot write '" + path + "'");
}

void print_run(const SimulateArgs& a, const JobSpec& job, const std::string& policy, const SimulationResult& r) {
  double update = 0, generation = 0, training = 0;  // async: means over the steps
  for (const StepRecord& s : r.records)
    update += s.update_seconds, generation += s.generation_seconds, training += s.training_seconds;
  const double steps = std::max(1.0, double(r.records.size()));
  if (a.json) {
    auto eff = nlohmann::json::object();
    for (std::size_t c = 0; c < kOpClasses; ++c) eff[std::string(to_string(static_cast<OpClass>(c)))] = r.efficiency[c];
    auto decisions = nlohmann::json::array();
    for (const Decision& d : r.decisions)
      decisions.push_back({{"step", d.step},
                           {"trigger", d.trigger},
                           {"urgent", d.urgent},
                           {"admitted", d.admitted},
                           {"current_seconds", std::isfinite(d.current_seconds) ? nlohmann::json(d.current_seconds) : nlohmann::json(nullptr)},
                           {"target_seconds", d.target_seconds},
                           {"transition_seconds", d.transition_seconds},
                           {"charged_seconds", d.charged_seconds},
                           {"horizon_steps", d.horizon_steps},
                           {"moved_bytes", d.moved_bytes},
                           {"decision_ms", d.decision_ms},
                           {"why", d.why}});
    nlohmann::json j = {{"policy", policy},
                        {"steps", r.steps},
                        {"mean_step_seconds", r.mean_step_seconds},
                        {"mean_compute_seconds", r.mean_compute_seconds},
                        {"total_seconds", r.total_seconds},
                        {"transition_seconds", r.transition_seconds},
                        {"transitions", r.transitions},
                        {"exposed_transition_seconds", r.exposed_transition_seconds},
                        {"transition_share", r.total_seconds > 0 ? r.exposed_transition_seconds / r.total_seconds : 0.0},
                        {"failed_steps", r.failed_steps},
                        {"oom_steps", r.oom_steps},
                        {"failure_seconds", r.failure_seconds},
                        {"replans", r.replans},
                        {"decision_ms_median", r.decision_ms_median},
                        {"decision_ms_max", r.decision_ms_max},
                        {"calibration_mape", r.mape},
                        {"calibration_max_ape", r.max_ape},
                        {"prior_mape", r.mape_prior},
                        {"efficiency", eff},
                        {"decisions", decisions},
                        {"mode", job.async ? "async" : "sync"}};
    if (job.async) {
      j["max_staleness"] = job.max_staleness;
      j["mean_generation_seconds"] = generation / steps;
      j["mean_training_seconds"] = training / steps;
      j["mean_update_seconds"] = update / steps;
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format("{} steps, policy {}: mean {:.3f} s/step ({:.3f} s computing), total {:.1f} s\n", r.steps, policy,
                             r.mean_step_seconds, r.mean_compute_seconds, r.total_seconds);
    if (job.async)
      std::cout << fmt::format("async (max_staleness {}): per step generation {:.3f} s, training {:.3f} s, weight update {:.3f} s\n",
                               job.max_staleness, generation / steps, training / steps, update / steps);
    std::cout << fmt::format("{} transitions, {:.2f} s, {:.2f} s exposed ({:.3f}% of the run); {} replans\n", r.transitions,
                             r.transition_seconds, r.exposed_transition_seconds,
                             100 * r.exposed_transition_seconds / std::max(1e-9, r.total_seconds), r.replans);
    std::cout << fmt::format("{} failed steps ({} out of memory), {:.1f} s lost to them\n", r.failed_steps, r.oom_steps,
                             r.failure_seconds);
    std::cout << fmt::format("decisions: median {:.2f} ms, max {:.2f} ms; cost model on held-out stage runs: MAPE {:.1f}% "
                             "(max {:.1f}%; {:.1f}% before calibration)\n",
                             r.decision_ms_median, r.decision_ms_max, 100 * r.mape, 100 * r.max_ape, 100 * r.mape_prior);
    for (const Decision& d : r.decisions)
      if (d.admitted) std::cout << fmt::format("  step {:>5} [{}] {}\n", d.step, d.trigger, d.why);
  }
}

/// "nereus,static,every:3" → the policies, each checked.
std::vector<std::string> policies_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    out.push_back(text.substr(pos, end - pos));
    int every = 0;
    parse_policy(out.back(), every);  // throws naming a bad one
    pos = end + 1;
  }
  return out;
}

void run_simulate(const SimulateArgs& a) {
  const std::vector<std::string> policies = policies_of(a.policy);
  const ClusterSpec cluster = load_cluster(a.cluster);
  const JobSpec job = with_mode(load_job(a.job), a.mode, a.max_staleness);
  std::vector<TraceStep> trace = load_trace(a.trace);
  if (a.steps > 0 && static_cast<std::size_t>(a.steps) < trace.size()) trace.resize(static_cast<std::size_t>(a.steps));
  std::vector<PolicyRun> runs;
  for (const std::string& policy : policies) {
    SimulationOptions o;
    o.controller.policy = parse_policy(policy, o.controller.every);
    o.controller.gamma = a.gamma;
    o.controller.delta = a.delta;
    o.seed = a.seed;
    o.profile_runs = a.profile_runs;
    o.overlap = a.transitions == "overlap";
    Progress progress("simulate " + policy, static_cast<double>(trace.size()), "steps", a.quiet || a.json);
    o.on_step = [&](std::size_t done) { progress.update(static_cast<double>(done)); };
    runs.push_back({policy, simulate(cluster, job, trace, o)});
  }
  if (!a.timeline.empty()) {
    std::string text;  // with several policies, each line names its own
    for (const PolicyRun& run : runs) text += timeline_jsonl(run.result, runs.size() > 1 ? run.policy : "");
    write_file(a.timeline, text, "--timeline");
  }
  if (!a.plot.empty())
    write_file(a.plot, plot_svg(runs, fmt::format("{} · {} · {} · {}", job.models[0].second->name(), cluster.name, a.trace, a.policy)),
               "--plot");
  if (!a.perfetto.empty()) write_file(a.perfetto, perfetto_json(runs), "--perfetto");
  for (const PolicyRun& run : runs) print_run(a, job, run.policy, run.result);
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand("simulate", "Replay a drift trace on a virtual cluster through the controller");
  cmd->add_option("--cluster", a->cluster, "cluster JSON or preset")->required();
  cmd->add_option("--job", a->job, "job JSON or preset")->required();
  cmd->add_option("--trace", a->trace, "trace (JSON Lines)")->required();
  cmd->add_option("--policy", a->policy,
                  "nereus | static | static-max | every:K | greedy, or several separated by commas (default nereus)");
  cmd->add_option("--gamma", a->gamma, "payback factor γ (default 0.5)")->check(CLI::PositiveNumber);
  cmd->add_option("--delta", a->delta, "relative drift that triggers a replan (default 0.3)")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "noise of the hardware model (default 1)");
  cmd->add_option("--steps", a->steps, "replay only the first N steps")->check(CLI::PositiveNumber);
  cmd->add_option("--profile-runs", a->profile_runs, "stage runs profiled before the first step (default 24)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--transitions", a->transitions,
                  "overlap: beside the steps, as the job runtime runs them (default); boundary: between steps, all exposed")
      ->check(CLI::IsMember({"overlap", "boundary"}));
  cmd->add_option("--mode", a->mode,
                  "sync | async, over the job file's mode (async: generation and training run as two streams on GPUs apart)");
  cmd->add_option("--max-staleness", a->max_staleness, "async: versions generation may run behind training (default the job's, 1)");
  cmd->add_option("--timeline", a->timeline, "write one JSON object per step to FILE");
  cmd->add_option("--plot", a->plot, "write an SVG plot of step latency per policy, transitions, failures and GPU pool to FILE");
  cmd->add_option("--perfetto", a->perfetto, "write a Perfetto timeline (steps, transitions, failures, decisions) to FILE");
  cmd->add_flag("--json", a->json, "print one JSON object (per policy); no progress line");
  cmd->add_flag("--quiet", a->quiet, "no progress line on the terminal");
  cmd->callback([a] { refusing_input([&] { run_simulate(*a); }); });
}

}  // namespace nereus::cli
