#pragma once
// The one interpreter of a global transition graph (architecture.md, "How a transition
// flows"). The job runtime uses it for units in this process, the coordinator for units
// on the daemons. It starts each node of the graph as soon as its edges and the unit
// space allow, refuses a destroy that would lose state, commits a build only once its
// bytes have landed, and when it stops early (failure, cancellation, a lost node) leaves
// every model-stage a valid collection. Where the units' bytes live, and how they are
// allocated, filled and freed, is the UnitSpace's business.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nereus/base/asio.hpp"
#include "nereus/core/stage_state.hpp"
#include "nereus/plan/transition_graph.hpp"
#include "nereus/runtime/notifier.hpp"

namespace nereus {

/// A unit as a unit space names it; 0 names none.
using UnitId = std::uint64_t;

/// Where a model-stage ended up after a transition.
struct StageOutcome {
  std::string model_stage;
  bool on_new_plan = false;
  std::string spec;  ///< its collection now, as a layout spec
};

/// When one node of the graph ran (seconds from the transition's start).
struct NodeRun {
  std::uint32_t node;
  NodeKind kind;
  double start = 0;
  double end = 0;
  std::uint64_t bytes = 0;  ///< bytes copied (over links and locally)
  std::string unit;         ///< the unit it built or freed, described
  std::vector<DeviceId> devices;  ///< that unit's devices
};

struct TransitionReport {
  bool completed = false;
  bool cancelled = false;
  std::string error;  ///< why it stopped, when it did
  std::vector<StageOutcome> stages;
  std::uint64_t moved_bytes = 0;  ///< planned over links
  std::uint64_t copied_bytes = 0; ///< actually copied (links and local)
  double seconds = 0;             ///< begin → last node
  double planned_seconds = 0;     ///< the graph's L_tran
  double plan_ms = 0;
  std::vector<NodeRun> nodes;
};

/// How one model-stage leaves a run.
struct StageEnd {
  bool on_new = false;         ///< every new unit was built: the new collection
  std::vector<UnitId> units;   ///< the collection it keeps: intact units, a DP degree that divides the batch
  std::vector<UnitId> retire;  ///< old units it no longer keeps, to free once no running step needs them
};

/// The source units of one build, grouped by the model-stage they belong to (graph order).
using SourceGroups = std::vector<std::pair<std::size_t, std::vector<UnitId>>>;

class GraphRun;

/// Where a graph's units live. Calls come from the run's executor, one at a time.
class UnitSpace {
 public:
  virtual ~UnitSpace() = default;
  /// Notified whenever something a waiting node may depend on changes.
  virtual Notifier& changed() = 0;
  virtual const std::vector<ModelStage>& stages() const = 0;
  /// The global batch: a model-stage's DP degree must divide it.
  virtual std::int64_t batch() const = 0;
  /// Why the run must stop now (a node was lost), if it must.
  virtual std::optional<std::string> failure() const { return std::nullopt; }
  /// Conditions beyond the graph's edges before node x may start (devices busy with the
  /// framework's stage work, units in use).
  virtual bool may_start(const GraphRun&, std::uint32_t) const { return true; }
  /// Destroy node x's unit is still needed by the running step: hand it to its stage to
  /// free later and return true, or return false to keep waiting.
  virtual bool hand_over(const GraphRun&, std::uint32_t) { return false; }
  /// Allocates build node x's unit; the run frees it unless it is committed.
  virtual asio::awaitable<UnitId> allocate(const GraphRun& run, std::uint32_t x) = 0;
  /// Fills unit `id` of build node x from `sources`; returns the bytes copied once every
  /// byte has landed.
  virtual asio::awaitable<std::uint64_t> fill(const GraphRun& run, std::uint32_t x, UnitId id, const SourceGroups& sources) = 0;
  /// Frees a unit now (a destroy node, a build that was not committed).
  virtual asio::awaitable<void> free(UnitId id) = 0;
  /// Whether a unit still holds its state.
  virtual bool live(UnitId) const { return true; }
  /// Whether none of its GPUs has been lost.
  virtual bool intact(UnitId) const { return true; }
  /// Every new unit of `stage` has been built (graph.to order).
  virtual void stage_built(std::size_t, const std::vector<UnitId>&) {}
  /// The run is stopping: stop the fills still running, as far as they can be stopped.
  virtual asio::awaitable<void> stopping() { co_return; }
  /// A node finished: free what became free.
  virtual void node_finished() {}
  /// Puts a model-stage on the collection the run leaves it.
  virtual asio::awaitable<void> settle(std::size_t stage, const StageEnd& end) = 0;
  /// "actor/train new unit 2 (GPUs 4:5)".
  virtual std::string describe(const GraphRun& run, const UnitRef& r) const;
};

class GraphRun {
 public:
  /// `olds`: per model-stage, the units of graph.from in order.
  GraphRun(UnitSpace& space, const TransitionGraph& graph, std::vector<std::vector<UnitId>> olds);

  /// Runs every node; on a stop, settles every model-stage; returns the report (without
  /// per-stage outcomes, which the caller knows how to describe).
  asio::awaitable<TransitionReport> run();
  /// Stops the run (first reason wins): nothing new starts, running fills are stopped.
  void stop(std::string why, bool cancelled);

  const TransitionGraph& graph() const { return graph_; }
  bool stopped() const { return stopping_; }
  /// The unit a graph reference names now (0: a new unit not built yet).
  UnitId unit(const UnitRef& r) const { return (r.target ? news_ : olds_)[r.stage][r.unit]; }
  double since() const;

 private:
  asio::awaitable<void> run_node(std::uint32_t x);
  asio::awaitable<void> watch();
  bool after_done(std::uint32_t x) const;
  bool try_hand_over(std::uint32_t x);
  asio::awaitable<void> build(std::uint32_t x);
  asio::awaitable<void> destroy(std::uint32_t x);
  void record(std::uint32_t x, double start, std::uint64_t bytes);
  StageEnd end_of(std::size_t stage, std::vector<UnitId>& discard) const;

  UnitSpace& space_;
  const TransitionGraph& graph_;
  std::vector<std::vector<UnitId>> olds_, news_;
  std::vector<std::vector<char>> destroyed_;  // per stage and old unit
  std::vector<std::size_t> builds_left_;      // per stage
  std::size_t builds_pending_ = 0;
  std::vector<char> node_done_;
  std::vector<UnitId> allocated_;  // per build node: the unit it allocated
  std::size_t finished_ = 0;
  bool stopping_ = false;
  TransitionReport report_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace nereus
