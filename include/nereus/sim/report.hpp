#pragma once
// What `nereus simulate` writes besides its summary: a JSON object per step, an SVG plot
// that compares policies, and a Perfetto timeline (Chrome trace event format).
#include <string>
#include <vector>

#include "nereus/sim/simulator.hpp"

namespace nereus {

/// One policy's run of a trace.
struct PolicyRun {
  std::string policy;
  SimulationResult result;
};

/// One JSON object per step; with `policy`, each names it.
std::string timeline_jsonl(const SimulationResult& r, const std::string& policy = "");

/// Step latency of every run over steps on one chart (transitions as ticks, failed steps as
/// dots, a line per policy), the GPU pool in a panel beneath; the title is shortened to fit.
std::string plot_svg(const std::vector<PolicyRun>& runs, const std::string& title);

/// A process per policy with tracks for steps, transitions (as they ran, and the part
/// the step waited for), failures and decisions, on simulated time; opens in
/// ui.perfetto.dev.
std::string perfetto_json(const std::vector<PolicyRun>& runs);

}  // namespace nereus
