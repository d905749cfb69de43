#pragma once
// A framework process as its node of a cluster (docs/cluster.md, "A framework as a
// node"): the node's daemon runs inside the process, on a thread of its own, and the
// framework runs the job's steps on the units this node holds.
//
//   Member m(options);                       // binds, joins the coordinator
//   while (auto step = m.next_step()) {      // the coordinator asks for step k
//     for (NodeUnit& u : step->units) ...    // compute on the units' memory in place
//                                            // (GPU memory when device_kind is cuda: NodeUnit::kind)
//     m.report({{{"actor/train", 1.8}}});    // measured times: the controller calibrates
//   }                                        // nullopt: the job on this node ended
//
// In an async job (docs/cluster.md, "Async jobs across nodes") steps come in two streams,
// NodeStep::stream: generation steps on the generation units and training steps on the
// others, and the framework may hold one of each at once.
//
// Between two steps (or beside one, with `cluster job --overlap`, never touching the
// step's units) the coordinator may run a transition: the next step's units can be
// others, on other devices. A view is valid until report().
#include <chrono>
#include <memory>
#include <optional>

#include "nereus/cluster/daemon.hpp"
#include "nereus/cluster/step_host.hpp"

namespace nereus::cluster {

class Member {
 public:
  /// Binds the node's addresses (throws Error naming one in use) and starts joining the
  /// coordinator on the member's thread. `options.step_host` is the member's own.
  explicit Member(DaemonOptions options);
  /// Stops the node (its units are freed) and joins its thread. As the coordinator (rank
  /// 0), it first answers the client of a job in hand (at most 10 s).
  ~Member();
  Member(const Member&) = delete;
  Member& operator=(const Member&) = delete;

  Endpoint listening() const;
  /// Where the node's Prometheus endpoint listens (DaemonOptions::metrics), if it has one.
  std::optional<Endpoint> metrics_listening() const;
  /// Waits up to `timeout` for a step or the end of the job on this node; true when
  /// next_step() will not block.
  bool wait(std::chrono::milliseconds timeout);
  /// The next step the coordinator asks for, or nullopt once the job on this node ended
  /// (finished, or the coordinator went away). Blocks until one of them. Throws Error when
  /// the node stopped (it could not join: the daemon's error), or when the step before was
  /// not reported.
  std::optional<NodeStep> next_step();
  /// Answers the step next_step() gave with what the framework measured (zeros where it
  /// measured nothing); when the job ended meanwhile, the report goes nowhere. Throws
  /// Error when there is no step to answer, or when two are unanswered (an async job's
  /// generation and training steps: the overload below names which).
  void report(StepDone measured);
  /// Answers the unreported step of `stream` (async jobs: one step of each stream may be
  /// in hand at once, e.g. on two threads of the framework).
  void report(StepStream stream, StepDone measured);
  /// Whether the node is still running (false after an error or stop()).
  bool running() const;
  void stop();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nereus::cluster
