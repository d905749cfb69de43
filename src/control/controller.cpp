#include "nereus/control/controller.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/plan/overlap.hpp"

namespace nereus {

Policy parse_policy(const std::string& text, int& every) {
  if (text == "static") return Policy::fixed;
  if (text == "static-max") return Policy::fixed_max;
  if (text == "greedy") return Policy::greedy;
  if (text == "nereus") return Policy::nereus;
  if (text.rfind("every:", 0) == 0) {
    const std::string k = text.substr(6);
    char* end = nullptr;
    const long v = std::strtol(k.c_str(), &end, 10);
    if (k.empty() || *end != '\0' || v < 1 || v > 1000000)
      throw Error("policy '" + text + "': K in every:K must be a positive integer");
    every = static_cast<int>(v);
    return Policy::every;
  }
  throw Error("policy '" + text + "' is not one of static, static-max, every:K, greedy, nereus");
}

Controller::Controller(const JobSpec& job, const ClusterSpec& cluster, ControllerOptions options)
    : job_(job), cluster_(cluster), options_(options), model_(cluster) {
  if (options_.gamma <= 0) throw Error("gamma must be positive");
  if (options_.delta <= 0) throw Error("delta must be positive");
  // An async job's plan changes drain both streams (decide() charges the drain): none
  // runs beside the steps.
  if (job_.async) options_.beside_steps = false;
}

Workload Controller::workload(const Signals& s) const {
  // Memory is sized for the longest p95 of the recent steps, not the last one only: a plan
  // fitted to a dip in lengths would fail the step they come back (time uses the mean).
  double p95 = s.response_len_p95;
  for (double x : recent_p95_) p95 = std::max(p95, x);
  Workload w = Workload::of(job_, s.response_len_mean, p95);
  w.link_slowdown = s.link_slowdown;
  return w;
}

void Controller::remember(const Signals& s) {
  recent_p95_.push_back(s.response_len_p95);
  while (recent_p95_.size() > static_cast<std::size_t>(std::max(1, options_.memory_window))) recent_p95_.pop_front();
}

Signals Controller::static_sizing(const Signals& s) {
  Signals sized = s;
  if (options_.policy == Policy::fixed_max && job_.max_response_len > 0)
    sized.response_len_mean = sized.response_len_p95 = static_cast<double>(job_.max_response_len);
  static_first_ = sized;
  return sized;
}

GlobalPlan Controller::initial(const Signals& s) {
  reference_ = s;
  remember(s);
  started_ = true;
  first_step_ = s.step;
  // static-max knows the worst case and plans for the longest responses the job allows;
  // static (the paper's baseline) plans for the first step as every policy does.
  const Signals sized = static_sizing(s);
  const PlanChoice c = plan_job(model_, job_, s.gpus, workload(sized), options_.planner);
  if (!c.feasible) throw Error("no plan fits the first step: " + c.reason);
  reference_seconds_ = estimate_plan(model_, job_, c.plan, workload(s), options_.headroom).step_seconds;
  return c.plan;
}

void Controller::measure(const ModelStage& stage, const Candidate& c, const Workload& w, double seconds) {
  // A configuration weighs as one measurement (calibration.hpp), and a configuration is
  // its layout at a workload: the same plan at twice the response length spends its time
  // differently (attention and the KV cache grow faster than the GEMMs), so it is a point
  // of the profile of its own. Lengths within a factor √2 share one.
  const long bucket = std::lround(2 * std::log2(std::max(1.0, w.response_len_p95)));
  calibrator_.add({model_.work(stage, c, w), seconds,
                   stage.name() + " " + to_string(c.layout()) + ",dp=" + std::to_string(c.dp) + (c.recompute ? ",recompute" : "") +
                       ",len~" + std::to_string(bucket)});
  model_.set_efficiency(calibrator_.efficiency());
}

void Controller::measure_memory(std::uint64_t predicted, std::uint64_t measured) {
  const double o = static_cast<double>(model_.overhead_bytes());
  if (static_cast<double>(predicted) <= o || static_cast<double>(measured) <= o) return;
  // The formulas' own estimate (without the current scale) against what was measured.
  // The first measurement replaces the formulas' guess; after it the scale grows quickly
  // and shrinks slowly, so one quiet step does not undo it.
  const double raw = (static_cast<double>(predicted) - o) / model_.memory_scale();
  const double ratio = (static_cast<double>(measured) - o) / raw;
  const double s = model_.memory_scale();
  model_.set_memory_scale(!memory_measured_ || ratio > s ? ratio : 0.9 * s + 0.1 * ratio);
  memory_measured_ = true;
}

namespace {

bool same_plan(const GlobalPlan& a, const GlobalPlan& b) {
  if (a.stages.size() != b.stages.size()) return false;
  for (std::size_t i = 0; i < a.stages.size(); ++i)
    if (to_string(a.stages[i].second) != to_string(b.stages[i].second)) return false;
  return true;
}

}  // namespace

TransitionGraph Controller::transition(const GlobalPlan& from, const GlobalPlan& to, const Signals& s) const {
  const Workload w = workload(s);
  TransitionRequest req;
  req.job = &job_;
  req.to = plan_collections(job_, to);
  req.from = plan_collections(job_, from);
  const auto stages = model_stages(job_);
  double reload = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    // Units on GPUs that left the pool are gone; a model-stage that lost every unit
    // reloads from a checkpoint (its share of the node's NICs per GPU).
    auto& units = req.from[i].units;
    std::erase_if(units, [&](const Emu& e) {
      return std::any_of(e.gpus.begin(), e.gpus.end(), [&](DeviceId d) { return d >= s.gpus; });
    });
    if (units.empty()) {
      req.from[i] = req.to[i];
      const Candidate c = candidate_of(*to.find(stages[i].name()));
      const double bw = cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node / cluster_.gpus_per_node;
      reload = std::max(reload, static_cast<double>(model_.memory(stages[i], c, w).resident) / bw);
    }
    // Transitions run between steps (sync mode): no activations or KV cache then, only
    // gradient buffers of training stages and the framework's share.
    std::uint64_t ws = 0;
    if (stages[i].kind == StageKind::train)
      for (const GlobalPlan* p : {&from, &to})
        ws = std::max(ws, model_.memory(stages[i], candidate_of(*p->find(stages[i].name())), w).resident / 8);
    req.memory.workspace.emplace_back(stages[i].name(), ws + model_.overhead_bytes());
  }
  req.memory.capacity = static_cast<std::uint64_t>(cluster_.gpu_memory_gib * 1024.0 * 1024.0 * 1024.0);
  req.memory.headroom = options_.headroom;
  req.links = LinkModel::of(cluster_);
  req.links.inter_node_gbps /= std::max(1.0, s.link_slowdown);
  TransitionGraph g = compile_transition(req);
  g.summary.l_tran_seconds += reload;
  return g;
}

