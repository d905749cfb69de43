#pragma once
// Transitions across daemons (nereus bench transition --daemons). The coordinator's side
// (drive_transition) plans the transition, connects to every node whose devices it
// touches (itself included), relays their UCX addresses, rkeys and buffer addresses,
// starts each run and waits until every node reports its bytes landed, verifies, dumps,
// and returns the bench's JSON report. A node's side (NodeTransition) holds its part: the
// units on its devices, its transports and executor, driven by those messages.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/launch.hpp"
#include "nereus/cluster/messages.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/cluster/node_part.hpp"

namespace nereus::cluster {

/// A node to drive: its rank, where it listens, and how far its clock is from the
/// coordinator's (clock_sync.hpp; rtt −1: not known yet, taken as 0).
struct NodeAddress {
  int rank = 0;
  Endpoint listen;
  std::int64_t clock_offset_ns = 0;
  std::int64_t clock_rtt_ns = -1;
};

/// Runs the transition over `nodes` (every alive node; each owns `devices_per_node`
/// devices, numbered node by node) and returns the report JSON; its `links` list the last
/// run's bytes, transfers and GB/s per (source node, destination node), from the
/// per-transfer timings every node reports. Bad requests throw
/// nereus::Error; a node lost mid-way is reported in the JSON (error, verified_sources).
struct TransitionOutcome {
  std::string report;  ///< the bench's JSON
  bool failed = false; ///< a node was lost or failed (the report says which)
};
asio::awaitable<TransitionOutcome> drive_transition(const TransitionSpec& spec, const std::vector<NodeAddress>& nodes,
                                                   int devices_per_node, const std::string& token);

/// One node's part of a transition, answering the coordinator on one channel.
class NodeTransition final : public NodePart {
 public:
  /// Runs are counted in `metrics` (per-link bytes and transfers, run times). `machine`:
  /// DaemonOptions::machine.
  NodeTransition(asio::io_context& io, int node_rank, std::uint64_t device_capacity, Metrics& metrics, std::string machine = {});
  ~NodeTransition();
  /// Releases everything (the coordinator went away mid-transition).
  asio::awaitable<void> close() override;

 private:
  bool takes_finish() const override { return true; }
  void quarantine() override;
  asio::awaitable<Answer> answer(Channel& ch, const Envelope& m) override;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nereus::cluster
