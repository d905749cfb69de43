// The simulator's replay loop: the real controller decides, the ground truth runs steps,
// the truth runs the admitted transition graphs (its own link model, beside the steps as
// the job runtime lets them, truth_transition.cpp), and failed steps cost what a real
// failure costs. Every policy is scored by the same loop.
#include "nereus/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "nereus/base/error.hpp"
#include "nereus/plan/overlap.hpp"
#include "nereus/plan/primitives.hpp"
#include "nereus/sim/truth.hpp"

namespace nereus {

namespace {

// A failed step restarts the job: processes, NCCL communicators, model loading code. A
// minute is the order a Megatron or OpenRLHF relaunch takes before it reads checkpoints.
constexpr double kRestartSeconds = 60;

std::string short_plan(const JobSpec& job, const GlobalPlan& p) {
  std::string s;
  for (const ModelStage& st : model_stages(job)) {
    const CollectionSpec& c = *p.find(st.name());
    s += (s.empty() ? "" : " ") + st.role.substr(0, 1) + std::string(to_string(st.kind)).substr(0, 1) + "=" +
         std::to_string(c.layout.tp) + "/" + std::to_string(c.layout.pp) + "/" + std::to_string(c.dp);
    if (c.layout.ep > 1)  // expert parallelism: ep, and the expert TP degree
      s += "e" + std::to_string(c.layout.ep) + "/" + std::to_string(c.layout.expert_tp());
  }
  return s;
}

/// A model-stage whose every unit had a GPU that left the pool reloads from a checkpoint:
/// each GPU of its new units reads its resident state at its share of the node's NICs.
double reload_seconds(GroundTruth& truth, const JobSpec& job, const GlobalPlan& from, const GlobalPlan& to, int gpus,
                      const TruthLoad& load) {
  const std::vector<Collection> before = plan_collections(job, from);
  double out = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const bool lost = std::all_of(before[i].units.begin(), before[i].units.end(), [&](const Emu& e) {
      return std::any_of(e.gpus.begin(), e.gpus.end(), [&](DeviceId d) { return d >= gpus; });
    });
    if (!lost) continue;
    const ModelStage s = model_stages(job)[i];
    const CollectionSpec& spec = *to.find(s.name());
    const TruthLayout l{spec.layout.tp, spec.layout.pp, spec.dp, false, spec.layout.ep, spec.layout.expert_tp()};
    out = std::max(out, double(truth.memory(s.model->config(), s.kind, l, load).resident) / truth.checkpoint_bytes_per_second());
  }
  return out;
}

TruthLoad load_of(const JobSpec& job, const TraceStep& t) {
  TruthLoad w;
  w.sequences = job.prompts_per_step * job.samples_per_prompt;
  w.prompt_len = double(job.prompt_len);
  w.response_mean = t.response_len_mean;
  w.response_p95 = t.response_len_p95;
  w.max_response = double(job.max_response_len);
  w.link_slowdown = t.link_slowdown;
  return w;
}

/// One step of `plan` on the truth.
struct StepRun {
  std::vector<double> stage_seconds;  ///< overlap-graph order
  double seconds = 0;                 ///< critical path, waits for transitions included
  double unhindered_seconds = 0;      ///< the same without waiting for transitions
  double generation_done = 0;         ///< when the last generation stage finished
  /// Async jobs: the generation stream's seconds, and the other stages' critical path.
  double generation_seconds = 0, rest_seconds = 0;
  std::uint64_t peak = 0;             ///< busiest GPU (KV cache as far as it is used)
  std::uint64_t resident_max = 0;     ///< most state one GPU holds (what a reload reads)
  bool failed = false, oom = false;
  double failed_after = 0;            ///< seconds into the step when it failed
  std::string why;
};

StepRun run_step(GroundTruth& truth, const JobSpec& job, const GlobalPlan& plan, const TruthLoad& load, int gpus,
                 bool recompute, const std::map<std::string, double>& release = {}) {
  // An async job's generation GPUs also hold the next version while it is staged.
  const bool staged = job.async;
  StepRun r;
  const OverlapGraph og = overlap_graph(job, plan);
  const std::size_t n = og.stages.size();
  std::vector<TruthLayout> layouts(n);
  std::vector<TruthStage> mem(n);
  std::map<DeviceId, std::uint64_t> resident, working;
  std::vector<std::string> fail(n);
  for (std::size_t i = 0; i < n; ++i) {
    const ModelStage& s = og.stages[i];
    const CollectionSpec& spec = *plan.find(s.name());
    layouts[i] = {spec.layout.tp, spec.layout.pp, spec.dp, recompute && s.kind == StageKind::train, spec.layout.ep,
                  spec.layout.expert_tp()};
    mem[i] = truth.memory(s.model->config(), s.kind, layouts[i], load);
    for (DeviceId d : spec.devices) {
      if (d >= gpus && fail[i].empty()) fail[i] = "needs GPU " + std::to_string(d) + ", outside the pool of " + std::to_string(gpus);
      resident[d] += mem[i].resident * (staged && s.kind == StageKind::generate ? 2 : 1);
      working[d] = std::max(working[d], mem[i].working);
    }
  }
  const std::uint64_t cap = truth.capacity_bytes(), ctx = truth.context_bytes();
  std::vector<std::uint64_t> pool(n, 0);
  std::vector<double> kv_used(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const ModelStage& s = og.stages[i];
    const CollectionSpec& spec = *plan.find(s.name());
    std::uint64_t free_min = std::numeric_limits<std::uint64_t>::max();
    for (DeviceId d : spec.devices) {
      const std::uint64_t base = ctx + resident[d];
      r.resident_max = std::max(r.resident_max, resident[d]);
      const std::uint64_t need = base + mem[i].working;
      if (need > cap && fail[i].empty())
        fail[i] = "out of memory on GPU " + std::to_string(d) + ": " + std::to_string(need >> 20) + " MiB of " + std::to_string(cap >> 20);
      free_min = std::min(free_min, need > cap ? 0 : cap - need);
      r.peak = std::max(r.peak, std::min(cap, base + working[d]));
    }
    if (s.kind == StageKind::generate && fail[i].empty()) {
      pool[i] = free_min;
      const std::int64_t c = truth.concurrency(s.model->config(), layouts[i], load, pool[i]);
      if (c == 0) fail[i] = "out of memory: the KV cache cannot hold the longest response";
      kv_used[i] = double(c) * double(mem[i].kv_bytes_per_token) * (load.prompt_len + load.response_mean);
      for (DeviceId d : spec.devices)
        r.peak = std::max(r.peak, std::min(cap, ctx + resident[d] + mem[i].working + std::uint64_t(kv_used[i])));
    }
  }
  // Times, then the critical path with the transitions' releases.
  r.stage_seconds.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    if (fail[i].empty()) r.stage_seconds[i] = truth.run_seconds(og.stages[i].model->config(), og.stages[i].kind, layouts[i], load, pool[i]);
  std::vector<double> finish(n), free_finish(n);
  for (std::size_t i = 0; i < n; ++i) {
    double start = 0, free_start = 0;
    for (int p : og.after[i]) start = std::max(start, finish[std::size_t(p)]), free_start = std::max(free_start, free_finish[std::size_t(p)]);
    const auto rel = release.find(og.stages[i].name());
    if (rel != release.end()) start = std::max(start, rel->second);
    if (!fail[i].empty() && !r.failed) {
      r.failed = true;
      r.oom = fail[i].find("memory") != std::string::npos;
      r.failed_after = start;
      r.why = og.stages[i].name() + ": " + fail[i];
    }
    finish[i] = start + r.stage_seconds[i];
    free_finish[i] = free_start + r.stage_seconds[i];
    r.seconds = std::max(r.seconds, finish[i]);
    r.unhindered_seconds = std::max(r.unhindered_seconds, free_finish[i]);
    if (og.phase[i] == 0) r.generation_done = std::max(r.generation_done, free_finish[i]);
  }
  // The streams apart: generation's stages side by side, the rest without generation.
  std::vector<double> rest_finish(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (og.phase[i] == 0) {
      r.generation_seconds = std::max(r.generation_seconds, r.stage_seconds[i]);
      continue;
    }
    double start = 0;
    for (int p : og.after[i]) start = std::max(start, rest_finish[std::size_t(p)]);
    rest_finish[i] = start + r.stage_seconds[i];
    r.rest_seconds = std::max(r.rest_seconds, rest_finish[i]);
  }
  return r;
}

/// An async job's weight update on `plan`, as the planner moves it: each generation
/// stage's params from its role's training stage, summed per sender and receiver.
std::vector<TruthFlow> update_flows(const JobSpec& job, const GlobalPlan& plan) {
  const std::vector<Collection> collections = plan_collections(job, plan);
  std::map<std::pair<int, int>, TruthFlow> pairs;
  for (const Collection& gen : collections) {
    if (!gen.model_stage.ends_with("/generate")) continue;
    for (const Collection& train : collections) {
      if (!train.train || role_of(train.model_stage) != role_of(gen.model_stage)) continue;
      const ReshardPlan moves = compile(train, sync_target(train, gen));
      for (const Transfer& t : moves.transfers()) {
        if (t.local()) continue;
        TruthFlow& f = pairs[{t.src, t.dst}];
        f.src = t.src, f.dst = t.dst;
        f.bytes += t.bytes;
        ++f.messages;
      }
    }
  }
  std::vector<TruthFlow> out;
  for (const auto& [key, f] : pairs) out.push_back(f);
  return out;
}

/// One stage alone on its GPUs (profiling, held-out checks): its measured seconds, or 0
/// when it does not fit.
double single_run(GroundTruth& truth, const ModelStage& st, const Candidate& c, const TruthLoad& load) {
  const TruthLayout l{c.tp, c.pp, c.dp, c.recompute, c.ep, c.expert_tp()};
  const TruthStage m = truth.memory(st.model->config(), st.kind, l, load);
  const std::uint64_t used = truth.context_bytes() + m.resident + m.working;
  if (used > truth.capacity_bytes()) return 0;
  const double t = truth.run_seconds(st.model->config(), st.kind, l, load, truth.capacity_bytes() - used);
  return std::isfinite(t) ? t : 0;
}

/// Profiling before the job starts: single stage runs on otherwise empty GPUs at 1, 2 and
/// 4 times the first step's response length. Each run is chosen where the op class known
/// least so far takes the largest share of the predicted time, so that every class the
/// planner may use is pinned down, not only those of the first plan.
void profile(GroundTruth& truth, Controller& ctl, const JobSpec& job, const ClusterSpec& cluster, const TraceStep& first, int runs) {
  struct Option {
    ModelStage stage;
    Candidate c;
    TraceStep at;
    StageOps work;
    bool tried = false;
  };
  std::vector<Option> pool;
  for (const ModelStage& st : model_stages(job))
    for (const Candidate& c : stage_candidates(st, first.gpus, cluster, job.prompts_per_step * job.samples_per_prompt))
      for (double scale : {1.0, 2.0, 4.0}) {
        Option o{st, c, first, {}, false};
        o.at.response_len_mean *= scale;
        o.at.response_len_p95 *= scale;
        if (job.max_response_len > 0 && o.at.response_len_p95 > double(job.max_response_len)) continue;
        o.work = ctl.model().work(st, c, ctl.workload({0, first.gpus, o.at.response_len_mean, o.at.response_len_p95, 1}));
        pool.push_back(std::move(o));
      }
  // A class's share of an option's time under the current efficiencies.
  auto share = [&](const Option& o, std::size_t k) {
    const auto& eff = ctl.model().efficiency();
    const double total = o.work.seconds(eff);
    return total > 0 && o.work.ideal[k] > 0 ? o.work.ideal[k] / std::max(1e-3, eff[k]) / total : 0.0;
  };
  // Information on a class: Σ share² of the runs so far, counted in runs where the class
  // weighs as much as it can (a class that is never more than 4% of a stage is learnt
  // from runs where it is 4%).
  std::array<double, kOpClasses> info{};
  for (int n = 0; n < runs;) {
    std::array<double, kOpClasses> reach{};
    std::array<Option*, kOpClasses> best{};
    for (Option& o : pool)
      if (!o.tried)
        for (std::size_t k = 0; k < kOpClasses; ++k)
          if (const double x = share(o, k); x > 0.01 && x * x > reach[k]) reach[k] = x * x, best[k] = &o;
    std::size_t cls = kOpClasses;
    for (std::size_t k = 0; k < kOpClasses; ++k)
      if (best[k] && (cls == kOpClasses || info[k] / reach[k] < info[cls] / reach[cls])) cls = k;
    if (cls == kOpClasses) break;
    Option& o = *best[cls];
    o.tried = true;
    const double t = single_run(truth, o.stage, o.c, load_of(job, o.at));
    if (!(t > 0)) continue;  // does not fit: the next best
    for (std::size_t k = 0; k < kOpClasses; ++k) info[k] += share(o, k) * share(o, k);
    ctl.measure(o.stage, o.c, ctl.workload({0, first.gpus, o.at.response_len_mean, o.at.response_len_p95, o.at.link_slowdown}), t);
    ++n;
  }
}

}  // namespace

