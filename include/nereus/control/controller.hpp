#pragma once
// The controller (architecture.md, "Controller"): monitor → planner → admission.
//
// Triggers: a change of the GPU pool or a predicted memory violation of the current plan
// (urgent when the current plan can no longer run); a drifting signal — mean response
// length, inter-node link slowdown, or the current plan's predicted latency under the
// calibrated model ("model") — beyond δ of its reference value. References reset at
// every replan, also when the candidate is rejected. Admission: urgent → the first
// feasible transition; otherwise ΔL > 0 and L_tran / ΔL ≤ γ·H_x (L_tran: what the steps
// wait for the transition, when it runs beside them — ControllerOptions::beside_steps), with H_x the moving
// average of steps between crossings of the triggering signal (1 before the first
// interval; the smallest H_x when several trigger). When S* cannot be reached, slightly
// slower candidates that keep more of the current plan are tried — S* with one model-stage
// kept, and the current layouts with DP scaled to the pool; when one of them is admitted
// (more than δ/3 slower than S*), the next step replans once more ("retry") from the plan
// it reached, over the same horizon.
//
// The urgent path (the current plan cannot run the next step) never ends in "stay": after
// those candidates it tries the planner's whole frontier (slower plans that hold less per
// GPU), each candidate's layouts placed again to spread memory, and intermediate plans
// that move one model-stage towards a candidate (the retry then goes on from there), until
// one is both runnable (the cost model fits it) and reachable (its transition graph fits
// every GPU). When none is, the decision is `blocked`, and its `why` names the step, the
// model-stage, the GPU and the shortfall: the job cannot go on.
//
// Async jobs (JobSpec::async): the planner splits the pool between generation and the
// rest, and predicted step latency is the two streams' period (planner.hpp,
// async_step_seconds); calibration is the same per stage. A plan change drains both
// streams, so it never runs beside the steps: admission charges L_tran plus the drain
// (the first step on the new plan runs its generation and training one after the other).
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "nereus/control/calibration.hpp"
#include "nereus/control/planner.hpp"
#include "nereus/plan/transition_graph.hpp"

namespace nereus {

/// Which plan changes a controller makes (interfaces.md, `nereus simulate --policy`).
enum class Policy : std::uint8_t {
  fixed,      ///< "static" (the paper's baseline): TP/PP planned for the first step, DP scaled with the pool
  fixed_max,  ///< "static-max": the same, but planned for the job's max_response_len (knows the worst case)
  every,   ///< switch to the planner's target every K steps
  greedy,  ///< any transition that improves the predicted step latency
  nereus,  ///< payback admission
};

/// Parses "static", "static-max", "every:K", "greedy", "nereus"; K is returned in `every`.
Policy parse_policy(const std::string& text, int& every);

struct ControllerOptions {
  Policy policy = Policy::nereus;
  int every = 3;
  double gamma = 0.5;
  double delta = 0.3;       ///< relative drift that triggers a replan
  double ema = 0.5;         ///< weight of the newest interval in H_x
  double headroom = 0.1;
  int alternatives = 6;     ///< slower candidates tried when S* is out of reach
  int memory_window = 8;    ///< steps whose largest p95 response length sizes memory
  /// Transitions run beside the steps (the job runtime's overlap mode), so admission
  /// charges the seconds the next step is predicted to wait for the new units, not the
  /// whole L_tran. Off: all of L_tran is charged, as when they run between steps (the
  /// paper's setting; the embedded job's controller, which decides after a step and does
  /// not count on the framework running the transition beside the next one).
  bool beside_steps = false;
  /// The controller's assumption of how much slower a copy runs while it shares links with
  /// the stages' collectives (beside_steps).
  double shared_link_slowdown = 2;
  PlannerOptions planner;
};

/// What the monitor sees before a step.
struct Signals {
  long step = 0;
  int gpus = 0;
  double response_len_mean = 0;
  double response_len_p95 = 0;
  double link_slowdown = 1;
};

/// One decision with its numbers (logged for every replan).
struct Decision {
  long step = 0;
  std::string trigger;           ///< "", or pool / memory / length / link / every, comma-separated
  bool urgent = false;
  bool replanned = false;        ///< the planner ran
  bool admitted = false;
  std::string why;
  double current_seconds = 0;    ///< predicted step latency of the current plan (inf: cannot run)
  double target_seconds = 0;     ///< of the admitted (or best rejected) candidate
  double transition_seconds = 0; ///< its L_tran
  double charged_seconds = 0;    ///< what admission charged: L_tran, or with beside_steps the predicted wait
  double horizon_steps = 0;      ///< H_x used
  std::uint64_t moved_bytes = 0;
  double decision_ms = 0;        ///< planner + transition graphs
  GlobalPlan target;             ///< when admitted
  /// Urgent, and no candidate is both runnable and reachable: the next step cannot run on
  /// any plan the controller knows how to reach. `why` says what is short where.
  bool blocked = false;
  /// Candidates tried and refused, each "where it came from: why" (each logged at debug).
  std::vector<std::string> refused;
};

/// A plan the controller may move to: its predicted step latency and where it came from
/// ("S*", "S* keeping actor/train", "frontier 3", ...).
struct PlanOption {
  double seconds = 0;
  GlobalPlan plan;
  std::string source;
};

/// What a running job measured in one step: the live controller's input (the embedding
/// API's report_step).
struct StepObservation {
  Signals next;  ///< before the next step: its number, the pool, lengths and link slowdown seen
  std::vector<std::pair<std::string, double>> stage_seconds;  ///< model-stage → measured seconds
  /// Response lengths the step ran with (0: those in `next`), for its calibration.
  double response_len_mean = 0, response_len_p95 = 0;
  std::uint64_t peak_bytes = 0;  ///< busiest device's measured peak; 0 when not measured
};

class Controller {
 public:
  Controller(const JobSpec& job, const ClusterSpec& cluster, ControllerOptions options = {});

