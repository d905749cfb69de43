#include "nereus/cluster/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

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
    l.seconds += s.hi > s.lo ? s.hi - s.lo : 0;
    l.last_bytes_per_second = s.gbps() * 1e9;
  }
}

std::string Metrics::transport_of(std::uint32_t src) const {
  const std::size_t per_node = std::max<std::size_t>(1, devices.size());
  return static_cast<int>(src / per_node) == node_rank ? "local" : "ucx";
}

void Metrics::add_job_report(const std::string& report) {
  const nlohmann::json j = nlohmann::json::parse(report, nullptr, false);
  if (!j.is_object()) return;
  auto count = [&](const nlohmann::json& d) {
    if (d.is_object() && d.contains("admitted")) ++decisions[d.value("admitted", false) ? "admitted" : "rejected"];
  };
  for (const char* list : {"steps", "failures"})  // every step's decision, every recovery's
    if (j.contains(list) && j[list].is_array())
      for (const auto& x : j[list])
        if (x.is_object() && x.contains("decision")) count(x["decision"]);
  if (j.contains("plan") && j["plan"].is_object()) {
    job_units.clear();
    for (const auto& [stage, spec] : j["plan"].items()) {
      // The replicas of a layout spec "tp=..,pp=..,dp=D,...": one unit each.
      const std::string text = spec.is_string() ? spec.get<std::string>() : "";
      const auto at = text.find("dp=");
      job_units[stage] = at == std::string::npos ? 1 : std::strtoull(text.c_str() + at + 3, nullptr, 10);
    }
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
    out += fmt::format("nereus_link_bytes_total{{{},src=\"{}\",dst=\"{}\",transport=\"{}\"}} {}\n", node, k.first, k.second,
                       m.transport_of(k.first), l.bytes);
  metric("nereus_link_transfers_total", "counter", "Transfers this node received, per source and destination device.");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_transfers_total{{{},src=\"{}\",dst=\"{}\",transport=\"{}\"}} {}\n", node, k.first, k.second,
                       m.transport_of(k.first), l.transfers);
  metric("nereus_link_seconds_total", "counter", "Busy time of each link in transition runs (first transfer start to last end, per run).");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_seconds_total{{{},src=\"{}\",dst=\"{}\",transport=\"{}\"}} {:.6f}\n", node, k.first, k.second,
                       m.transport_of(k.first), l.seconds);
  metric("nereus_link_bytes_per_second", "gauge", "Each link's bytes over its busy span in the last run.");
  for (const auto& [k, l] : m.links)
    out += fmt::format("nereus_link_bytes_per_second{{{},src=\"{}\",dst=\"{}\",transport=\"{}\"}} {:.0f}\n", node, k.first, k.second,
                       m.transport_of(k.first), l.last_bytes_per_second);
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
    metric("nereus_decisions_total", "counter", "The controller's decisions in jobs, by outcome.");
    for (const char* outcome : {"admitted", "rejected"}) {
      const auto it = m.decisions.find(outcome);
      out += fmt::format("nereus_decisions_total{{outcome=\"{}\"}} {}\n", outcome, it == m.decisions.end() ? 0 : it->second);
    }
    metric("nereus_job_units", "gauge", "Units of each model-stage in the last job's plan.");
    for (const auto& [stage, n] : m.job_units) out += fmt::format("nereus_job_units{{model_stage=\"{}\"}} {}\n", stage, n);
    metric("nereus_nodes", "gauge", "Nodes of the job, by state.");
    out += fmt::format("nereus_nodes{{state=\"expected\"}} {}\n", m.nodes_expected);
    out += fmt::format("nereus_nodes{{state=\"alive\"}} {}\n", m.nodes_alive);
  }
  return out;
}

}  // namespace nereus::cluster
