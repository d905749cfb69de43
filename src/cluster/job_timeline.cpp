#include "job_timeline.hpp"

#include "nereus/cluster/clock_sync.hpp"
#include "nereus/core/bytes.hpp"

namespace nereus::cluster::detail {

namespace {
constexpr int kCoordinator = 1;
int node_pid(int rank) { return 10 + rank; }
}  // namespace

JobTimeline::JobTimeline(const std::vector<NodeAddress>& nodes, int devices_per_node)
    : origin_ns_(node_clock_ns()), per_node_(devices_per_node) {
  trace_.process(kCoordinator, "coordinator");
  for (const NodeAddress& n : nodes) {
    offset_ns_[n.rank] = n.clock_rtt_ns >= 0 ? n.clock_offset_ns : 0;
    trace_.process(node_pid(n.rank), "node " + std::to_string(n.rank) + " · devices (receiving)");
  }
}

void JobTimeline::rejoined(const NodeAddress& n) {
  if (!offset_ns_.contains(n.rank)) trace_.process(node_pid(n.rank), "node " + std::to_string(n.rank) + " · devices (receiving)");
  offset_ns_[n.rank] = n.clock_rtt_ns >= 0 ? n.clock_offset_ns : 0;
}

double JobTimeline::now() const { return seconds_since(origin_ns_, node_clock_ns(), 0); }

void JobTimeline::phase(const std::string& name, double start, double end) {
  trace_.complete(kCoordinator, "job", name, start, end - start);
}

void JobTimeline::graph_node(const std::string& name, double start, double end, nlohmann::json args) {
  trace_.complete(kCoordinator, "transition graph", name, start, end - start, std::move(args));
}

std::string JobTimeline::transport(const Timing& t) const {
  if (t.src == t.dst) return "local copy";
  return static_cast<int>(t.src) / per_node_ == static_cast<int>(t.dst) / per_node_ ? "local" : "ucx";
}

void JobTimeline::transfers(int rank, const RunDone& done, const std::string& unit) {
  auto it = offset_ns_.find(rank);
  const double shift = seconds_since(origin_ns_, done.started_ns, it == offset_ns_.end() ? 0 : it->second);
  for (const Timing& t : done.timings) {
    const std::string name = human_bytes(t.bytes) + " " + std::to_string(t.src) + " → " + std::to_string(t.dst);
    const nlohmann::json args = {{"bytes", t.bytes}, {"transport", transport(t)},
                                 {"src", t.src},     {"dst", t.dst},
                                 {"node", rank},     {"unit", unit}};
    trace_.complete(node_pid(rank), "device " + std::to_string(t.dst), name, shift + t.start, t.end - t.start, args);
  }
}

nlohmann::json JobTimeline::json() const { return nlohmann::json::parse(trace_.dump()); }

}  // namespace nereus::cluster::detail
