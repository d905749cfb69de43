#include "nereus/cluster/clock_sync.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>

namespace nereus::cluster {

std::int64_t node_clock_skew_ns() {
  static const std::int64_t skew = [] {
    const char* s = std::getenv("NEREUS_CLOCK_SKEW_SECONDS");
    if (!s || !*s) return std::int64_t{0};
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !std::isfinite(v)) return std::int64_t{0};
    return static_cast<std::int64_t>(v * 1e9);
  }();
  return skew;
}

std::int64_t node_clock_ns() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() + node_clock_skew_ns();
}

void ClockSync::add(std::int64_t t1, std::int64_t t2, std::int64_t t3) {
  if (t3 < t1) return;
  // t2 − (t1 + t3)/2 without overflowing the sum of two clock readings.
  const std::int64_t offset = (t2 - t1) - (t3 - t1) / 2;
  samples_[count_ % kWindow] = {offset, t3 - t1};
  ++count_;
}

std::optional<ClockOffset> ClockSync::estimate() const {
  if (count_ == 0) return std::nullopt;
  const std::size_t n = count_ < kWindow ? count_ : kWindow;
  ClockOffset best = samples_[0];
  for (std::size_t i = 1; i < n; ++i)
    if (samples_[i].rtt_ns < best.rtt_ns) best = samples_[i];
  return best;
}

}  // namespace nereus::cluster
