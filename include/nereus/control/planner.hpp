#pragma once
// The planner (architecture.md, "Controller"): a global plan S* for a job on a GPU pool
// that minimises the predicted step latency under the GPU-pool and memory constraints.
//
// Per model-stage, a frontier of non-dominated candidates (time, GPUs, resident and
// transient memory per GPU; TP groups inside a node). Then dynamic programming over
// Pareto sets: the stages of a phase run side by side on disjoint GPUs (their GPUs add
// up, at most the pool; time, memory: the largest), phases run one after another on the
// same GPUs (times add up; resident memory adds up, since a GPU keeps one model-stage of
// each phase; transient memory: the largest, since one stage runs at a time). A plan is
// feasible when resident + transient + overhead fits the GPU with 10% headroom.
//
// Async jobs (JobSpec::async) split the pool instead: generation on G GPUs, the other
// phases on the rest, each half searched as above; a generation GPU also holds a staged
// copy of its params (the next weight version arrives beside the one in use). The step
// is the period of the two streams (async_step_seconds), over every split G: powers of
// two below a node and whole nodes, generation on the pool's last G GPUs.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nereus/core/global_plan.hpp"
#include "nereus/control/cost_model.hpp"

namespace nereus {

/// How a model-stage holds its tensors: the user's choice, which every plan the planner
/// proposes keeps (it chooses parallelism and placement, never packing or dtype).
struct Representation {
  Packing packing = Packing::hf;
  bool fp8 = false;  ///< dtype=fp8: its layouts, and its training stage's, split on FP8 blocks
  bool operator==(const Representation&) const = default;
};
/// Each model-stage's representation in `plan` (its first unit's).
std::map<std::string, Representation> representation_of(const GlobalPlan& plan);

struct PlannerOptions {
  double headroom = 0.1;
  int max_pp = 8;
  /// GPU counts a model-stage may take beyond one node are whole nodes (keeps the search
  /// small at large pools; 0: automatic, whole nodes above 64 GPUs).
  int granularity = 0;
  /// By model-stage; a stage not named holds hf packing in the config's dtype.
  std::map<std::string, Representation> representation;
  /// Training stages of dense models may also take FSDP (fsdp = 2, 4, 8). Off unless a
  /// job uses FSDP: the controller sets it when the current plan has an FSDP stage, and
  /// the simulator's ground truth does not model FSDP.
  bool fsdp = false;
};

/// One model-stage's choice and what the cost model predicts for it.
struct PlannedStage {
  std::string model_stage;
  Candidate candidate;
  double seconds = 0;
  StageMemory memory;
};

/// The planner's answer.
struct PlanChoice {
  bool feasible = false;
  std::string reason;               ///< when not feasible
  std::vector<PlannedStage> stages; ///< job stage order
  GlobalPlan plan;                  ///< with device lists
  double step_seconds = 0;          ///< predicted
  std::uint64_t peak_memory_bytes = 0;  ///< predicted, busiest GPU, overhead included
  double decision_ms = 0;
  std::size_t candidates = 0;       ///< evaluated
  std::size_t frontier = 0;         ///< kept on the per-stage frontiers
  bool fast_path = false;           ///< each phase at its fastest fitted together
  int generation_gpus = 0;          ///< async: GPUs of the generation half (the pool's last ones)
};

/// The period of an async job's two streams, steady state (runtime/weight_update.hpp):
/// generation runs of `generation` seconds one after another; training steps of `rest`
/// seconds (inference and training stages) each followed by an update the next training
/// step and the generation run it feeds wait `update` seconds for; generation run k needs
/// the version training step k − 1 − max_staleness made. So the period is the largest of
/// the generation stream, the training stream, and the cycle through both
/// (generation + rest + update) spread over max_staleness + 1 steps in flight.
double async_step_seconds(double generation, double rest, double update, std::int64_t max_staleness);

/// Every candidate of one model-stage on a pool of `gpus` (before pruning).
std::vector<Candidate> stage_candidates(const ModelStage& stage, int gpus, const ClusterSpec& cluster,
                                        std::int64_t sequences, const PlannerOptions& options = {});

/// S* for `job` on `gpus` GPUs under workload `w`.
PlanChoice plan_job(const CostModel& model, const JobSpec& job, int gpus, const Workload& w,
                    const PlannerOptions& options = {});

/// Every plan of the planner's final Pareto set (step time; resident and transient bytes
/// per GPU), fastest first: S*, then plans slower but leaner in memory. The controller's
/// urgent path tries them when S* cannot be reached. Empty when no plan fits.
std::vector<PlanChoice> plan_frontier(const CostModel& model, const JobSpec& job, int gpus, const Workload& w,
                                      const PlannerOptions& options = {});

/// The same optimum by trying every combination of candidates (small cases, tests).
PlanChoice plan_job_exhaustive(const CostModel& model, const JobSpec& job, int gpus, const Workload& w,
                               const PlannerOptions& options = {});

/// What the cost model predicts for a given plan: step latency on the execution-overlap
/// graph, and the busiest GPU's memory (every model-stage placed on it, the largest
/// transient, overhead).
struct PlanEstimate {
  double step_seconds = 0;
  std::uint64_t peak_memory_bytes = 0;
  bool fits = false;  ///< peak within capacity × (1 − headroom)
  bool recompute = false;  ///< training stages recompute activations (the full ones do not fit)
  std::vector<double> stage_seconds;
  DeviceId peak_device = -1;  ///< the busiest GPU
  std::string peak_stage;     ///< the model-stage whose working memory sets that GPU's peak
  std::uint64_t budget_bytes = 0;  ///< what fits a GPU: capacity × (1 − headroom), overhead included
  /// Async jobs: the streams' seconds (step_seconds is their period), and why the plan
  /// cannot run asynchronously (a GPU shared by generation and training; fits is false).
  double generation_seconds = 0, training_seconds = 0, update_seconds = 0;
  std::string refusal;
};
PlanEstimate estimate_plan(const CostModel& model, const JobSpec& job, const GlobalPlan& plan, const Workload& w,
                           double headroom = 0.1);

/// The candidate a collection spec describes (recompute as chosen for training).
Candidate candidate_of(const CollectionSpec& spec, bool recompute = false);

/// Lays out chosen candidates on GPUs 0..: per phase, model-stages in descending unit size
/// on consecutive blocks, so TP groups (powers of two, at most a node) stay inside a node;
/// each stage in its representation.
/// Async jobs: generation from GPU `generation_at` on, the other phases from GPU 0.
GlobalPlan place(const JobSpec& job, const std::vector<PlannedStage>& stages,
                 const std::map<std::string, Representation>& representation = {}, int generation_at = 0);

/// The layouts of `plan` placed again to spread memory: phase by phase, each unit (largest
/// first) on the free aligned block of its size (inside one node when it fits one) whose
/// busiest GPU would hold the least. The controller's urgent path tries it when the
/// planner's packing from GPU 0 overflows a GPU. Empty when the units do not fit the pool.
std::optional<GlobalPlan> place_balanced(const CostModel& model, const JobSpec& job, const GlobalPlan& plan, int gpus,
                                         const Workload& w);

}  // namespace nereus
