#pragma once
// Drift traces (interfaces.md, "Trace"): one JSON object per RL step.
#include <string_view>
#include <vector>

namespace nereus {

/// What one step of a run sees.
struct TraceStep {
  long step = 0;
  int gpus = 0;
  double response_len_mean = 0;
  double response_len_p95 = 0;
  double link_slowdown = 1;  ///< factor ≥ 1 on inter-node bandwidth
};

/// Parses JSON Lines; every error names the line and the field. Steps must increase.
std::vector<TraceStep> parse_trace(std::string_view text, std::string_view origin);
std::vector<TraceStep> load_trace(std::string_view path);

}  // namespace nereus