double Controller::generation_lead(const GlobalPlan& from, const Workload& w) const {
  // Frozen models' units may move from the end of the step before's generation: how long
  // before the boundary that is, on the plan that step runs.
  const PlanEstimate before = estimate_plan(model_, job_, from, w, options_.headroom);
  const OverlapGraph og = overlap_graph(job_, from);
  std::vector<double> generation = before.stage_seconds;
  for (std::size_t i = 0; i < generation.size(); ++i)
    if (og.phase[i] != 0) generation[i] = 0;
  return og.step_seconds(before.stage_seconds) - og.step_seconds(generation);
}

double Controller::wait_for(const GlobalPlan& to, const TransitionGraph& g, const Workload& w, double lead) const {
  const BesideSteps beside = beside_steps(g, job_, -lead, options_.shared_link_slowdown);
  const PlanEstimate after = estimate_plan(model_, job_, to, w, options_.headroom);
  const OverlapGraph og = overlap_graph(job_, to);
  return std::max(0.0, og.step_seconds(after.stage_seconds, beside.ready) - og.step_seconds(after.stage_seconds));
}

double Controller::exposed_seconds(const GlobalPlan& from, const GlobalPlan& to, const TransitionGraph& g,
                                   const Workload& w) const {
  return wait_for(to, g, w, generation_lead(from, w));
}

