// The simulator's outputs: a JSON object per step, an SVG plot comparing policies, and a
// Perfetto timeline.
#include "nereus/sim/report.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "nereus/base/svg.hpp"
#include "nereus/base/trace_events.hpp"

namespace nereus {

std::string timeline_jsonl(const SimulationResult& r, const std::string& policy) {
  std::string out;
  for (const StepRecord& s : r.records) {
    nlohmann::json j = {{"step", s.step},
                        {"gpus", s.gpus},
                        {"response_len_mean", s.response_len_mean},
                        {"link_slowdown", s.link_slowdown},
                        {"seconds", s.seconds},
                        {"predicted_seconds", s.predicted_seconds},
                        {"transition_seconds", s.transition_seconds},
                        {"exposed_seconds", s.exposed_seconds},
                        {"peak_bytes", s.peak_bytes},
                        {"failed", s.failed},
                        {"oom", s.oom},
                        {"plan", s.plan}};
    if (s.update_seconds > 0 || s.generation_seconds > 0) {  // async
      j["generation_seconds"] = s.generation_seconds;
      j["training_seconds"] = s.training_seconds;
      j["update_seconds"] = s.update_seconds;
    }
    if (s.failed) {
      j["failure"] = s.failure;
      j["failure_seconds"] = s.failure_seconds;
    }
    if (!s.trigger.empty()) j["trigger"] = s.trigger;
    if (!s.decision.empty()) j["decision"] = s.decision;
    if (!policy.empty()) j["policy"] = policy;
    out += j.dump() + "\n";
  }
  return out;
}

std::string plot_svg(const std::vector<PolicyRun>& runs, const std::string& title) {
  const double W = 960, left = 70, right = 30;
  const double pw = W - left - right;
  const std::vector<std::string> heading = svg::fit_title(title, static_cast<std::size_t>(pw / 8.3));
  // Title lines, then a legend row per three policies, then the two panels.
  const double legend_top = 22.0 + 20.0 * static_cast<double>(heading.size());
  const double legend_rows = static_cast<double>((runs.size() + 1) / 2);
  const double top = legend_top + 18 * legend_rows + 8, ph = 280;
  const double pool_top = top + ph + 34, pool_h = 90;
  const double H = pool_top + pool_h + 40;
  std::size_t steps = 0;
  std::vector<double> all;
  int gmax = 1;
  for (const PolicyRun& run : runs) {
    steps = std::max(steps, run.result.records.size());
    for (const StepRecord& s : run.result.records) all.push_back(s.seconds), gmax = std::max(gmax, s.gpus);
  }
  // The scale ignores the rare spikes of failed steps: points above it sit on the top edge.
  std::sort(all.begin(), all.end());
  const double p98 = all.empty() ? 1 : all[std::min(all.size() - 1, all.size() * 98 / 100)];
  const double ymax = std::max(1e-9, std::min(all.empty() ? 1 : all.back(), 2 * p98) * 1.1);
  const double n = std::max<double>(1, static_cast<double>(steps) - 1);
  auto x = [&](std::size_t i) { return left + pw * static_cast<double>(i) / n; };
  auto y = [&](double v) { return top + ph * (1 - std::min(v, ymax) / ymax); };
  auto yg = [&](double g) { return pool_top + pool_h * (1 - g / (gmax * 1.1)); };
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"%g\" height=\"%g\" fill=\"white\"/>\n",
                W, H, W, H);
  out += buf;
  for (std::size_t i = 0; i < heading.size(); ++i) {
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" font-size=\"15\">%s</text>\n", left, 22.0 + 20.0 * static_cast<double>(i),
                  svg::escape(heading[i]).c_str());
    out += buf;
  }
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const SimulationResult& r = runs[k].result;
    const double lx = left + pw / 2 * static_cast<double>(k % 2), ly = legend_top + 18 * static_cast<double>(k / 2);
    char label[256];
    std::snprintf(label, sizeof label, "%s: %.1f s/step, %d transitions, %d failed", runs[k].policy.c_str(), r.mean_step_seconds,
                  r.transitions, r.failed_steps);
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"4\" fill=\"%s\"/><text x=\"%g\" y=\"%g\">%s</text>\n", lx, ly - 4,
                  svg::colour(k), lx + 20, ly, svg::escape(svg::clip(label, static_cast<std::size_t>(pw / 2 / 6.6) - 4)).c_str());
    out += buf;
  }
  for (const auto& [t, h] : {std::pair{top, ph}, std::pair{pool_top, pool_h}}) {
    std::snprintf(buf, sizeof buf, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n", left, t, pw, h);
    out += buf;
  }
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3g</text>\n", left - 6, y(v) + 4, v);
    out += buf;
  }
  for (int k = 0; k <= 4 && steps > 0; ++k) {  // step numbers under the pool panel
    const std::size_t i = static_cast<std::size_t>(n * k / 4);
    const auto& rec = runs.front().result.records;
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%ld</text>\n", x(i), pool_top + pool_h + 16,
                  i < rec.size() ? rec[i].step : static_cast<long>(i));
    out += buf;
  }
  for (int k = 0; k <= 2; ++k) {
    const double g = gmax * 1.1 * k / 2;
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%d</text>\n", left - 6, yg(g) + 4, static_cast<int>(g));
    out += buf;
  }
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const auto& rec = runs[k].result.records;
    const char* colour = svg::colour(k);
    std::string pts;
    for (std::size_t i = 0; i < rec.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(i), y(rec[i].seconds));
      pts += buf;
    }
    out += "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"1.2\" points=\"" + pts + "\"/>\n";
    for (std::size_t i = 0; i < rec.size(); ++i) {
      if (rec[i].transition_seconds > 0) {  // a tick per transition, one row per policy
        const double base = top + ph - 2 - 7 * static_cast<double>(k);
        std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x(i), base, x(i), base - 6,
                      colour);
        out += buf;
      }
      if (rec[i].failed) {
        std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x(i), y(rec[i].seconds), colour);
        out += buf;
      }
    }
  }
  if (!runs.empty()) {
    std::string pts;
    const auto& rec = runs.front().result.records;
    for (std::size_t i = 0; i < rec.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(i), yg(rec[i].gpus));
      pts += buf;
    }
    out += "<polyline fill=\"none\" stroke=\"#2a7\" stroke-width=\"1.2\" points=\"" + pts + "\"/>\n";
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>"
                "<text x=\"%g\" y=\"%g\" transform=\"rotate(-90 %g %g)\" text-anchor=\"middle\">seconds per step</text>"
                "<text x=\"%g\" y=\"%g\" transform=\"rotate(-90 %g %g)\" text-anchor=\"middle\">GPUs</text>\n"
                "<text x=\"%g\" y=\"%g\" fill=\"#555\">ticks: transitions; dots: failed steps</text>\n",
                left + pw / 2, H - 6, 16.0, top + ph / 2, 16.0, top + ph / 2, 16.0, pool_top + pool_h / 2, 16.0, pool_top + pool_h / 2,
                left, top + ph + 22);
  out += buf;
  return out + "</svg>\n";
}

