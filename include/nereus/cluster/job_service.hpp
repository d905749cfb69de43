#pragma once
// A job's units across daemons (nereus cluster job). The coordinator's side (drive_job)
// runs the controller on the alive nodes' devices, loads the first plan's units onto the
// nodes, compiles the global transition graph to the plan the controller admits and
// executes it node by node of the graph: a build allocates its unit on the nodes that hold
// its GPUs and each of them pulls its bytes (UCX get), and the unit is committed only when
// every one of them has reported its bytes landed; a destroy frees a unit once the graph's
// edges allow. When a node is lost, the others abort their builds, every model-stage keeps
// a valid collection of its intact units (none with a GPU on a lost node), and the
// controller replans from them on the surviving devices. A node's side (NodeJob) holds the
// units on its devices, in the daemon's own device arenas.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/messages.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/cluster/node_part.hpp"
#include "nereus/cluster/transition_service.hpp"
#include "nereus/base/device.hpp"
#include "nereus/runtime/adopted_buffer.hpp"

namespace nereus::cluster {

class StepHost;

/// When a node named by a job's fault injection (`kill_node`, `freeze_node`) strikes: 3 ms
/// into its first build, at its first unit allocation (the job is loading), or `ms` after
/// the job opened on it.
struct FaultMoment {
  enum class At { build, load, after_open } at = At::build;
  int ms = 3;
};
/// "build" (also ""), "load" or "MSms" (0 ≤ MS ≤ 3,600,000); throws nereus::Error naming
/// the text otherwise.
FaultMoment parse_fault_moment(const std::string& text);

/// Runs the request over `nodes` (the alive nodes, each with `devices_per_node` devices of
/// `device_capacity` bytes) and returns the JSON report. Bad requests (a job, cluster or
/// plan that does not parse, a plan beyond the alive devices) throw nereus::Error; a node
/// lost on the way is reported in the JSON (failure, recovery). A node is lost when its
/// connection ends or when `membership(rank)` turns false (the heartbeats lost it). At
/// every step, the nodes `roster()` lists (the alive nodes now) that are not in the job —
/// restarted after a loss — join it, and the controller may grow onto them.
asio::awaitable<TransitionOutcome> drive_job(const JobRequest& request, const std::vector<NodeAddress>& nodes,
                                            int devices_per_node, std::uint64_t device_capacity, const std::string& token,
                                            std::function<bool(int)> membership = {},
                                            std::function<std::vector<NodeAddress>()> roster = {});

/// One node's part of a job, answering the coordinator on one channel.
class NodeJob final : public NodePart {
 public:
  /// Units live in `devices` (the daemon's arenas) or, for the units a job loads, in the
  /// framework's memory `adopt` names; builds are counted in `metrics`. Steps go to `host`
  /// (the framework in this process), or are answered at once without one. `machine`:
  /// DaemonOptions::machine.
  NodeJob(asio::io_context& io, int node_rank, std::vector<std::unique_ptr<Device>>& devices, Metrics& metrics,
          StepHost* host = nullptr, std::span<const AdoptedBuffer> adopt = {}, std::string machine = {});
  ~NodeJob();
  /// Whether a job is open on this channel (its messages go here).
  bool open() const;
  /// Cancels running builds and frees every unit (the coordinator finished or went away).
  asio::awaitable<void> close() override;

 private:
  bool takes_finish() const override { return open(); }
  void quarantine() override;
  asio::awaitable<Answer> answer(Channel& ch, const Envelope& m) override;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nereus::cluster
