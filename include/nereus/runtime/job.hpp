#pragma once
// The job runtime: the embedding API of issue 4. A Job owns a job's units (EMUs with real
// buffers in capped device arenas), runs the framework's stage work on them, and changes
// plan with the global transition graph while steps keep running:
//
//   Job job(io.get_executor(), spec, plan, options);
//   co_await job.run_stage("actor/generate", work);   // work(UnitContext&) per unit
//   auto h = job.begin_transition(new_plan);          // compiles, checks memory, starts
//   co_await job.run_stage("reference/infer", work);  // the transition runs alongside
//   co_await job.end_step();                          // weight sync; the new plan takes over
//   co_await job.run_stage("actor/generate", work);   // awaits exactly its new units
//   TransitionReport r = co_await h.wait();
//
// Everything runs on one executor (one thread); copies run on the transport's threads.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/core/global_plan.hpp"
#include "nereus/core/stage_state.hpp"
#include "nereus/plan/transition_graph.hpp"
#include "nereus/base/asio.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/graph_run.hpp"
#include "nereus/runtime/unit_store.hpp"

namespace nereus {

struct JobOptions {
  int devices = 8;                 ///< host devices 0 .. devices−1 (the GPU pool)
  std::size_t capacity = 1 << 30;  ///< arena bytes per device
  double headroom = 0.1;           ///< share of each device never used
  /// Working memory a model-stage allocates per device while it runs.
  std::vector<std::pair<std::string, std::uint64_t>> workspace;
  std::int64_t max_micro_batch = 8;
  std::uint64_t seed = 1;
  bool fill = false;         ///< write the verification fill into the first units (tests, benches)
  bool avoid_busy = true;    ///< a transfer waits while a stage runs on its devices
  LinkModel links;           ///< for the transition cost estimate
  ExecutorOptions executor;  ///< per-link concurrency and chunking of each build
  unsigned copy_threads = 1;
  /// Moves bytes between devices; null: a local copy transport owned by the job.
  Transport* transport = nullptr;
};

/// What stage work sees of one unit.
class UnitContext {
 public:
  std::string_view model_stage() const { return stage_; }
  const Emu& emu() const { return *emu_; }
  int replica() const { return replica_; }          ///< index among the stage's units
  const StageState& state() const { return *state_; }
  std::int64_t version() const { return version_; }  ///< version of the params it holds
  std::uint64_t rng() const { return replica_rng(*state_, replica_); }
  /// Buffers of the unit (sharding.md packing) with their memory.
  const std::vector<BufferSpec>& buffers() const { return *buffers_; }
  std::span<std::byte> memory(std::size_t buffer) const { return memory_[buffer]; }

 private:
  friend class Job;
  std::string stage_;
  const Emu* emu_ = nullptr;
  int replica_ = 0;
  const StageState* state_ = nullptr;
  std::int64_t version_ = 0;
  const std::vector<BufferSpec>* buffers_ = nullptr;
  std::vector<std::span<std::byte>> memory_;
};

/// The framework's work for one unit of a model-stage.
using StageWork = std::function<asio::awaitable<void>(UnitContext&)>;

/// Device memory as the job's accounting sees it.
struct DeviceUse {
  DeviceId device;
  std::uint64_t used, peak, budget;
};

class TransitionRun;

/// A transition in flight: await it, or cancel it.
class TransitionHandle {
 public:
  TransitionHandle() = default;
  explicit TransitionHandle(std::shared_ptr<TransitionRun> run) : run_(std::move(run)) {}
  /// Completes when the transition has finished, failed or been cancelled (and rolled back).
  asio::awaitable<TransitionReport> wait();
  /// Stops it: in-flight copies are cancelled; every model-stage keeps a complete
  /// collection of its old plan, or of its new one if it had already switched.
  void cancel();
  bool done() const;
  bool valid() const { return run_ != nullptr; }

 private:
  std::shared_ptr<TransitionRun> run_;
};

class JobState;

class Job {
 public:
  /// Allocates the initial plan's units (filled with the verification fill when asked).
  /// Throws Error on a plan that does not fit the devices or the budget.
  Job(asio::any_io_executor ex, JobSpec spec, const GlobalPlan& initial, JobOptions options = {});
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobSpec& spec() const;
  /// Each model-stage's collection in effect for the current step.
  GlobalPlan plan() const;
  const StageState& state(std::string_view model_stage) const;
  std::int64_t step() const;

  /// Runs `work` on every unit of a model-stage for the current step, concurrently.
  /// Waits for stages that share its devices, and — after a plan change — for exactly
  /// this model-stage's new units to be committed. Allocates its workspace meanwhile.
  asio::awaitable<void> run_stage(std::string model_stage, StageWork work);
  /// Ends the step (sync mode): weight sync from each training stage to its model's
  /// generation and inference stages; the next step starts.
  asio::awaitable<void> end_step();

  /// Compiles the transition to `target` and starts it; throws Error on bad input or an
  /// infeasible transition (nothing moves then). Stages that already ran this step keep
  /// their old units until the step ends; the new plan takes effect from the next step
  /// (or from this one, when no stage has run in it yet).
  TransitionHandle begin_transition(const GlobalPlan& target);
  /// begin_transition + wait.
  asio::awaitable<TransitionReport> transition(const GlobalPlan& target);

  /// Checks every live unit's bytes against the verification fill.
  FillCheck verify() const;
  std::vector<DeviceUse> devices() const;
  /// Allocations refused because they would have gone over a device's budget.
  std::uint64_t cap_violations() const;

 private:
  std::shared_ptr<JobState> s_;
};

}  // namespace nereus
