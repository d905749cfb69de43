#include "nereus/cluster/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace nereus::cluster {

void LinkSpan::add(const Timing& t) {
  bytes += t.bytes;
  ++transfers;
  lo = std::min(lo, t.start);
  hi = std::max(hi, t.end);
}

void Metrics::add_run(double seconds, const std::vector<Timing>& timings) {
  ++runs;
  run_seconds += seconds;
  last_run_seconds = seconds;
  std::map<std::pair<std::uint32_t, std::uint32_t>, LinkSpan> spans;
  for (const Timing& t : timings) spans[{t.src, t.dst}].add(t);
  for (const auto& [key, s] : spans) {
    Link& l = links[key];
    l.bytes += s.bytes;
    l.transfers += s.transfers;
    l.last_gbps = s.gbps();
  }
}

std::string render_prometheus(const Metrics& m) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const std::string node = fmt::format("node=\"{}\"", m.node_rank);
  metric("nereus_heartbeats_sent_total", "counter", "Heartbeats this node sent to the coordinator.");
  out += fmt::format("nereus_heartbeats_sent_total{{{}}} {}\n", node, m.heartbeats_sent);
  metric("nereus_joins_total", "counter", "Times this node joined (1) or rejoined the coordinator.");
  out += fmt::format("nereus_joins_total{{{}}} {}\n", node, m.joins);
  metric("nereus_connections_accepted_total", "counter", "Control-plane connections accepted.");
  out += fmt::format("nereus_connections_accepted_total{{{}}} {}\n", node, m.connections_accepted);
  metric("nereus_auth_failures_total", "counter", "Connections refused for a wrong or missing token.");
  out += fmt::format("nereus_auth_failures_total{{{}}} {}\n", node, m.auth_failures);
  metric("nereus_connections_dropped_total", "counter", "Connections dropped, by reason.");
  for (const auto& [why, n] : m.dropped) out += fmt::format("nereus_connections_dropped_total{{{},reason=\"{}\"}} {}\n", node, why, n);
  metric("nereus_frames_total", "counter", "Control-plane frames, by direction.");
  out += fmt::format("nereus_frames_total{{{},direction=\"in\"}} {}\n", node, m.frames_received);
  out += fmt::format("nereus_frames_total{{{},direction=\"out\"}} {}\n", node, m.frames_sent);
  metric("nereus_device_memory_bytes", "gauge", "Device memory in use.");
  for (const auto& d : m.devices) out += fmt::format("nereus_device_memory_bytes{{{},device=\"{}\"}} {}\n", node, d.id, d.used);
  metric("nereus_device_memory_peak_bytes", "gauge", "Device memory peak use.");
  for (const auto& d : m.devices) out += fmt::format("nereus_device_memory_peak_bytes{{{},device=\"{}\"}} {}\n", node, d.id, d.peak);
  metric("nereus_device_memory_capacity_bytes", "gauge", "Device memory capacity.");
  for (const auto& d : m.devices)
    out += fmt::format("nereus_device_memory_capacity_bytes{{{},device=\"{}\"}} {}\n", node, d.id, d.capacity);
  metric("nereus_link_bytes_total", "counter", "Bytes this node received, per source and destination device.");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_bytes_total{{{},src=\"{}\",dst=\"{}\"}} {}\n", node, k.first, k.second, l.bytes);
  metric("nereus_link_transfers_total", "counter", "Transfers this node received, per source and destination device.");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_transfers_total{{{},src=\"{}\",dst=\"{}\"}} {}\n", node, k.first, k.second, l.transfers);
  metric("nereus_link_gbps", "gauge", "GB/s of each link over its busy span in the last run.");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_gbps{{{},src=\"{}\",dst=\"{}\"}} {:.6f}\n", node, k.first, k.second, l.last_gbps);
  metric("nereus_transition_runs_total", "counter", "Transition runs this node took part in.");
  out += fmt::format("nereus_transition_runs_total{{{}}} {}\n", node, m.runs);
  metric("nereus_transition_run_seconds_total", "counter", "Time this node spent in transition runs.");
  out += fmt::format("nereus_transition_run_seconds_total{{{}}} {:.6f}\n", node, m.run_seconds);
  metric("nereus_transition_run_last_seconds", "gauge", "This node's last transition run.");
  out += fmt::format("nereus_transition_run_last_seconds{{{}}} {:.6f}\n", node, m.last_run_seconds);
  metric("nereus_stuck_parts", "gauge", "Transition or job parts left behind: a transfer that would not stop.");
  out += fmt::format("nereus_stuck_parts{{{}}} {}\n", node, m.stuck_parts);
  if (m.coordinator) {
    metric("nereus_transitions_total", "counter", "Transitions the coordinator drove, by result.");
    out += fmt::format("nereus_transitions_total{{result=\"ok\"}} {}\n", m.transitions_ok);
    out += fmt::format("nereus_transitions_total{{result=\"failed\"}} {}\n", m.transitions_failed);
    metric("nereus_transition_seconds_total", "counter", "Total duration of the transitions the coordinator drove.");
    out += fmt::format("nereus_transition_seconds_total {:.6f}\n", m.transition_seconds);
    metric("nereus_heartbeats_received_total", "counter", "Heartbeats the coordinator received from all nodes.");
    out += fmt::format("nereus_heartbeats_received_total {}\n", m.heartbeats_received);
    metric("nereus_nodes", "gauge", "Nodes of the job, by state.");
    out += fmt::format("nereus_nodes{{state=\"expected\"}} {}\n", m.nodes_expected);
    out += fmt::format("nereus_nodes{{state=\"alive\"}} {}\n", m.nodes_alive);
  }
  return out;
}

}  // namespace nereus::cluster
