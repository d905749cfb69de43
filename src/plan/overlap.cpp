#include "nereus/plan/overlap.hpp"

#include <algorithm>
#include <limits>
#include <set>

namespace nereus {

int OverlapGraph::index(std::string_view model_stage) const {
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (stages[i].name() == model_stage) return static_cast<int>(i);
  return -1;
}

bool OverlapGraph::concurrent(int i, int j) const {
  return i != j && !reach[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] &&
         !reach[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)];
}

double OverlapGraph::step_seconds(std::span<const double> stage_seconds) const { return step_seconds(stage_seconds, {}); }

double OverlapGraph::step_seconds(std::span<const double> stage_seconds, const std::map<std::string, double>& release) const {
  // Stages are listed in an order where every predecessor comes first.
  std::vector<double> finish(stages.size(), 0);
  double step = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    double start = 0;
    if (!release.empty())
      if (auto r = release.find(stages[i].name()); r != release.end()) start = r->second;
    for (int p : after[i]) start = std::max(start, finish[static_cast<std::size_t>(p)]);
    finish[i] = start + (i < stage_seconds.size() ? stage_seconds[i] : 0.0);
    step = std::max(step, finish[i]);
  }
  return step;
}

OverlapGraph overlap_graph(const JobSpec& job, const GlobalPlan& plan) {
  OverlapGraph g;
  const auto phases = job.phases();
  for (std::size_t p = 0; p < phases.size(); ++p)
    for (const ModelStage& s : phases[p]) {
      g.stages.push_back(s);
      g.phase.push_back(static_cast<int>(p));
    }
  const std::size_t n = g.stages.size();
  std::vector<std::set<DeviceId>> gpus(n);
  for (std::size_t i = 0; i < n; ++i)
    if (const CollectionSpec* c = plan.find(g.stages[i].name())) gpus[i].insert(c->devices.begin(), c->devices.end());
  g.after.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j) {
      const bool earlier_phase = g.phase[j] + 1 == g.phase[i];
      const bool shares = g.phase[j] == g.phase[i] &&
                          std::any_of(gpus[i].begin(), gpus[i].end(), [&](DeviceId d) { return gpus[j].count(d) > 0; });
      if (earlier_phase || shares) g.after[i].push_back(static_cast<int>(j));
    }
  g.reach.assign(n, std::vector<bool>(n, false));
  for (std::size_t i = 0; i < n; ++i)
    for (int p : g.after[i]) {
      g.reach[static_cast<std::size_t>(p)][i] = true;
      for (std::size_t k = 0; k < n; ++k)
        if (g.reach[k][static_cast<std::size_t>(p)]) g.reach[k][i] = true;
    }
  return g;
}

BesideSteps beside_steps(const TransitionGraph& g, const JobSpec& job, double early, double shared_link_slowdown) {
  std::map<std::string, bool> trains;
  for (const ModelStage& s : model_stages(job)) trains[s.role] = trains[s.role] || s.kind == StageKind::train;
  // Node times are the graph's critical path; a link-bound graph takes longer in all.
  const double stretch =
      g.summary.critical_path_seconds > 0 ? std::max(1.0, g.summary.l_tran_seconds / g.summary.critical_path_seconds) : 1.0;
  std::vector<double> finish(g.nodes.size());
  BesideSteps out;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const GraphNode& node = g.nodes[k];
    const std::string& stage = g.stages[node.unit.stage];
    const std::string role = stage.substr(0, stage.find('/'));
    double start = trains[role] ? 0.0 : early;
    for (const Edge& e : node.after) start = std::max(start, finish[e.node]);
    const bool alone = start >= 0 && g.phase[node.unit.stage] == 0;
    finish[k] = start + node.seconds * stretch * (alone ? 1.0 : shared_link_slowdown);
    first = std::min(first, start);
    last = std::max(last, finish[k]);
    if (node.is_build() && node.unit.target) out.ready[stage] = std::max(out.ready[stage], finish[k]);
  }
  out.span = g.nodes.empty() ? 0 : last - first;
  return out;
}

}  // namespace nereus
