#pragma once
// Perfetto / Chrome trace event files (open in ui.perfetto.dev): processes with named
// tracks of complete events. Events that overlap on one track go to extra lanes of it
// ("device 3 · 2"), so that every track's events nest, as the viewers require.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace nereus {

class TraceEvents {
 public:
  /// A process (a group of tracks), named.
  void process(int pid, const std::string& name);
  /// A complete event on track `track` of `pid`; seconds on the trace's clock.
  void complete(int pid, const std::string& track, const std::string& name, double start_seconds, double seconds,
                nlohmann::json args = nlohmann::json::object());
  /// An instant event on a track.
  void instant(int pid, const std::string& track, const std::string& name, double at_seconds,
               nlohmann::json args = nlohmann::json::object());
  /// {"traceEvents": [...], "displayTimeUnit": "ms"}.
  std::string dump() const;

 private:
  /// The tid of a free lane of `track` for [start, end).
  int lane(int pid, const std::string& track, double start, double end);

  nlohmann::json events_ = nlohmann::json::array();
  std::map<std::pair<int, std::string>, std::vector<double>> lane_ends_;  // per track: each lane's last end
  std::map<std::pair<int, std::string>, std::vector<int>> lane_tids_;
  std::map<int, int> next_tid_;
};

}  // namespace nereus