std::string perfetto_json(const std::vector<PolicyRun>& runs) {
  TraceEvents trace;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const int pid = static_cast<int>(k) + 1;
    trace.process(pid, "policy " + runs[k].policy);
    double now = 0;  // simulated seconds
    for (const StepRecord& s : runs[k].result.records) {
      trace.complete(pid, "steps", "step " + std::to_string(s.step), now, s.seconds,
                     {{"plan", s.plan}, {"gpus", s.gpus}, {"response_len_mean", s.response_len_mean},
                      {"predicted_seconds", s.predicted_seconds}});
      if (s.transition_seconds > 0) {
        // As it ran: the part the step did not wait for ran beside the step before.
        const double hidden = std::max(0.0, s.transition_seconds - s.exposed_seconds);
        const double start = std::max(0.0, now - hidden);
        trace.complete(pid, "transitions", "transition", start, now + s.exposed_seconds - start,
                       {{"plan", s.plan}, {"seconds", s.transition_seconds}, {"exposed_seconds", s.exposed_seconds}});
      }
      if (s.exposed_seconds > 0) trace.complete(pid, "waiting for a transition", "waiting", now, s.exposed_seconds);
      if (s.failed) trace.complete(pid, "failures", s.oom ? "out of memory" : "failed", now, s.failure_seconds, {{"why", s.failure}});
      if (!s.decision.empty())
        trace.instant(pid, "decisions", s.decision.substr(0, s.decision.find(':')), now, {{"trigger", s.trigger}, {"decision", s.decision}});
      now += s.seconds;
    }
  }
  return trace.dump();
}

}  // namespace nereus
