#pragma once
// The simulator (`nereus simulate`): replays a drift trace on a virtual cluster through the
// real controller and transition graph, with the ground-truth hardware model standing in
// for the GPUs. Per step: the controller sees the pool and the last step's signals and
// may change plan (the transition's time comes from its graph with the hardware's link
// efficiency); the step runs on the true hardware (a plan whose true peak exceeds a GPU
// fails the step: out of memory); measured stage times calibrate the cost model.
#include <string>
#include <vector>

#include "nereus/control/controller.hpp"
#include "nereus/sim/trace.hpp"

namespace nereus {

struct SimulationOptions {
  ControllerOptions controller;
  std::uint64_t seed = 1;
  double noise = 0.03;  ///< of measured stage times (lognormal σ)
};

/// One step of the run.
struct StepRecord {
  long step = 0;
  int gpus = 0;
  double response_len_mean = 0;
  double link_slowdown = 1;
  double seconds = 0;             ///< the step's true time
  double predicted_seconds = 0;   ///< the cost model's prediction for it
  double transition_seconds = 0;  ///< before this step
  std::uint64_t peak_bytes = 0;   ///< true, busiest GPU
  bool oom = false;
  std::string plan;               ///< short form: tp/pp/dp per model-stage
  std::string trigger, decision;
};

struct SimulationResult {
  long steps = 0;
  double mean_step_seconds = 0;
  double total_seconds = 0;
  double transition_seconds = 0;
  double exposed_transition_seconds = 0;
  int transitions = 0;
  int oom_steps = 0;
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

/// One JSON object per step.
std::string timeline_jsonl(const SimulationResult& r);
/// Step latency over steps, transitions marked, GPU pool on a second axis.
std::string plot_svg(const SimulationResult& r, const std::string& title);

}  // namespace nereus
