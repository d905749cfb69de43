#pragma once
// Internal state of a Job and of a transition in flight (job.cpp, job_transition.cpp).
#include <chrono>
#include <memory>
#include <map>
#include <optional>
#include <vector>

#include "nereus/base/device.hpp"
#include "nereus/base/offload.hpp"
#include "nereus/runtime/graph_run.hpp"
#include "nereus/runtime/job.hpp"
#include "nereus/runtime/notifier.hpp"
#include "nereus/runtime/weight_update.hpp"
#include "nereus/transport/local.hpp"

namespace nereus {

/// A unit that exists: its EMU, its buffers in device arenas, the version of its params.
struct LiveUnit {
  Emu emu;
  std::vector<BufferSpec> buffers;
  std::vector<DeviceBuffer> memory;  ///< one per buffer
  std::int64_t version = 0;
  int in_use = 0;  ///< stage work or a weight sync reading or writing it
  int readers = 0; ///< weight updates copying its params: its training stage waits to write
  bool freed = false;
  /// Reset when the unit is freed: the framework's views of it (UnitView::lifetime) expire.
  std::shared_ptr<const void> lifetime = std::make_shared<char>(0);
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
  bool leaving = false;  ///< left, its devices held until the framework's work on them ends (StageLease::leave)
  std::vector<UnitPtr> retiring;  ///< old units to free once this step no longer needs them
  // Async jobs (job_update.cpp):
  std::int64_t runs = 0;  ///< completed runs (a generation stage runs many times a step)
  std::shared_ptr<UpdateRun> update;  ///< a weight update of this stage in flight (not yet switched)
  bool switch_pending = false;  ///< finish(wait) is waiting for the run in flight: no new run starts
  std::shared_ptr<std::int64_t> aborts = std::make_shared<std::int64_t>(0);  ///< switches with PauseMode::abort
};

/// A weight update in flight (weight_update.hpp): staging units beside the generation
/// stage's units, filled from the trainer's units while generation runs.
struct UpdateRun {
  enum class Phase { copying, ready, failed, switched };
  std::size_t stage = 0, trainer = 0;
  std::vector<UnitPtr> targets;  ///< the generation units, in replica order
  std::vector<UnitPtr> sources;  ///< the trainer's units it reads
  std::vector<UnitPtr> staging;  ///< one per target: the same buffers on the same devices
  std::vector<EngineTensor> metadata;
  Phase phase = Phase::copying;
  bool cancelled = false;
  std::vector<Executor*> active;  ///< the copy's executor while it runs (for cancel)
  std::chrono::steady_clock::time_point began;
  WeightUpdateReport report;
};

class JobState : public std::enable_shared_from_this<JobState> {
 public:
  JobState(asio::any_io_executor ex, JobSpec spec, JobOptions options);

  asio::any_io_executor ex;
  JobSpec spec;
  JobOptions options;
  std::vector<ModelStage> stages;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::uint64_t> adopted;  ///< per device: bytes of framework memory backing live units
  std::vector<char> adoption_used;     ///< per options.adopt entry
  std::uint64_t budget = 0;
  std::uint64_t cap_violations = 0;
  std::unique_ptr<Transport> own_transport;
  int gpus = 1;  ///< GPU memory: device d is on GPU d mod gpus
  Transport* transport = nullptr;
  std::vector<StageSlot> slots;
  std::vector<int> busy;  ///< per device: stages running on it
  std::vector<std::uint64_t> step_peak;  ///< per device: DeviceUse::step_peak
  std::int64_t step = 0;
  Notifier changed;       ///< any change of the state below
  std::shared_ptr<TransitionRun> transition;  ///< in flight, or finished but not yet in effect
  Offload offload;  ///< the quantize pass of FP8 copies, off the event loop
  std::vector<WeightUpdateReport> update_log;  ///< async: every update switched in (Job::weight_updates)

  std::size_t index(std::string_view model_stage) const;
  /// Allocates a unit's buffers; throws Error (counting a cap violation) over the budget.
  /// Replica `adopt_as` >= 0 takes the framework memory options.adopt names for it.
  UnitPtr allocate_unit(std::size_t stage, const Emu& e, int adopt_as = -1);
  /// Bytes in use on device d: its arena and adopted memory.
  std::uint64_t used(DeviceId d) const { return devices[static_cast<std::size_t>(d)]->used() + adopted[static_cast<std::size_t>(d)]; }
  DeviceBuffer allocate(DeviceId d, std::size_t bytes, const std::string& what);
  void free_unit(LiveUnit& u);
  /// Whether a stage's old units are no longer needed by the current step.
  bool retired(std::size_t stage) const;
  /// Frees units waiting for their stage to retire.
  void free_retired();
  /// Collection of the units of one stage (for plan output and planning).
  Collection collection(std::size_t stage, const std::vector<UnitPtr>& units) const;
  /// Devices 0 .. devices−1.
  std::vector<DeviceId> all_devices() const;
  /// The framework's fence over `devices`: an event on its stream (`streams`; a GPU not
  /// named: its default stream) of each GPU they are on; none for host memory.
  std::vector<std::shared_ptr<DeviceEvent>> framework_events(std::span<const FrameworkStream> streams,
                                                             std::span<const DeviceId> devices) const;
  /// Copies `sources` (stage `from`) into the units `targets` (stage `to`) with the
  /// reshard planner and the executor: a weight sync, or one build of a transition.
  /// Async jobs: keeps generation stage `i` within max_staleness of its trainer before a
  /// run, beginning and switching an update itself when the framework has not (job_update.cpp).
  asio::awaitable<void> within_staleness(std::size_t i);
  /// Starts an update of generation stage `i` (Job::begin_weight_update).
  std::shared_ptr<UpdateRun> begin_update(std::size_t i);
  /// Switches a ready update in (the caller has seen to its boundary); `pause_from` is when
  /// the stage stood still.
  asio::awaitable<void> switch_in(std::shared_ptr<UpdateRun> u, PauseMode p, std::chrono::steady_clock::time_point pause_from,
                                  std::vector<std::shared_ptr<DeviceEvent>> after);
  /// The training stage of generation stage i's model, or none.
  std::optional<std::size_t> trainer_of(std::size_t i) const;
  /// Async jobs: the error for a plan that puts a generation and a training stage on one
  /// device; empty when it keeps them apart.
  std::string shared_device(const std::vector<Collection>& plan) const;

