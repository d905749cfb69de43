#pragma once
// What a daemon counts, and its Prometheus text exposition (format 0.0.4), served on
// --metrics HOST:PORT at GET /metrics.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nereus/cluster/messages.hpp"

namespace nereus::cluster {

/// One link's transfers in a run: bytes, count, and its busy span (first start to last
/// end, on the receiving node's clock).
struct LinkSpan {
  std::uint64_t bytes = 0, transfers = 0;
  double lo = 1e300, hi = 0;
  void add(const Timing& t);
  double gbps() const { return hi > lo ? static_cast<double>(bytes) / (hi - lo) / 1e9 : 0; }
};

struct Metrics {
  int node_rank = 0;
  bool coordinator = false;
  std::uint64_t heartbeats_sent = 0;      ///< by this node
  std::uint64_t heartbeats_received = 0;  ///< by the coordinator, from every node
  std::uint64_t connections_accepted = 0;
  std::uint64_t auth_failures = 0;
  std::map<std::string, std::uint64_t> dropped;  ///< connections dropped, by reason
  std::uint64_t frames_received = 0, frames_sent = 0;
  std::uint64_t joins = 0;                ///< this node's (re)joins of the coordinator
  int nodes_expected = 0, nodes_alive = 0;  ///< coordinator only
  std::vector<DeviceInfo> devices;        ///< this node's devices
  /// Transfers this node received, per (source device, destination device).
  struct Link {
    std::uint64_t bytes = 0, transfers = 0;
    double seconds = 0;               ///< busy spans of the runs (first start to last end)
    double last_bytes_per_second = 0; ///< the link's bytes over its busy span in the last run
  };
  std::map<std::pair<std::uint32_t, std::uint32_t>, Link> links;
  /// Coordinator: the controller's decisions in jobs, by outcome (admitted, rejected), and
  /// the units of each model-stage in the last job's plan.
  std::map<std::string, std::uint64_t> decisions;
  std::map<std::string, std::uint64_t> job_units;
  std::uint64_t runs = 0;             ///< transition runs this node took part in
  double run_seconds = 0, last_run_seconds = 0;
  std::uint64_t transitions_ok = 0, transitions_failed = 0;  ///< coordinator: transitions driven
  double transition_seconds = 0;      ///< coordinator: their total duration
  /// Transition or job parts left behind because a transfer would not stop (a UCX get to
  /// a peer that went away): their memory stays allocated for good.
  std::uint64_t stuck_parts = 0;

  /// Counts one run's transfers (per link, as received here).
  void add_run(double seconds, const std::vector<Timing>& timings);
  /// Coordinator: counts a job's report (`nereus cluster job`'s JSON): its decisions and
  /// the units of its final plan. A report that is not such JSON counts nothing.
  void add_job_report(const std::string& report);
  /// "ucx" for a link from another node, "local" for one inside this node (device ids run
  /// node by node, devices.size() per node).
  std::string transport_of(std::uint32_t src) const;
};

/// The metrics as Prometheus text.
std::string render_prometheus(const Metrics& m);

}  // namespace nereus::cluster
