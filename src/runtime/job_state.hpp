#pragma once
// Internal state of a Job and of a transition in flight (job.cpp, job_transition.cpp).
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "nereus/runtime/device.hpp"
#include "nereus/runtime/job.hpp"
#include "nereus/runtime/notifier.hpp"
#include "nereus/transport/local.hpp"

namespace nereus {

/// A unit that exists: its EMU, its buffers in device arenas, the version of its params.
struct LiveUnit {
  Emu emu;
  std::vector<BufferSpec> buffers;
  std::vector<DeviceBuffer> memory;  ///< one per buffer
  std::int64_t version = 0;
  int in_use = 0;  ///< stage work or a weight sync reading or writing it
  bool freed = false;
};
using UnitPtr = std::shared_ptr<LiveUnit>;

/// One model-stage of the job.
struct StageSlot {
  ModelStage stage;
  std::vector<UnitPtr> units;  ///< the collection the current step runs on
  std::vector<UnitPtr> next;   ///< after a transition's switch: the collection from its effective step on
  bool switched = false;
  StageState state;
  bool ran_this_step = false;
  bool claimed = false;  ///< a run_stage call owns it (maybe still waiting)
  bool running = false;  ///< its work runs on its units
  std::vector<UnitPtr> retiring;  ///< old units to free once this step no longer needs them
};

class JobState : public std::enable_shared_from_this<JobState> {
 public:
  JobState(asio::any_io_executor ex, JobSpec spec, JobOptions options);

  asio::any_io_executor ex;
  JobSpec spec;
  JobOptions options;
  std::vector<ModelStage> stages;
  std::vector<std::unique_ptr<HostDevice>> devices;
  std::uint64_t budget = 0;
  std::uint64_t cap_violations = 0;
  std::unique_ptr<LocalTransport> own_transport;
  Transport* transport = nullptr;
  std::vector<StageSlot> slots;
  std::vector<int> busy;  ///< per device: stages running on it
  std::int64_t step = 0;
  Notifier changed;       ///< any change of the state below
  std::shared_ptr<TransitionRun> transition;  ///< in flight, or finished but not yet in effect

  std::size_t index(std::string_view model_stage) const;
  /// Allocates a unit's buffers; throws Error (counting a cap violation) over the budget.
  UnitPtr allocate_unit(std::size_t stage, const Emu& e);
  DeviceBuffer allocate(DeviceId d, std::size_t bytes, const std::string& what);
  void free_unit(LiveUnit& u);
  /// Whether a stage's old units are no longer needed by the current step.
  bool retired(std::size_t stage) const;
  /// Frees units waiting for their stage to retire.
  void free_retired();
  /// Collection of the units of one stage (for plan output and planning).
  Collection collection(std::size_t stage, const std::vector<UnitPtr>& units) const;
  /// Copies `sources` (stage `from`) into the units `targets` (stage `to`) with the
  /// reshard planner and the executor: a weight sync, or one build of a transition.
  asio::awaitable<ExecutionReport> copy_units(const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>>& sources,
                                              std::size_t to, const std::vector<UnitPtr>& targets,
                                              std::vector<Executor*>* active = nullptr);
};

/// A transition in flight.
class TransitionRun : public std::enable_shared_from_this<TransitionRun> {
 public:
  TransitionRun(std::shared_ptr<JobState> job, TransitionGraph graph, std::int64_t effective_step);

  std::shared_ptr<JobState> job;
  TransitionGraph graph;
  std::int64_t effective_step;
  std::vector<std::vector<UnitPtr>> olds, news;  ///< per stage: old units (graph.from order), new units (graph.to order)
  std::vector<std::vector<char>> destroyed;      ///< per stage and old unit
  std::vector<int> builds_left;                  ///< per stage
  int builds_pending = 0;                        ///< over all stages
  std::vector<char> applied;                     ///< per stage: new units in effect
  std::vector<char> node_done;
  std::vector<Executor*> active;
  std::vector<NodeRun> runs;
  bool stopping = false;
  bool cancelled = false;
  bool finished = false;
  std::string error;
  TransitionReport report;
  Notifier done;
  std::chrono::steady_clock::time_point t0;

  /// Runs every node; on failure or cancellation rolls back; fills the report.
  asio::awaitable<void> run();
  void stop(std::string why, bool by_cancel);
  /// Puts switched stages on their new units once the effective step has come.
  void take_effect();

 private:
  asio::awaitable<void> run_node(std::uint32_t x);
  bool ready(std::uint32_t x) const;
  bool after_done(std::uint32_t x) const;
  /// Once every new unit is committed, an old unit whose stage still needs it this step
  /// is handed to the stage to free when the step no longer needs it.
  bool hand_over(std::uint32_t x);
  asio::awaitable<void> build(std::uint32_t x);
  void destroy(std::uint32_t x);
  void switch_stage(std::size_t stage);
  void roll_back();
  double since() const;
};

}  // namespace nereus