  asio::awaitable<ExecutionReport> copy_units(const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>>& sources,
                                              std::size_t to, const std::vector<UnitPtr>& targets,
                                              std::vector<Executor*>* active = nullptr);
};

/// A transition in flight: the graph interpreter over the job's units in this process.
/// Units get ids for the interpreter; the framework's running steps gate when a node may
/// start, and an old unit the running step still needs is freed by its stage later.
class TransitionRun final : public UnitSpace, public std::enable_shared_from_this<TransitionRun> {
 public:
  TransitionRun(std::shared_ptr<JobState> job, TransitionGraph graph, std::int64_t effective_step);

  std::shared_ptr<JobState> job;
  TransitionGraph graph;
  std::int64_t effective_step;
  bool finished = false;
  TransitionReport report;
  Notifier done;
  /// The framework's work it waits for before its first node (Job::begin_transition).
  std::vector<std::shared_ptr<DeviceEvent>> after;

  /// Runs the graph and fills the report.
  asio::awaitable<void> run();
  void stop(std::string why, bool by_cancel) { run_.stop(std::move(why), by_cancel); }
  /// Puts switched stages on their new units once the effective step has come.
  void take_effect();
  /// Whether a stage's new units are in effect.
  bool applied(std::size_t stage) const { return applied_[stage] != 0; }

  // UnitSpace
  Notifier& changed() override { return job->changed; }
  const std::vector<ModelStage>& stages() const override { return job->stages; }
  std::int64_t batch() const override { return job->spec.prompts_per_step * job->spec.samples_per_prompt; }
  bool may_start(const GraphRun& run, std::uint32_t x) const override;
  bool hand_over(const GraphRun& run, std::uint32_t x) override;
  asio::awaitable<UnitId> allocate(const GraphRun& run, std::uint32_t x) override;
  asio::awaitable<std::uint64_t> fill(const GraphRun& run, std::uint32_t x, UnitId id, const SourceGroups& sources) override;
  asio::awaitable<void> free(UnitId id) override;
  bool live(UnitId id) const override { return !unit(id)->freed; }
  void stage_built(std::size_t stage, const std::vector<UnitId>& units) override;
  asio::awaitable<void> stopping() override;
  void node_finished() override { job->free_retired(); }
  asio::awaitable<void> settle(std::size_t stage, const StageEnd& end) override;

 private:
  UnitId add(UnitPtr u);
  const UnitPtr& unit(UnitId id) const { return units_.at(id); }
  std::vector<UnitPtr> units_of(const std::vector<UnitId>& ids) const;

  std::map<UnitId, UnitPtr> units_;
  UnitId next_id_ = 1;
  std::vector<char> applied_;  ///< per stage: new units in effect
  std::vector<Executor*> active_;
  GraphRun run_;
};

/// Returns once every event is ready (null ones are), polling from the loop every 20 µs
/// as the cuda transport polls its own.
asio::awaitable<void> until_ready(asio::any_io_executor ex, std::vector<std::shared_ptr<DeviceEvent>> events);

/// A unit's buffers as host memory, for the control path (fills, checks, checkpoints): the
/// buffers themselves on host devices; for GPU memory, copies (downloaded when `read`)
/// that commit() uploads back.
class HostMirror {
 public:
  HostMirror(LiveUnit& u, bool read) : u_(u) {
    for (auto& m : u.memory) {
      if (m.kind() == MemoryKind::host) {
        spans_.emplace_back(m.data(), m.size());
        continue;
      }
      copies_.emplace_back(m.size());
      if (read) copy_to_host(m.kind(), copies_.back().data(), m.data(), m.size());
      spans_.emplace_back(copies_.back().data(), m.size());
    }
  }
  std::byte* data(std::size_t b) const { return spans_[b].data(); }
  const std::vector<std::span<std::byte>>& spans() const { return spans_; }
  /// Uploads the copies of GPU buffers.
  void commit() const {
    std::size_t k = 0;
    for (auto& m : u_.memory)
      if (m.kind() != MemoryKind::host) {
        copy_from_host(m.kind(), m.data(), copies_[k].data(), m.size());
        ++k;
      }
  }

 private:
  LiveUnit& u_;
  std::vector<std::vector<std::byte>> copies_;
  std::vector<std::span<std::byte>> spans_;
};

}  // namespace nereus
