#include "nereus/cluster/metrics.hpp"

#include <fmt/format.h>

namespace nereus::cluster {

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
  if (m.coordinator) {
    metric("nereus_heartbeats_received_total", "counter", "Heartbeats the coordinator received from all nodes.");
    out += fmt::format("nereus_heartbeats_received_total {}\n", m.heartbeats_received);
    metric("nereus_nodes", "gauge", "Nodes of the job, by state.");
    out += fmt::format("nereus_nodes{{state=\"expected\"}} {}\n", m.nodes_expected);
    out += fmt::format("nereus_nodes{{state=\"alive\"}} {}\n", m.nodes_alive);
  }
  return out;
}

}  // namespace nereus::cluster
