#include "nereus/sim/trace.hpp"

#include <nlohmann/json.hpp>
#include <string>

#include "nereus/base/error.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

std::vector<TraceStep> parse_trace(std::string_view text, std::string_view origin) {
  std::vector<TraceStep> out;
  std::size_t pos = 0;
  for (int line = 1; pos < text.size(); ++line) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = std::string(origin) + " line " + std::to_string(line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(raw);
    } catch (const nlohmann::json::exception&) {  // also numbers out of range (found by fuzzing)
      throw Error(where + ": not a JSON object");
    }
    if (!j.is_object()) throw Error(where + ": not a JSON object");
    auto number = [&](const char* key, bool required, double fallback) {
      auto it = j.find(key);
      if (it == j.end()) {
        if (required) throw Error(where + ": missing field '" + key + "'");
        return fallback;
      }
      if (!it->is_number()) throw Error(where + ": field '" + key + "' must be a number, got " + it->dump());
      return it->get<double>();
    };
    TraceStep s;
    const double step = number("step", true, 0);
    if (!(step >= 0 && step < 1e15) || step != static_cast<double>(static_cast<long>(step)))
      throw Error(where + ": field 'step' must be a non-negative integer");
    s.step = static_cast<long>(step);
    const double gpus = number("gpus", true, 0);
    if (!(gpus >= 1 && gpus <= 1e7) || gpus != static_cast<int>(gpus)) throw Error(where + ": field 'gpus' must be a positive integer");
    s.gpus = static_cast<int>(gpus);
    s.response_len_mean = number("response_len_mean", true, 0);
    s.response_len_p95 = number("response_len_p95", false, s.response_len_mean);
    s.link_slowdown = number("link_slowdown", false, 1);
    if (!(s.response_len_mean > 0)) throw Error(where + ": field 'response_len_mean' must be positive");
    if (s.response_len_p95 < s.response_len_mean) throw Error(where + ": field 'response_len_p95' is below the mean");
    if (!(s.link_slowdown >= 1)) throw Error(where + ": field 'link_slowdown' must be at least 1");
    if (!out.empty() && s.step <= out.back().step) throw Error(where + ": field 'step' does not increase");
    out.push_back(s);
  }
  if (out.empty()) throw Error(std::string(origin) + ": the trace has no steps");
  return out;
}

std::vector<TraceStep> load_trace(std::string_view path) {
  return parse_trace(read_text_file(std::string(path)), path);
}

}  // namespace nereus
