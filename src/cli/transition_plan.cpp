#include "transition_plan.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "nereus/core/cluster.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/device.hpp"
#include "output.hpp"

namespace nereus::cli {

namespace {

nlohmann::json unit_json(const TransitionGraph& g, const UnitRef& u) {
  return {{"model_stage", g.stages[u.stage]}, {"unit", u.unit}, {"new", u.target}};
}

std::string spec_of(const Collection& c) {
  return to_string(CollectionSpec{c.units[0].layout, c.dp(), c.devices()});
}

}  // namespace

nlohmann::json transition_json(const TransitionGraph& g, bool nodes) {
  const TransitionSummary& s = g.summary;
  nlohmann::json j = {
      {"feasible", g.feasibility.ok},
      {"moved_bytes", s.moved_bytes},
      {"local_bytes", s.local_bytes},
      {"target_bytes", s.target_bytes},
      {"l_tran_seconds", s.l_tran_seconds},
      {"critical_path_seconds", s.critical_path_seconds},
      {"link_bound_seconds", s.link_bound_seconds},
      {"plan_ms", s.plan_ms},
      {"memory_first", s.memory_first},
      {"builds", s.builds},
      {"destroys", s.destroys},
      {"kept_units", s.kept_units},
      {"edges", {{"data", s.data_edges}, {"commit", s.commit_edges}, {"resource", s.resource_edges}}},
      {"budget_bytes", g.feasibility.budget},
      {"worst_bytes", g.feasibility.worst_bytes},
      {"worst_device", g.feasibility.worst_device},
  };
  if (!g.feasibility.ok) j["reason"] = g.feasibility.reason;
  auto stages = nlohmann::json::array();
  for (std::size_t i = 0; i < g.decisions.size(); ++i) {
    const StageDecision& d = g.decisions[i];
    stages.push_back({{"model_stage", d.model_stage},
                      {"from", spec_of(g.from[i])},
                      {"to", spec_of(g.to[i])},
                      {"strategy", d.strategy},
                      {"why", d.why},
                      {"common_layout", d.common_layout},
                      {"moved_bytes", d.moved_bytes},
                      {"via_common_bytes", d.via_common_bytes},
                      {"kept", d.kept},
                      {"built", d.built},
                      {"destroyed", d.destroyed}});
  }
  j["model_stages"] = std::move(stages);
  if (nodes) {
    auto arr = nlohmann::json::array();
    for (std::size_t x = 0; x < g.nodes.size(); ++x) {
      const GraphNode& n = g.nodes[x];
      auto srcs = nlohmann::json::array();
      for (const UnitRef& u : n.sources) srcs.push_back(unit_json(g, u));
      auto after = nlohmann::json::array();
      for (const Edge& e : n.after) after.push_back({{"node", e.node}, {"kind", std::string(to_string(e.kind))}});
      nlohmann::json node = unit_json(g, n.unit);
      node["id"] = x;
      node["kind"] = std::string(to_string(n.kind));
      node["gpus"] = g.emu(n.unit).gpus;
      node["sources"] = std::move(srcs);
      node["after"] = std::move(after);
      node["moved_bytes"] = n.moved_bytes;
      node["local_bytes"] = n.local_bytes;
      node["unit_bytes"] = n.unit_bytes;
      node["seconds"] = n.seconds;
      node["start"] = n.start;
      arr.push_back(std::move(node));
    }
    j["nodes"] = std::move(arr);
    auto mem = nlohmann::json::array();
    for (const GpuMemory& m : g.memory)
      mem.push_back({{"device", m.device}, {"before", m.before}, {"after", m.after}, {"worst", m.worst}});
    j["memory"] = std::move(mem);
  }
  return j;
}

void run_job_plan(const JobPlanArgs& a) {
  if (a.from_plan.empty() || a.to_plan.empty()) throw Error("--job needs --from-plan and --to-plan");
  const JobSpec job = load_job(a.job);
  std::int64_t device_count = 0;
  TransitionRequest req;
  req.job = &job;
  if (!a.cluster.empty()) {
    const ClusterSpec c = load_cluster(a.cluster);
    req.links = LinkModel::of(c);
    device_count = c.gpus();
    req.memory.capacity = static_cast<std::uint64_t>(c.gpu_memory_gib * 1024 * 1024 * 1024);
  } else {
    req.links = LinkModel::of(load_cluster("h200-node"));
  }
  if (a.gpus_per_node > 0) req.links.gpus_per_node = a.gpus_per_node;
  if (!a.capacity.empty()) req.memory.capacity = parse_capacity(a.capacity);
  if (!(a.headroom >= 0 && a.headroom < 1)) throw Error("--headroom must be in [0, 1), got " + std::to_string(a.headroom));
  req.memory.headroom = a.headroom;
  const auto stages = model_stages(job);
  auto check_stage = [&](const std::string& name, const char* flag) {
    if (std::none_of(stages.begin(), stages.end(), [&](const ModelStage& s) { return s.name() == name; }))
      throw Error(std::string(flag) + ": '" + name + "' is not a model-stage of this job");
  };
  for (const std::string& w : a.workspace) {
    const auto eq = w.find('=');
    if (eq == std::string::npos) throw Error("--workspace '" + w + "' must be STAGE=SIZE (e.g. actor/train=8GiB)");
    check_stage(w.substr(0, eq), "--workspace");
    req.memory.workspace.emplace_back(w.substr(0, eq), parse_capacity(w.substr(eq + 1)));
  }
  req.stale.assign(stages.size(), false);
  for (const std::string& s : a.stale) {
    check_stage(s, "--stale");
    for (std::size_t i = 0; i < stages.size(); ++i)
      if (stages[i].name() == s) req.stale[i] = true;
  }
  auto load = [&](const std::string& flag, const std::string& arg) {
    try {
      return plan_collections(job, load_global_plan(job, arg), device_count);
    } catch (const Error& e) {
      throw Error(flag + ": " + e.what());
    }
  };
  req.from = load("--from-plan", a.from_plan);
  req.to = load("--to-plan", a.to_plan);
  const TransitionGraph g = compile_transition(req);

  if (a.json) {
    nlohmann::json j = transition_json(g, a.nodes);
    j["job"] = a.job;
    std::cout << j.dump() << "\n";
  } else {
    const TransitionSummary& s = g.summary;
    std::cout << fmt::format("job          {} ({}, {} model-stages)\n", a.job, to_string(job.algorithm), g.stages.size());
    if (g.feasibility.ok)
      std::cout << fmt::format("feasible     yes: worst case {} on GPU {} of a {} budget\n", human_bytes(g.feasibility.worst_bytes),
                               g.feasibility.worst_device,
                               req.memory.capacity ? human_bytes(g.feasibility.budget) : std::string("unlimited"));
    else
      std::cout << fmt::format("feasible     NO: {}\n", g.feasibility.reason);
    std::cout << fmt::format("moved        {} over links, {} local, {} built{}\n", human_bytes(s.moved_bytes),
                             human_bytes(s.local_bytes), human_bytes(s.target_bytes),
                             s.memory_first ? " (memory first: whole replicas from other GPUs, so old units can go first)" : "");
    std::cout << fmt::format("graph        {} builds, {} destroys, {} units kept; edges: {} data, {} commit, {} resource\n",
                             s.builds, s.destroys, s.kept_units, s.data_edges, s.commit_edges, s.resource_edges);
    std::cout << fmt::format("L_tran       {:.4f} s (critical path {:.4f} s, busiest device {:.4f} s); planned in {:.2f} ms\n\n",
                             s.l_tran_seconds, s.critical_path_seconds, s.link_bound_seconds, s.plan_ms);
    std::cout << fmt::format("{:<18} {:<10} {:>4} {:>5} {:>7} {:>10}  {}\n", "model-stage", "strategy", "kept", "built",
                             "destroy", "moved", "why");
    for (const StageDecision& d : g.decisions)
      std::cout << fmt::format("{:<18} {:<10} {:>4} {:>5} {:>7} {:>10}  {}\n", d.model_stage, d.strategy, d.kept, d.built,
                               d.destroyed, human_bytes(d.moved_bytes), d.why);
    if (a.nodes) {
      std::cout << fmt::format("\n{:>5} {:<8} {:<18} {:<7} {:<16} {:>10} {:>9} {:>9}  {}\n", "node", "kind", "model-stage",
                               "unit", "GPUs", "moved", "start", "seconds", "after");
      for (std::size_t x = 0; x < g.nodes.size(); ++x) {
        const GraphNode& n = g.nodes[x];
        std::string after;
        for (const Edge& e : n.after) after += fmt::format("{}{}({})", after.empty() ? "" : " ", e.node, to_string(e.kind)[0]);
        std::string gpus = device_list_string(g.emu(n.unit).gpus);
        if (gpus.size() > 16) gpus = gpus.substr(0, 13) + "...";
        std::cout << fmt::format("{:>5} {:<8} {:<18} {:<7} {:<16} {:>10} {:>9.5f} {:>9.5f}  {}\n", x, to_string(n.kind),
                                 g.stages[n.unit.stage], fmt::format("{} {}", n.unit.target ? "new" : "old", n.unit.unit),
                                 gpus, n.is_build() ? human_bytes(n.moved_bytes) : "", n.start, n.seconds, after);
      }
    }
  }
  if (!g.feasibility.ok) throw CLI::RuntimeError(3);
}

}  // namespace nereus::cli
