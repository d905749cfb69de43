#pragma once
// `nereus plan --job J --from-plan P --to-plan Q`: the global transition graph of a job's
// plan change, its cost and its memory check (no bytes move).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nereus/plan/transition_graph.hpp"

namespace nereus::cli {

struct JobPlanArgs {
  std::string job, from_plan, to_plan, cluster, capacity;
  std::vector<std::string> workspace;  ///< STAGE=SIZE
  std::vector<std::string> stale;      ///< model-stages whose params are about to be replaced
  double headroom = 0.1;
  bool json = false;
  bool nodes = false;
  int gpus_per_node = 0;
};

void run_job_plan(const JobPlanArgs& a);

/// The graph as JSON: summary, feasibility, per-stage decisions, and (with nodes) every
/// node with its edges and the per-GPU memory.
nlohmann::json transition_json(const TransitionGraph& g, bool nodes);

}  // namespace nereus::cli
