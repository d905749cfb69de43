#pragma once
// What a daemon counts, and its Prometheus text exposition (format 0.0.4), served on
// --metrics HOST:PORT at GET /metrics.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nereus/cluster/messages.hpp"

namespace nereus::cluster {

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
};

/// The metrics as Prometheus text.
std::string render_prometheus(const Metrics& m);

}  // namespace nereus::cluster
