#include "nereus/base/trace_events.hpp"

#include <cmath>

namespace nereus {

void TraceEvents::process(int pid, const std::string& name) {
  events_.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
}

int TraceEvents::lane(int pid, const std::string& track, double start, double end) {
  auto& ends = lane_ends_[{pid, track}];
  auto& tids = lane_tids_[{pid, track}];
  for (std::size_t i = 0; i < ends.size(); ++i)
    if (ends[i] <= start) {  // events arrive in any order: a lane is free if it ended before
      ends[i] = std::max(ends[i], end);
      return tids[i];
    }
  const int tid = ++next_tid_[pid];
  ends.push_back(end);
  tids.push_back(tid);
  const std::string name = ends.size() == 1 ? track : track + " · " + std::to_string(ends.size());
  events_.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  events_.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
  return tid;
}

namespace {
/// Microseconds, rounded to the nanosecond: no clock here resolves finer, and times that
/// went through clock offsets (a − offset − origin) would otherwise leave rounding dust
/// such as −1.7e-15 µs on an event that starts at the origin. (+ 0.0 turns −0 into 0.)
double micros(double seconds) { return std::round(seconds * 1e9) / 1e3 + 0.0; }
}  // namespace

void TraceEvents::complete(int pid, const std::string& track, const std::string& name, double start_seconds, double seconds,
                           nlohmann::json args) {
  const double ts = micros(start_seconds), dur = micros(std::max(0.0, seconds));
  const int tid = lane(pid, track, ts, ts + dur);
  events_.push_back({{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"ts", ts}, {"dur", dur}, {"args", std::move(args)}});
}

void TraceEvents::instant(int pid, const std::string& track, const std::string& name, double at_seconds, nlohmann::json args) {
  const double ts = micros(at_seconds);
  const int tid = lane(pid, track, ts, ts);
  events_.push_back({{"ph", "i"}, {"s", "t"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"ts", ts}, {"args", std::move(args)}});
}

std::string TraceEvents::dump() const {
  return nlohmann::json{{"traceEvents", events_}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace nereus