SimulationResult simulate(const ClusterSpec& cluster, const JobSpec& job, const std::vector<TraceStep>& trace,
                          const SimulationOptions& options) {
  if (trace.empty()) throw Error("simulate: the trace has no steps");
  for (const TraceStep& s : trace)
    if (s.gpus > cluster.gpus())
      throw Error("simulate: step " + std::to_string(s.step) + " asks for " + std::to_string(s.gpus) +
                  " GPUs but the cluster has " + std::to_string(cluster.gpus()));
  GroundTruth truth(cluster, options.seed, options.noise);
  // The controller knows how the runtime runs transitions: beside the steps, it charges
  // what the steps are predicted to wait for them.
  ControllerOptions control = options.controller;
  control.beside_steps = options.overlap;
  Controller ctl(job, cluster, control);
  const auto stages = model_stages(job);
  auto signals = [&](std::size_t k, std::size_t seen) {
    // The pool is known before step k; lengths and link speed only from the last step run.
    return Signals{trace[k].step, trace[k].gpus, trace[seen].response_len_mean, trace[seen].response_len_p95,
                   trace[seen].link_slowdown};
  };
  profile(truth, ctl, job, cluster, trace[0], options.profile_runs);
  GlobalPlan plan = ctl.initial(signals(0, 0));
  bool force_recompute = false;  // the framework's own fallback after a failure
  SimulationResult r;
  std::vector<double> decision_ms;
  StepRun previous;
  double compute = 0;
  // Async jobs: the two streams across steps, in seconds from the run's start: when the
  // generation stream is free, and per step when training ended and its update landed.
  double generation_free = 0;
  std::vector<double> trained, updated;
  std::string flows_of;  // the plan `flows` were made for
  std::vector<TruthFlow> flows;
  for (std::size_t k = 0; k < trace.size(); ++k) {
    StepRecord rec;
    rec.step = trace[k].step;
    rec.gpus = trace[k].gpus;
    rec.response_len_mean = trace[k].response_len_mean;
    rec.link_slowdown = trace[k].link_slowdown;
    const Signals seen = signals(k, k > 0 ? k - 1 : 0);
    std::map<std::string, double> release;
    double before = 0;  // an urgent transition's time, spent before the step starts
    if (k > 0) {
      Decision d = ctl.decide(seen, plan);
      rec.trigger = d.trigger;
      if (d.replanned || d.admitted) {
        ++r.replans;
        decision_ms.push_back(d.decision_ms);
        rec.decision = (d.admitted ? "switch: " : d.blocked ? "blocked: " : "stay: ") + d.why;
      }
      if (d.admitted) {
        // The graph the runtime would run (which bytes move where), timed by the truth.
        const TransitionGraph g = ctl.transition(plan, d.target, seen);
        const TruthLoad now = load_of(job, trace[k]);
        const double reload = reload_seconds(truth, job, plan, d.target, trace[k].gpus, now);
        TruthTransitionOptions o;
        o.link_slowdown = trace[k].link_slowdown;
        if (d.urgent || !options.overlap || job.async || reload > 0) {
          // The current plan cannot run this step (or transitions run at boundaries, or
          // the job is async and drains both streams for it): the transition runs first,
          // in the open.
          rec.transition_seconds = rec.exposed_seconds = before = truth.run_transition(g, job, o).span + reload;
        } else {
          o.beside = true;
          o.early = -(previous.unhindered_seconds - previous.generation_done);
          TruthTransition beside = truth.run_transition(g, job, o);
          release = std::move(beside.ready);
          rec.transition_seconds = beside.span;
        }
        r.transition_seconds += rec.transition_seconds;
        ++r.transitions;
        plan = d.target;
        force_recompute = false;
      }
      if (d.replanned || d.admitted) r.decisions.push_back(std::move(d));
    }
    const TruthLoad load = load_of(job, trace[k]);
    const Workload expected = ctl.workload(seen);
    bool recompute = force_recompute || estimate_plan(ctl.model(), job, plan, expected, options.controller.headroom).recompute;
    StepRun run = run_step(truth, job, plan, load, trace[k].gpus, recompute, release);
    rec.exposed_seconds += run.seconds - run.unhindered_seconds;
    double seconds = run.seconds;
    double own = 0;  // the step's own run time (no waits, no failure)
    if (run.failed) {
      // Restart from the checkpoint onto a plan that fits: recomputation first, then the
      // planner's plan for the pool present; the step runs again there. Never calibrates.
      rec.failed = true;
      rec.oom = run.oom;
      rec.failure = run.why;
      double lost = run.failed_after + kRestartSeconds;
      StepRun again;
      for (int attempt = 0; attempt < 2; ++attempt) {
        if (attempt == 0 && run.oom && !recompute) {
          recompute = force_recompute = true;
        } else {
          // The planner's plan for the pool present, or when none fits by the cost model,
          // the same layouts with fewer replicas sharing GPUs.
          const PlanChoice c = plan_job(ctl.model(), job, trace[k].gpus, expected, options.controller.planner);
          plan = c.feasible ? c.plan : ctl.rescale(plan, trace[k].gpus);
          recompute = force_recompute = true;
        }
        again = run_step(truth, job, plan, load, trace[k].gpus, recompute);
        lost += double(again.resident_max) / truth.checkpoint_bytes_per_second();
        if (!again.failed) break;
        lost += again.failed_after + kRestartSeconds;
      }
      rec.failure_seconds = lost;
      seconds = again.failed ? lost : lost + again.seconds;
      own = again.failed ? 0 : again.unhindered_seconds;
      run = again;
      ++r.failed_steps;
      r.oom_steps += rec.oom;
    } else {
      own = run.unhindered_seconds;
      // The step ran: its stage times and its peak calibrate the controller.
      const OverlapGraph og = overlap_graph(job, plan);
      for (std::size_t i = 0; i < og.stages.size(); ++i) {
        Candidate c = candidate_of(*plan.find(og.stages[i].name()), recompute && og.stages[i].kind == StageKind::train);
        ctl.measure(og.stages[i], c, ctl.workload(signals(k, k)), run.stage_seconds[i]);
      }
      const PlanEstimate predicted = estimate_plan(ctl.model(), job, plan, ctl.workload(signals(k, k)), options.controller.headroom);
      rec.predicted_seconds = predicted.step_seconds;
      ctl.measure_memory(predicted.peak_memory_bytes, run.peak);
    }
    rec.seconds = before + seconds;
    if (job.async) {
      // The streams: generation run k needs the version training step k − 1 − s made
      // (landed), training step k needs rollouts k and its previous update read; a
      // transition or a failure drains both first.
      const std::size_t s = static_cast<std::size_t>(job.max_staleness);
      const double last = k > 0 ? trained[k - 1] : 0;
      double floor = 0;
      if (rec.transition_seconds > 0 || rec.failed) floor = std::max(last, generation_free) + before + rec.failure_seconds;
      const std::string key = to_string(plan);
      if (key != flows_of) flows = update_flows(job, plan), flows_of = key;
      rec.update_seconds = truth.copy_seconds(flows, load.link_slowdown);
      rec.generation_seconds = run.generation_seconds;
      rec.training_seconds = run.rest_seconds;
      if (rec.failed && run.failed) {  // no plan ran the step: it cost what the failure did
        trained.push_back(last + rec.seconds);
      } else {
        const double g0 = std::max({generation_free, k >= s + 1 ? updated[k - s - 1] : 0.0, floor});
        generation_free = g0 + run.generation_seconds;
        const double t0 = std::max({generation_free, k > 0 ? updated[k - 1] : 0.0, floor});
        trained.push_back(t0 + run.rest_seconds);
      }
      updated.push_back(trained.back() + (run.failed ? 0 : rec.update_seconds));
      rec.seconds = trained.back() - last;
      seconds = rec.seconds - before;
      own = std::max(0.0, seconds - rec.failure_seconds);
    }
    compute += own;
    rec.peak_bytes = run.peak;
    rec.plan = short_plan(job, plan);
    r.exposed_transition_seconds += rec.exposed_seconds;
    r.failure_seconds += rec.failure_seconds;
    previous = run;
    r.records.push_back(std::move(rec));
    if (options.on_step) options.on_step(k + 1);
  }
  r.steps = static_cast<long>(trace.size());
  for (const StepRecord& s : r.records) r.total_seconds += s.seconds;
  r.mean_step_seconds = r.total_seconds / double(r.steps);
  r.mean_compute_seconds = compute / double(r.steps);
  std::sort(decision_ms.begin(), decision_ms.end());
  if (!decision_ms.empty()) {
    r.decision_ms_median = decision_ms[decision_ms.size() / 2];
    r.decision_ms_max = decision_ms.back();
  }
  r.efficiency = ctl.model().efficiency();
  // Held out: single stage runs of candidates at the trace's workloads, on otherwise empty GPUs.
  std::mt19937_64 rng(options.seed ^ 0x5eed);
  std::vector<Measurement> held;
  for (int tries = 0; held.size() < 72 && tries < 2000; ++tries) {
    const TraceStep& ts = trace[rng() % trace.size()];
    const ModelStage& st = stages[rng() % stages.size()];
    const auto cands = stage_candidates(st, ts.gpus, cluster, job.prompts_per_step * job.samples_per_prompt);
    if (cands.empty()) continue;
    const Candidate c = cands[rng() % cands.size()];
    const double t = single_run(truth, st, c, load_of(job, ts));
    if (!(t > 0)) continue;
    Workload w = Workload::of(job, ts.response_len_mean, ts.response_len_p95);
    w.link_slowdown = ts.link_slowdown;
    held.push_back({ctl.model().work(st, c, w), t});
  }
  const Fit fit = Calibrator::fit(r.efficiency, held);
  r.mape = fit.mape;
  r.max_ape = fit.max_ape;
  r.mape_prior = Calibrator::fit(conservative_efficiency(), held).mape;
  return r;
}

}  // namespace nereus
