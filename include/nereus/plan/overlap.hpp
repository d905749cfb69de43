#pragma once
// The execution-overlap graph of one RL step under a global plan: which model-stages run
// side by side (disjoint GPUs) and which wait for one another (phase order, or a GPU they
// share).
#include <map>
#include <span>
#include <string>
#include <vector>

#include "nereus/core/global_plan.hpp"
#include "nereus/plan/transition_graph.hpp"

namespace nereus {

/// Model-stages as nodes; `after[i]` lists the stages i waits for within a step.
struct OverlapGraph {
  std::vector<ModelStage> stages;       ///< job stage order
  std::vector<int> phase;               ///< 0 generate, 1 infer, 2 train
  std::vector<std::vector<int>> after;  ///< direct predecessors of each stage

  int index(std::string_view model_stage) const;  ///< -1 when absent
  /// Whether i may run while j runs: neither waits, directly or not, for the other.
  bool concurrent(int i, int j) const;
  /// Step latency from per-stage durations: the longest path through the graph.
  double step_seconds(std::span<const double> stage_seconds) const;
  /// The same when stages cannot start before `release` (seconds from the step's start,
  /// by model-stage name; absent: no wait): a transition beside the step.
  double step_seconds(std::span<const double> stage_seconds, const std::map<std::string, double>& release) const;

  std::vector<std::vector<bool>> reach;  ///< reach[i][j]: j waits, directly or not, for i
};

/// The graph of `plan`: every stage of a phase waits for every stage of the phase before
/// (generation → inference → training, sync mode); stages of one phase that share a GPU
/// run one after the other, in the job's role order.
OverlapGraph overlap_graph(const JobSpec& job, const GlobalPlan& plan);

/// A transition run beside the steps, as the job runtime runs it: state of a role that
/// trains can move only after its optimizer step (the step boundary); frozen models'
/// units from `early` on (< 0: that many seconds before the boundary, once the previous
/// step's generation is done). Copies the next step's generation waits for run alone on
/// their links; the others share them with the stages' collectives and run
/// `shared_link_slowdown` times slower.
struct BesideSteps {
  std::map<std::string, double> ready;  ///< model-stage → when its last new unit is built, from the boundary
  double span = 0;                      ///< first node's start to last node's end
};
BesideSteps beside_steps(const TransitionGraph& g, const JobSpec& job, double early, double shared_link_slowdown);

}  // namespace nereus
