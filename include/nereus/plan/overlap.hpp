#pragma once
// The execution-overlap graph of one RL step under a global plan: which model-stages run
// side by side (disjoint GPUs) and which wait for one another (phase order, or a GPU they
// share).
#include <span>
#include <string>
#include <vector>

#include "nereus/core/global_plan.hpp"

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

  std::vector<std::vector<bool>> reach;  ///< reach[i][j]: j waits, directly or not, for i
};

/// The graph of `plan`: every stage of a phase waits for every stage of the phase before
/// (generation → inference → training, sync mode); stages of one phase that share a GPU
/// run one after the other, in the job's role order.
OverlapGraph overlap_graph(const JobSpec& job, const GlobalPlan& plan);

}  // namespace nereus
