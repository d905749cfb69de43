#include "nereus/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "nereus/base/error.hpp"
#include "nereus/plan/overlap.hpp"
#include "nereus/sim/hardware.hpp"

namespace nereus {

namespace {

std::string short_plan(const JobSpec& job, const GlobalPlan& p) {
  std::string s;
  for (const ModelStage& st : model_stages(job)) {
    const CollectionSpec& c = *p.find(st.name());
    s += (s.empty() ? "" : " ") + st.role.substr(0, 1) + std::string(to_string(st.kind)).substr(0, 1) + "=" +
         std::to_string(c.layout.tp) + "/" + std::to_string(c.layout.pp) + "/" + std::to_string(c.dp);
  }
  return s;
}

/// Truth of one step on `plan`: stage times (measured), the step's time, the busiest GPU.
struct StepTruth {
  std::vector<double> stage_seconds;
  double seconds = 0;
  std::uint64_t peak = 0;
  bool fits = true;
};

StepTruth run_step(HardwareModel& hw, const JobSpec& job, const GlobalPlan& plan, const Workload& w, int gpus) {
  StepTruth t;
  const OverlapGraph og = overlap_graph(job, plan);
  std::map<DeviceId, std::uint64_t> resident, transient;
  for (const ModelStage& s : og.stages) {
    const CollectionSpec& spec = *plan.find(s.name());
    Candidate c = candidate_of(spec);
    // The framework recomputes activations when the full ones do not fit.
    const StageMemory full = hw.work_model().memory(s, c, w);
    if (s.kind == StageKind::train && hw.peak_bytes(full.resident, full.transient) > hw.capacity_bytes()) c.recompute = true;
    const StageMemory m = hw.work_model().memory(s, c, w);
    t.stage_seconds.push_back(hw.stage_seconds(s, c, w));
    for (DeviceId d : spec.devices) {
      if (d >= gpus) t.fits = false;
      resident[d] += m.resident;
      transient[d] = std::max(transient[d], m.transient);
    }
  }
  t.seconds = og.step_seconds(t.stage_seconds);
  for (const auto& [d, r] : resident) t.peak = std::max(t.peak, hw.peak_bytes(r, transient[d]));
  t.fits = t.fits && t.peak <= hw.capacity_bytes();
  return t;
}

}  // namespace

SimulationResult simulate(const ClusterSpec& cluster, const JobSpec& job, const std::vector<TraceStep>& trace,
                          const SimulationOptions& options) {
  if (trace.empty()) throw Error("simulate: the trace has no steps");
  for (const TraceStep& s : trace)
    if (s.gpus > cluster.gpus())
      throw Error("simulate: step " + std::to_string(s.step) + " asks for " + std::to_string(s.gpus) +
                  " GPUs but the cluster has " + std::to_string(cluster.gpus()));
  HardwareModel hw(cluster, options.seed, options.noise);
  Controller ctl(job, cluster, options.controller);
  const auto stages = model_stages(job);
  auto signals = [&](std::size_t k, std::size_t seen) {
    // The pool is known before step k; lengths and link speed only from the last step run.
    return Signals{trace[k].step, trace[k].gpus, trace[seen].response_len_mean, trace[seen].response_len_p95,
                   trace[seen].link_slowdown};
  };
  GlobalPlan plan = ctl.initial(signals(0, 0));
  SimulationResult r;
  std::vector<double> decision_ms;
  for (std::size_t k = 0; k < trace.size(); ++k) {
    StepRecord rec;
    rec.step = trace[k].step;
    rec.gpus = trace[k].gpus;
    rec.response_len_mean = trace[k].response_len_mean;
    rec.link_slowdown = trace[k].link_slowdown;
    if (k > 0) {
      const Signals s = signals(k, k - 1);
      Decision d = ctl.decide(s, plan);
      rec.trigger = d.trigger;
      if (d.replanned || d.admitted) {
        ++r.replans;
        decision_ms.push_back(d.decision_ms);
        rec.decision = d.admitted ? "switch: " + d.why : "stay: " + d.why;
      }
      if (d.admitted) {
        // The transition's true time: its graph with the hardware's link efficiency.
        ClusterSpec truth = cluster;
        truth.intra_node_gbps *= hw.link_efficiency();
        truth.inter_node_gbps *= hw.link_efficiency();
        const TransitionGraph g = Controller(job, truth, options.controller).transition(plan, d.target, s);
        rec.transition_seconds = g.summary.l_tran_seconds;
        r.transition_seconds += rec.transition_seconds;
        r.exposed_transition_seconds += rec.transition_seconds;  // at the step boundary (sync mode)
        ++r.transitions;
        plan = d.target;
      }
      if (d.replanned || d.admitted) r.decisions.push_back(std::move(d));
    }
    Workload w = ctl.workload(signals(k, k));
    const StepTruth t = run_step(hw, job, plan, w, trace[k].gpus);
    rec.seconds = t.seconds;
    rec.peak_bytes = t.peak;
    rec.oom = !t.fits;
    const PlanEstimate predicted = estimate_plan(ctl.model(), job, plan, w);
    rec.predicted_seconds = predicted.step_seconds;
    if (t.fits) ctl.measure_memory(predicted.peak_memory_bytes, t.peak);
    rec.plan = short_plan(job, plan);
    r.oom_steps += rec.oom;
    for (std::size_t i = 0; i < stages.size(); ++i)
      ctl.measure(stages[i], candidate_of(*plan.find(stages[i].name())), w, t.stage_seconds[i]);
    r.records.push_back(std::move(rec));
  }
  r.steps = static_cast<long>(trace.size());
  double sum = 0;
  for (const StepRecord& s : r.records) sum += s.seconds;
  r.mean_step_seconds = sum / static_cast<double>(r.steps);
  r.total_seconds = sum + r.exposed_transition_seconds;
  std::sort(decision_ms.begin(), decision_ms.end());
  if (!decision_ms.empty()) {
    r.decision_ms_median = decision_ms[decision_ms.size() / 2];
    r.decision_ms_max = decision_ms.back();
  }
  r.efficiency = ctl.model().efficiency();
  // Held out: stage runs of candidates the run never executed, at workloads of the trace.
  std::mt19937_64 rng(options.seed ^ 0x5eed);
  std::vector<Measurement> held;
  for (int n = 0; n < 72; ++n) {
    const TraceStep& ts = trace[rng() % trace.size()];
    const ModelStage& st = stages[rng() % stages.size()];
    const auto cands = stage_candidates(st, ts.gpus, cluster, job.prompts_per_step * job.samples_per_prompt);
    if (cands.empty()) continue;
    const Candidate c = cands[rng() % cands.size()];
    Workload w = Workload::of(job, ts.response_len_mean, ts.response_len_p95);
    w.link_slowdown = ts.link_slowdown;
    held.push_back({ctl.model().work(st, c, w), hw.stage_seconds(st, c, w)});
  }
  const Fit fit = Calibrator::fit(r.efficiency, held);
  r.mape = fit.mape;
  r.max_ape = fit.max_ape;
  r.mape_prior = Calibrator::fit(conservative_efficiency(), held).mape;
  return r;
}

std::string timeline_jsonl(const SimulationResult& r) {
  std::string out;
  for (const StepRecord& s : r.records) {
    nlohmann::json j = {{"step", s.step},
                        {"gpus", s.gpus},
                        {"response_len_mean", s.response_len_mean},
                        {"link_slowdown", s.link_slowdown},
                        {"seconds", s.seconds},
                        {"predicted_seconds", s.predicted_seconds},
                        {"transition_seconds", s.transition_seconds},
                        {"peak_bytes", s.peak_bytes},
                        {"oom", s.oom},
                        {"plan", s.plan}};
    if (!s.trigger.empty()) j["trigger"] = s.trigger;
    if (!s.decision.empty()) j["decision"] = s.decision;
    out += j.dump() + "\n";
  }
  return out;
}

std::string plot_svg(const SimulationResult& r, const std::string& title) {
  const double W = 960, H = 420, left = 70, right = 70, top = 40, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;
  double ymax = 0;
  int gmax = 1;
  for (const StepRecord& s : r.records) ymax = std::max(ymax, s.seconds), gmax = std::max(gmax, s.gpus);
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const double n = std::max<double>(1, static_cast<double>(r.records.size()) - 1);
  auto x = [&](std::size_t i) { return left + pw * static_cast<double>(i) / n; };
  auto y = [&](double v) { return top + ph * (1 - v / ymax); };
  auto yg = [&](double g) { return top + ph * (1 - g / (gmax * 1.1)); };
  auto esc = [](std::string s) {
    std::string o;
    for (char c : s) o += c == '<' ? std::string("&lt;") : c == '>' ? std::string("&gt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
    return o;
  };
  char buf[256];
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"420\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"960\" height=\"420\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"22\" font-size=\"15\">%s</text>\n", left, esc(title).c_str());
  svg += buf;
  std::snprintf(buf, sizeof buf, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n", left, top, pw, ph);
  svg += buf;
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.1f</text>\n", left - 6, y(v) + 4, v);
    svg += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" fill=\"#2a7\">%d</text>\n", left + pw + 6, yg(gmax * 1.1 * k / 4) + 4,
                  static_cast<int>(gmax * 1.1 * k / 4));
    svg += buf;
  }
  // Transitions: vertical lines.
  for (std::size_t i = 0; i < r.records.size(); ++i)
    if (r.records[i].transition_seconds > 0) {
      std::snprintf(buf, sizeof buf, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#d33\" stroke-dasharray=\"3,3\"/>\n", x(i), top,
                    x(i), top + ph);
      svg += buf;
    }
  auto polyline = [&](auto&& value, const char* colour) {
    std::string pts;
    for (std::size_t i = 0; i < r.records.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(i), value(r.records[i]));
      pts += buf;
    }
    return "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"1.2\" points=\"" + pts + "\"/>\n";
  };
  svg += polyline([&](const StepRecord& s) { return yg(s.gpus); }, "#2a7");
  svg += polyline([&](const StepRecord& s) { return y(s.seconds); }, "#236");
  for (std::size_t i = 0; i < r.records.size(); ++i)
    if (r.records[i].oom) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%g\" cy=\"%g\" r=\"2.5\" fill=\"#f80\"/>\n", x(i), y(r.records[i].seconds));
      svg += buf;
    }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\">step</text><text x=\"12\" y=\"%g\" fill=\"#236\">s/step</text>"
                "<text x=\"%g\" y=\"%g\" fill=\"#2a7\">GPUs</text>\n",
                left + pw / 2, H - 12, top - 8, W - right + 6, top - 8);
  svg += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\">%d steps, mean %.2f s/step, %d transitions (dashed, %.1f s), %d out-of-memory steps (dots)</text>\n",
                left, H - 28.0, static_cast<int>(r.steps), r.mean_step_seconds, r.transitions, r.transition_seconds, r.oom_steps);
  svg += buf;
  return svg + "</svg>\n";
}

}  // namespace nereus
