// The simulator's outputs: a JSON object per step and an SVG plot.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "nereus/sim/simulator.hpp"

namespace nereus {

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
                        {"exposed_seconds", s.exposed_seconds},
                        {"peak_bytes", s.peak_bytes},
                        {"failed", s.failed},
                        {"oom", s.oom},
                        {"plan", s.plan}};
    if (s.failed) {
      j["failure"] = s.failure;
      j["failure_seconds"] = s.failure_seconds;
    }
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
    if (r.records[i].failed) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%g\" cy=\"%g\" r=\"2.5\" fill=\"#f80\"/>\n", x(i), y(r.records[i].seconds));
      svg += buf;
    }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\">step</text><text x=\"12\" y=\"%g\" fill=\"#236\">s/step</text>"
                "<text x=\"%g\" y=\"%g\" fill=\"#2a7\">GPUs</text>\n",
                left + pw / 2, H - 12, top - 8, W - right + 6, top - 8);
  svg += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\">%d steps, mean %.2f s/step, %d transitions (dashed, %.1f s), %d failed steps (dots)</text>\n",
                left, H - 28.0, static_cast<int>(r.steps), r.mean_step_seconds, r.transitions, r.transition_seconds, r.failed_steps);
  svg += buf;
  return svg + "</svg>\n";
}

}  // namespace nereus
