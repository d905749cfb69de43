#pragma once
// How far a node's clock is from the coordinator's, from the heartbeats (the NTP rule):
// the node stamps a beat with its clock at send (t1), the coordinator stamps the answer
// with its own (t2), the node reads its clock when the answer lands (t3). If the two
// legs took equally long, the coordinator's clock is ahead by t2 − (t1 + t3)/2, and the
// error is at most half the round trip t3 − t1. Of the recent samples the one with the
// shortest round trip is kept: queueing only ever lengthens a leg, so it is the tightest.
// Timelines recorded on the node's clock land on the coordinator's by adding the offset.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace nereus::cluster {

/// Nanoseconds on a steady clock of this process, shifted by $NEREUS_CLOCK_SKEW_SECONDS
/// (read once; lets a test give one daemon a clock far from the others on one machine).
/// Every clock value a daemon sends (heartbeats, a run's start) is on this clock.
std::int64_t node_clock_ns();
/// The skew node_clock_ns() adds to the process's steady clock.
std::int64_t node_clock_skew_ns();

struct ClockOffset {
  std::int64_t offset_ns = 0;  ///< the coordinator's clock minus this node's
  std::int64_t rtt_ns = 0;     ///< the round trip of the sample it came from (error ≤ rtt/2)
};

/// Seconds from `origin_ns` (the coordinator's clock) to `node_ns` (a node's clock whose
/// offset to the coordinator is `offset_ns`).
inline double seconds_since(std::int64_t origin_ns, std::int64_t node_ns, std::int64_t offset_ns) {
  return static_cast<double>(node_ns + offset_ns - origin_ns) / 1e9;
}

class ClockSync {
 public:
  /// One exchange: sent at t1 and answered at t3 on this node's clock, stamped t2 by the
  /// coordinator. A sample whose answer seems to arrive before it was sent is dropped.
  void add(std::int64_t t1, std::int64_t t2, std::int64_t t3);
  /// The estimate from the shortest round trip of the last kWindow samples; none before
  /// the first sample.
  std::optional<ClockOffset> estimate() const;

  static constexpr std::size_t kWindow = 8;

 private:
  std::array<ClockOffset, kWindow> samples_{};
  std::size_t count_ = 0;  // samples added (the window holds the last kWindow)
};

}  // namespace nereus::cluster
