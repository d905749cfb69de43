#pragma once
// The simulator (`nereus simulate`): replays a drift trace on a virtual cluster through the
// real controller and transition graph, with the ground truth (sim/truth.hpp, written apart
// from the cost model) standing in for the GPUs. Per step: the controller sees the pool and
// the last step's signals and may change plan; the transition runs on its graph with the
// truth's link efficiencies — before the step when the current plan cannot run it (urgent),
// otherwise beside the steps as the job runtime runs it; the step runs on the truth. A step
// whose true memory exceeds a GPU or that needs a GPU outside the pool fails: it costs the
// time until the failing stage, a restart, a checkpoint reload and the step again on a plan
// that fits, and it never calibrates. Every policy is scored by this one loop.
//
// Async jobs (JobSpec::async) run generation and training as two streams on the pool's
// halves, step after step: generation run k starts once the version training step
// k − 1 − max_staleness made has landed, training step k once rollouts k are done and
// its previous update has been read; each update is the planner's sync transfers timed
// by the truth's copy model (GroundTruth::copy_seconds). A step's seconds are the time
// between two training steps' ends. A plan change or a failure drains both streams
// first (the transition runs in the open).
#include <functional>
#include <string>
#include <vector>

#include "nereus/control/controller.hpp"
#include "nereus/sim/trace.hpp"

namespace nereus {

struct SimulationOptions {
  ControllerOptions controller;
  std::uint64_t seed = 1;
  double noise = 0.03;  ///< of measured stage times (lognormal σ)
  /// Stage runs profiled before the first step, as a job profiles before it starts: each
  /// where the op class measured least so far weighs most, at 1, 2 or 4 times the first
  /// step's response length. They calibrate the cost model and are not counted in the run.
  int profile_runs = 24;
  /// Transitions run beside the steps as the job runtime runs them (true), or all at step
  /// boundaries with nothing hidden, as the paper measured them (false). The controller is
  /// told (ControllerOptions::beside_steps).
  bool overlap = true;
  /// Called after each step with the number of steps done (progress displays).
  std::function<void(std::size_t)> on_step;
};

/// One step of the run.
struct StepRecord {
  long step = 0;
  int gpus = 0;
  double response_len_mean = 0;
  double link_slowdown = 1;
  double seconds = 0;             ///< what the step cost: compute, waits for transitions, failure
  double predicted_seconds = 0;   ///< the cost model's prediction (steps that ran)
  double transition_seconds = 0;  ///< the transition that took effect at this step, as it ran
  double exposed_seconds = 0;     ///< of it, the time the step waited
  double failure_seconds = 0;     ///< lost to a failure: until it, restart, reload
  std::uint64_t peak_bytes = 0;   ///< true, busiest GPU
  bool failed = false;
  bool oom = false;               ///< failed for memory
  std::string failure;            ///< which stage failed, and why
  /// Async jobs: the streams' seconds on the truth and the weight update's copy.
  double generation_seconds = 0, training_seconds = 0, update_seconds = 0;
  std::string plan;               ///< short form: tp/pp/dp (then eEP/ETP when ep > 1) per model-stage
  std::string trigger, decision;
};

struct SimulationResult {
  long steps = 0;
  double mean_step_seconds = 0;       ///< the paper's metric: transitions' waits and failures included
  double mean_compute_seconds = 0;    ///< the steps' own run time
  double total_seconds = 0;
  double transition_seconds = 0;      ///< transitions as they ran
  double exposed_transition_seconds = 0;
  double failure_seconds = 0;
  int transitions = 0;
  int failed_steps = 0;
  int oom_steps = 0;                  ///< failed steps that ran out of memory
  int replans = 0;
  double decision_ms_median = 0;
  double decision_ms_max = 0;
  double mape = 0, max_ape = 0;        ///< calibrated cost model on held-out stage runs
  double mape_prior = 0;               ///< the same with the starting efficiencies
  std::array<double, kOpClasses> efficiency{};
  std::vector<StepRecord> records;
  std::vector<Decision> decisions;     ///< every replan
};

SimulationResult simulate(const ClusterSpec& cluster, const JobSpec& job, const std::vector<TraceStep>& trace,
                          const SimulationOptions& options);

}  // namespace nereus