GlobalPlan Controller::rescale(const GlobalPlan& current, int gpus) const {
  // Keep every stage's TP and PP; give each stage its old share of its phase's GPUs. An
  // async job first splits the pool between generation and the rest as the plan did.
  std::vector<PlannedStage> stages;
  const std::int64_t seqs = job_.prompts_per_step * job_.samples_per_prompt;
  const auto phases = job_.phases();
  std::vector<int> totals;
  for (const auto& phase : phases) {
    int total = 0;
    for (const ModelStage& s : phase) total += current.find(s.name())->layout.size() * current.find(s.name())->dp;
    totals.push_back(total);
  }
  int generation = 0;  // async: GPUs of the generation half
  if (job_.async && gpus > 1) {
    const int rest = *std::max_element(totals.begin() + 1, totals.end());
    generation = std::clamp(static_cast<int>(std::lround(double(gpus) * totals[0] / std::max(1, totals[0] + rest))), 1, gpus - 1);
  }
  for (std::size_t p = 0; p < phases.size(); ++p) {
    const int pool = generation == 0 ? gpus : p == 0 ? generation : gpus - generation;
    for (const ModelStage& s : phases[p]) {
      const CollectionSpec& spec = *current.find(s.name());
      const int unit = spec.layout.size();
      const int share = std::max(unit, unit * spec.dp * pool / std::max(1, totals[p]));
      int dp = 1;
      for (int d = 1; unit * d <= share; ++d)
        if (seqs % d == 0) dp = d;
      stages.push_back({s.name(), {spec.layout.tp, spec.layout.pp, dp, false, spec.layout.ep, spec.layout.etp, spec.layout.fsdp}, 0, {}});
    }
  }
  const int base = gpus - generation;  // async: where generation starts
  GlobalPlan p = place(job_, stages, representation_of(current), generation > 0 ? base : 0);
  // Never a unit outside the pool (async: outside its half): when a phase's units need
  // more GPUs than there are, the later ones wrap onto GPUs that earlier ones use and run
  // after them. Blocks are aligned to their unit size, so a wrapped TP group stays inside
  // a node.
  for (auto& entry : p.stages) {
    const std::string& name = entry.first;
    CollectionSpec& spec = entry.second;
    const bool gen = generation > 0 && std::any_of(phases[0].begin(), phases[0].end(),
                                                   [&](const ModelStage& s) { return s.name() == name; });
    const int pool = generation == 0 ? gpus : gen ? generation : base;
    if (spec.layout.size() <= pool)
      for (DeviceId& d : spec.devices) d = gen ? base + (d - base) % pool : d % pool;
  }
  return p;
}

double Controller::horizon(const std::vector<std::string>& signals, long step) {
  double h = std::numeric_limits<double>::infinity();
  for (const std::string& x : signals) {
    auto last = last_cross_.find(x);
    if (last != last_cross_.end()) {
      const double interval = std::max(1.0, static_cast<double>(step - last->second));  // two in one step: one step apart
      auto it = horizon_.find(x);
      horizon_[x] = it == horizon_.end() ? interval : (1 - options_.ema) * it->second + options_.ema * interval;
    }
    last_cross_[x] = step;
    auto it = horizon_.find(x);
    h = std::min(h, it == horizon_.end() ? 1.0 : it->second);
  }
  return std::isfinite(h) ? h : 1.0;
}

Decision Controller::step(const GlobalPlan& current, const StepObservation& o) {
  observe(current, o);
  return decide(o.next, current);
}

void Controller::observe(const GlobalPlan& ran_on, const StepObservation& o) {
  Signals ran = o.next;
  if (o.response_len_mean > 0) ran.response_len_mean = o.response_len_mean;
  if (o.response_len_p95 > 0) ran.response_len_p95 = o.response_len_p95;
  const Workload w = workload(ran);
  const bool first = !started_;
  if (first) {
    reference_ = ran;
    reference_.gpus = o.next.gpus;
    static_sizing(ran);
    started_ = true;
    first_step_ = ran.step;
  }
  const std::vector<ModelStage> stages = model_stages(job_);
  for (const auto& measured : o.stage_seconds) {
    const std::string& name = measured.first;  // not a structured binding: clang 14 cannot capture one
    const double seconds = measured.second;
    const auto it = std::find_if(stages.begin(), stages.end(), [&](const ModelStage& m) { return m.name() == name; });
    if (it == stages.end()) throw Error("report_step: '" + name + "' is not a model-stage of this job");
    if (!(seconds >= 0) || !std::isfinite(seconds))
      throw Error("report_step: '" + name + "' took " + std::to_string(seconds) + " s; times are finite and >= 0");
    const CollectionSpec* spec = ran_on.find(name);
    if (!spec) throw Error("report_step: the current plan has no '" + name + "'");
    if (seconds > 0) measure(*it, candidate_of(*spec), w, seconds);
  }
  if (o.peak_bytes > 0) measure_memory(estimate_plan(model_, job_, ran_on, w, options_.headroom).peak_memory_bytes, o.peak_bytes);
  if (first) {  // the reference the `model` trigger measures drift against, as initial() sets it
    const PlanEstimate e = estimate_plan(model_, job_, ran_on, w, options_.headroom);
    reference_seconds_ = e.fits ? e.step_seconds : 0;
  }
}

