#pragma once
// A job's timeline on the coordinator's clock (`nereus cluster job --perfetto`, src/cluster
// only): the coordinator's phases (load, each transition, recovery, verify), every node
// of the transition graphs, and every transfer the nodes report, moved from each node's
// clock onto the coordinator's with the offset its heartbeats measured (clock_sync.hpp).
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nereus/base/trace_events.hpp"
#include "nereus/cluster/messages.hpp"
#include "nereus/cluster/transition_service.hpp"

namespace nereus::cluster::detail {

class JobTimeline {
 public:
  /// Starts the clock (the timeline's zero is now); `nodes` give the clock offsets; each
  /// node owns `devices_per_node` devices, numbered node by node.
  JobTimeline(const std::vector<NodeAddress>& nodes, int devices_per_node);

  /// A node that joined the job later (a restarted node): its clock offset now.
  void rejoined(const NodeAddress& n);
  /// Seconds since the timeline's zero, on the coordinator's clock.
  double now() const;
  /// A phase of the job on the coordinator's track.
  void phase(const std::string& name, double start, double end);
  /// A node of a transition graph (start and end on this timeline).
  void graph_node(const std::string& name, double start, double end, nlohmann::json args);
  /// The transfers node `rank` reported for building `unit`.
  void transfers(int rank, const RunDone& done, const std::string& unit);
  /// The Perfetto / Chrome trace JSON.
  nlohmann::json json() const;

 private:
  /// How a node moved it: inside a device, between its own devices, or from another node.
  std::string transport(const Timing& t) const;

  std::int64_t origin_ns_;
  int per_node_;
  std::map<int, std::int64_t> offset_ns_;
  TraceEvents trace_;
};

}  // namespace nereus::cluster::detail