  /// The plan for the first step.
  GlobalPlan initial(const Signals& s);
  /// Before a step: whether to change plan, and to what.
  Decision decide(const Signals& s, const GlobalPlan& current);
  /// After a stage ran: its measured time calibrates the cost model.
  void measure(const ModelStage& stage, const Candidate& c, const Workload& w, double seconds);
  /// After a step: the busiest GPU's measured peak against the cost model's prediction
  /// for it calibrates the memory estimate: the first measurement sets the scale, later
  /// ones raise it at once and lower it slowly.
  void measure_memory(std::uint64_t predicted_peak, std::uint64_t measured_peak);
  /// After a step of a live job on `current`: calibrates from what it measured, then
  /// decides for the next step (the same calibration and admission the simulator runs).
  /// A job that began on a plan of its own (no initial()) takes the first step's signals
  /// as the references drift is measured against.
  /// Throws Error naming a model-stage the job does not have or a negative time.
  Decision step(const GlobalPlan& current, const StepObservation& o);
  /// step()'s calibration alone, from a step that ran on `ran_on` (a transition that ran
  /// beside the step may have changed the plan since: decide() from the new one).
  void observe(const GlobalPlan& ran_on, const StepObservation& o);

  /// `current`'s TP and PP with each model-stage's share of `gpus` GPUs as replicas, inside
  /// the pool: units that do not fit side by side share GPUs and run one after the other.
  /// The static policies' plan on a pool change, and everyone's fallback when no plan fits.
  GlobalPlan rescale(const GlobalPlan& current, int gpus) const;

  const CostModel& model() const { return model_; }
  const Calibrator& calibrator() const { return calibrator_; }
  /// What the controller plans for: `s`'s mean length, memory for the largest p95 of the
  /// last memory_window steps seen by decide() (or `s`'s, when larger).
  Workload workload(const Signals& s) const;
  /// The transition graph S → S* the controller would run (memory from the cost model).
  TransitionGraph transition(const GlobalPlan& from, const GlobalPlan& to, const Signals& s) const;
  /// The seconds the first step on `to` is predicted to wait for `g` run beside the steps
  /// (ControllerOptions::beside_steps) after a step on `from`.
  double exposed_seconds(const GlobalPlan& from, const GlobalPlan& to, const TransitionGraph& g, const Workload& w) const;

 private:
  double horizon(const std::vector<std::string>& signals, long step);
  /// How long before a step's end on `from` its generation is done.
  double generation_lead(const GlobalPlan& from, const Workload& w) const;
  /// exposed_seconds() for a step before that ended `lead` seconds after its generation.
  double wait_for(const GlobalPlan& to, const TransitionGraph& g, const Workload& w, double lead) const;
  void remember(const Signals& s);
  /// The urgent path's candidates after `tried` (urgent_path.cpp): runnable by the cost
  /// model, in the order they are tried.
  std::vector<PlanOption> urgent_options(const GlobalPlan& current, const std::vector<PlanOption>& tried, int gpus,
                                         const Workload& w) const;
  /// Why the step `s` announces cannot run on `current`: the GPU, the model-stage and the shortfall.
  std::string shortfall(const GlobalPlan& current, const Signals& s, const Workload& w) const;

  const JobSpec& job_;
  ClusterSpec cluster_;
  ControllerOptions options_;
  CostModel model_;
  Calibrator calibrator_;
  Signals reference_;
  std::deque<double> recent_p95_;  ///< p95 response lengths of the last memory_window steps
  double reference_seconds_ = 0;  ///< the current plan's predicted latency at the last replan
  double retry_horizon_ = 0;      ///< > 0: the last admitted plan fell short of S*; retry once with this H_x
  std::map<std::string, double> horizon_;    // H_x per signal
  std::map<std::string, long> last_cross_;   // step of the last crossing per signal
  long last_every_ = 0;
  long first_step_ = 0;  ///< the job's first step (initial() or the first step())
  bool memory_measured_ = false;  ///< a peak has calibrated the memory estimate
  bool started_ = false;  ///< references set (initial() or the first step())
  /// The signals static and static-max sized their first plan for (static-max: responses
  /// of max_response_len), and plan for again when a kept unit outgrows the pool.
  Signals static_first_{};
  Signals static_sizing(const Signals& first);
};

}  // namespace nereus