Decision Controller::decide(const Signals& s, const GlobalPlan& current) {
  const auto t0 = std::chrono::steady_clock::now();
  // Every plan proposed from here holds each model-stage as `current` does (packing, FP8).
  options_.planner.representation = representation_of(current);
  // A job that trains with FSDP gets FSDP weighed against TP/PP from then on.
  for (const auto& [name, spec] : current.stages) options_.planner.fsdp = options_.planner.fsdp || spec.layout.fsdp > 1;
  auto done = [&](Decision& d) {
    d.decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (d.replanned || d.admitted)  // one line per decision, with its numbers
      log(d.blocked ? LogLevel::warn : LogLevel::info, "controller", "step {} [{}] {}: {} (now {:.3f} s/step, target {:.3f} s, L_tran {:.3f} s, H {:.1f}, {} moved, {:.2f} ms)",
          d.step, d.trigger, d.admitted ? "switch" : d.blocked ? "blocked" : "stay", d.why, d.current_seconds, d.target_seconds, d.transition_seconds,
          d.horizon_steps, human_bytes(d.moved_bytes), d.decision_ms);
    return d;
  };
  Decision d;
  d.step = s.step;
  remember(s);
  const Workload w = workload(s);
  const bool invalid = outside_pool(current, s.gpus);
  const PlanEstimate cur = invalid ? PlanEstimate{} : estimate_plan(model_, job_, current, w, options_.headroom);
  d.current_seconds = invalid || !cur.fits ? std::numeric_limits<double>::infinity() : cur.step_seconds;
  std::vector<std::string> trig;
  if (s.gpus != reference_.gpus) trig.push_back("pool");
  if (!invalid && !cur.fits) trig.push_back("memory");

  if (options_.policy == Policy::fixed || options_.policy == Policy::fixed_max) {
    // Static: the first TP/PP for ever; DP follows the pool.
    if (s.gpus == reference_.gpus && !invalid) return done(d);
    reference_ = s;
    d.trigger = "pool";
    d.urgent = invalid;
    d.target = rescale(current, s.gpus);
    d.why = "static: keep TP/PP, scale DP with the pool";
    if (outside_pool(d.target, s.gpus)) {
      // A unit of the kept layouts is larger than the pool, so no layout of it can be kept
      // whole. The baseline does what it did at the start, on the GPUs present: the
      // planner's plan for the first step's signals (never a unit outside the pool).
      Workload first = Workload::of(job_, static_first_.response_len_mean, static_first_.response_len_p95);
      first.link_slowdown = static_first_.link_slowdown;
      const PlanChoice c = plan_job(model_, job_, s.gpus, first, options_.planner);
      if (c.feasible) {
        d.target = c.plan;
        d.why = "static: a kept unit is larger than the pool of " + std::to_string(s.gpus) +
                "; the planner's plan for the first step's signals on it";
      }
    }
    const TransitionGraph g = transition(current, d.target, s);
    d.admitted = !same_plan(current, d.target);
    d.transition_seconds = g.summary.l_tran_seconds;
    d.charged_seconds = d.transition_seconds;
    d.moved_bytes = g.summary.moved_bytes;
    d.target_seconds = estimate_plan(model_, job_, d.target, w, options_.headroom).step_seconds;
    return done(d);
  }
  auto drift = [&](double now, double ref) { return ref > 0 && std::fabs(now - ref) / ref > options_.delta; };
  if (drift(s.response_len_mean, reference_.response_len_mean)) trig.push_back("length");
  if (drift(s.link_slowdown, reference_.link_slowdown)) trig.push_back("link");
  // The plan was chosen under a model that calibration has since corrected: its predicted
  // latency moved beyond δ of what it was at the last replan.
  if (std::isfinite(d.current_seconds) && reference_seconds_ > 0 && drift(d.current_seconds, reference_seconds_))
    trig.push_back("model");
  if (options_.policy == Policy::every && s.step - last_every_ >= options_.every) {
    trig.push_back("every");
    last_every_ = s.step;
  }
  // The last replan settled for less than S* (out of reach from where the job was, or a
  // cheaper step towards it): try again from the plan it reached, over the same horizon.
  const bool retry = retry_horizon_ > 0 && trig.empty();
  if (retry) trig.push_back("retry");
  // Calibration can also re-rank the plans without moving the current one's prediction:
  // when the corrected model puts a plan more than δ/3 ahead of the current one (the
  // margin a replan may settle for, below), that is a model trigger too. Planning is pure
  // and takes a fraction of a millisecond, so this is checked at every step.
  std::optional<PlanChoice> planned;
  if (trig.empty() && std::isfinite(d.current_seconds)) {
    planned = plan_job(model_, job_, s.gpus, w, options_.planner);
    if (planned->feasible && planned->step_seconds < d.current_seconds * (1 - options_.delta / 3)) trig.push_back("model");
  }
  if (trig.empty()) return done(d);
  for (const std::string& x : trig) d.trigger += (d.trigger.empty() ? "" : ",") + x;
  d.urgent = invalid || !cur.fits;
  reference_ = s;  // references reset at every replan, admitted or not
  reference_seconds_ = d.current_seconds;
  // H_x of the observed signals; "model" is derived from them and counts only alone.
  std::vector<std::string> observed;
  for (const std::string& x : trig)
    if (x != "model") observed.push_back(x);
  d.horizon_steps = retry ? retry_horizon_ : horizon(observed.empty() ? trig : observed, s.step);
  if (!retry && observed.empty()) {
    // A model correction lasts (its own crossings say nothing of how long): a plan chosen
    // for it stands until the next crossing of a drift signal. Its horizon is the shortest
    // H_x of those signals; before any has an interval, the one running: the steps since
    // the last crossing, or since the job's first step.
    double standing = std::numeric_limits<double>::infinity();
    long since = first_step_;
    for (const auto& [signal, h] : horizon_)
      if (signal != "model") standing = std::min(standing, h);
    for (const auto& [signal, step] : last_cross_)
      if (signal != "model") since = std::max(since, step);
    d.horizon_steps = std::isfinite(standing) ? standing : std::max(1.0, static_cast<double>(s.step - since));
  }
  retry_horizon_ = 0;
  d.replanned = true;

  const PlanChoice best = planned ? *planned : plan_job(model_, job_, s.gpus, w, options_.planner);
  if (!best.feasible) {
    d.why = "no plan fits: " + best.reason;
    if (invalid) {
      // The plan has units on GPUs that left: keep its layouts on the GPUs present.
      d.admitted = true;
      d.target = rescale(current, s.gpus);
      const TransitionGraph g = transition(current, d.target, s);
      d.transition_seconds = g.summary.l_tran_seconds;
      d.charged_seconds = d.transition_seconds;
      d.moved_bytes = g.summary.moved_bytes;
      d.why += "; fallback: the same layouts, fewer replicas, sharing GPUs";
    } else if (d.urgent) {
      d.blocked = true;
      d.why = shortfall(current, s, w) + "; " + d.why;
    }
    return done(d);
  }
  // S*, then slightly slower plans that keep a model-stage as it is (cheaper to reach),
  // and the current layouts with DP scaled to the pool (the cheapest change of all, which
  // a plan out of reach must not leave untried).
  std::vector<PlanOption> options{{best.step_seconds, best.plan, "S*"}};
  if (!invalid)
    for (std::size_t i = 0; i < best.plan.stages.size() && static_cast<int>(options.size()) <= options_.alternatives; ++i) {
      GlobalPlan alt = best.plan;
      alt.stages[i].second = *current.find(alt.stages[i].first);
      const PlanEstimate e = estimate_plan(model_, job_, alt, w, options_.headroom);
      if (e.fits) options.push_back({e.step_seconds, alt, "S* keeping " + alt.stages[i].first});
    }
  if (const GlobalPlan scaled = rescale(current, s.gpus); !outside_pool(scaled, s.gpus))
    if (const PlanEstimate e = estimate_plan(model_, job_, scaled, w, options_.headroom); e.fits)
      options.push_back({e.step_seconds, scaled, "the current layouts, DP scaled to the pool"});
  std::stable_sort(options.begin(), options.end(), [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
  std::string rejected;
  std::optional<double> lead;  // the current plan's, the same for every candidate
  auto refuse = [&](const PlanOption& o, std::string why) {
    d.refused.push_back(o.source + ": " + why);
    log(LogLevel::debug, "controller", "step {} refused {} ({}): {}", s.step, o.source, to_string(o.plan), why);
    rejected = std::move(why);
  };
  // Admits `o` when it is reachable and (not urgent) pays back.
  auto consider = [&](const PlanOption& o) {
    if (same_plan(o.plan, current)) {
      if (rejected.empty()) rejected = "already on the best plan";
      return false;
    }
    const TransitionGraph g = transition(current, o.plan, s);
    if (!g.feasibility.ok) {
      refuse(o, "unreachable: " + g.feasibility.reason);
      return false;
    }
    const double gain = d.current_seconds - o.seconds;
    // Beside the steps, a transition costs the steps only what they wait for it.
    double cost = g.summary.l_tran_seconds;
    if (job_.async && !d.urgent) {
      // An async job changes plan with both streams drained: besides L_tran, the first
      // step on the new plan runs generation and training one after the other.
      const PlanEstimate e = estimate_plan(model_, job_, o.plan, w, options_.headroom);
      cost += std::max(0.0, e.generation_seconds + e.training_seconds + e.update_seconds - e.step_seconds);
    } else if (options_.beside_steps && !d.urgent) {
      if (!lead) lead = generation_lead(current, w);
      cost = wait_for(o.plan, g, w, *lead);
    }
    d.target_seconds = o.seconds;
    d.transition_seconds = g.summary.l_tran_seconds;
    d.charged_seconds = cost;
    d.moved_bytes = g.summary.moved_bytes;
    bool admit = false;
    if (d.urgent) admit = true;
    else if (options_.policy == Policy::every) admit = true;
    else if (options_.policy == Policy::greedy) admit = gain > 0;
    else admit = gain > 0 && cost / gain <= options_.gamma * d.horizon_steps;
    if (!admit) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "gain %.3f s per step does not pay back %s %.3f s within %g x %.1f steps", gain,
                    job_.async ? "L_tran and the drain" : options_.beside_steps ? "its predicted wait" : "L_tran", cost,
                    options_.gamma, d.horizon_steps);
      refuse(o, buf);  // a slower candidate may still pay back with a cheaper transition
      return false;
    }
    d.admitted = true;
    d.target = o.plan;
    reference_seconds_ = o.seconds;
    // Short of S* (a cheaper step towards it, or an intermediate): try again next step.
    if (o.seconds > best.step_seconds * (1 + options_.delta / 3) && !retry) retry_horizon_ = d.horizon_steps;
    char buf[300];
    std::snprintf(buf, sizeof buf, "%s (%s): %.3f s -> %.3f s per step, L_tran %.3f s (charged %.3f s), H %.1f steps",
                  d.urgent ? "urgent" : "pays back", o.source.c_str(), d.current_seconds, o.seconds, d.transition_seconds,
                  cost, d.horizon_steps);
    d.why = buf;
    if (d.urgent && !d.refused.empty())  // the urgent path went past some: say how far
      d.why += "; " + std::to_string(d.refused.size()) + " refused before it (NEREUS_LOG=debug lists them), the first " +
               d.refused.front();
    return true;
  };
  for (const PlanOption& o : options)
    if (consider(o)) return done(d);
  if (d.urgent) {
    // The current plan cannot run the next step, so staying is no answer: go down the
    // urgent path's candidates until one is runnable and reachable.
    for (const PlanOption& o : urgent_options(current, options, s.gpus, w))
      if (consider(o)) return done(d);
    d.blocked = true;
    d.target_seconds = d.transition_seconds = d.charged_seconds = 0;
    d.moved_bytes = 0;
    d.why = shortfall(current, s, w) + ", and none of the " + std::to_string(d.refused.size()) +
            " plans tried can be reached (the last: " + rejected + ")";
    return done(d);
  }
  d.why = rejected;
  return done(d);
}

}  // namespace nereus
