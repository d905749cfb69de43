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
// A framework that computes on its own threads holds a stage with enter_stage() instead
// of run_stage(), reads its units' shards as views (units()), and may back the initial
// units with memory it already owns (JobOptions::adopt). Weights and checkpoints:
// job_weights.cpp (docs/embedding.md).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/core/dtype.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/core/stage_state.hpp"
#include "nereus/plan/transition_graph.hpp"
#include "nereus/base/asio.hpp"
#include "nereus/runtime/adopted_buffer.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/graph_run.hpp"
#include "nereus/runtime/unit_store.hpp"

namespace nereus {

struct JobOptions {
  int devices = 8;                 ///< devices 0 .. devices−1 (the GPU pool)
  /// Where units live: host memory, or GPU memory (device d a cudaMalloc arena on GPU
  /// d mod `gpus`; copies by the cuda transport unless `transport` is given; fills,
  /// checks and checkpoints go through host copies). No GPU, or no CUDA in the build:
  /// the constructor throws an Error naming the device.
  MemoryKind memory = MemoryKind::host;
  int gpus = 0;                    ///< GPUs the devices spread over; 0: every GPU present
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
  /// Framework memory backing buffers of the initial plan's units; every entry must match
  /// a buffer (Job's constructor throws Error naming the first that does not).
  std::vector<AdoptedBuffer> adopt;
};

/// One tensor shard of one slot in a unit: a contiguous row-major block of `box`'s
/// extents at `data`, valid until a transition destroys its unit.
struct ShardView {
  DeviceId device = 0;
  TensorId tensor = 0;
  Slot slot = Slot::param;
  DType dtype = DType::bf16;
  Box box;               ///< global element coordinates
  std::byte* data = nullptr;
  MemoryKind kind = MemoryKind::host;  ///< the memory `data` is in
  int gpu = 0;                         ///< its CUDA ordinal, for GPU memory
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(box.elements()) * width(dtype); }
};

/// The shard views of a unit's buffers (fused buffers yield one view per part).
std::vector<ShardView> shard_views(const std::vector<BufferSpec>& buffers, std::span<const std::span<std::byte>> memory);

/// A unit of a model-stage as the framework sees it between calls.
struct UnitView {
  int replica = 0;
  Emu emu;
  std::int64_t version = 0;
  std::vector<ShardView> shards;  ///< every slot, buffer by buffer
  std::vector<BufferSpec> buffers;             ///< the unit's local buffers (sharding.md packing)
  std::vector<std::span<std::byte>> memory;    ///< one per buffer
  /// Expires when a transition frees the unit: its memory then belongs to the arena again,
  /// and the views above must not be used (the Python module raises instead).
  std::weak_ptr<const void> lifetime;
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
  /// Async jobs: a weight update switched in with PauseMode::abort since this run began;
  /// the work should drop its sequences in flight (the views it holds are expired).
  bool aborted() const;
  /// Buffers of the unit (sharding.md packing) with their memory.
  const std::vector<BufferSpec>& buffers() const { return *buffers_; }
  std::span<std::byte> memory(std::size_t buffer) const { return memory_[buffer]; }
  /// The unit's shards, every slot.
  std::vector<ShardView> shards() const { return shard_views(*buffers_, memory_); }
  /// This run's workspace on device d (Job::set_workspace bytes from that device's
  /// budget; empty when the stage has none): scratch such as a KV cache, valid until the
  /// stage is left.
  std::span<std::byte> workspace(DeviceId d) const;
  /// Expires when the unit is freed (UnitView::lifetime), for views kept past the stage.
  std::weak_ptr<const void> lifetime() const { return lifetime_; }

 private:
  friend class Job;
  std::weak_ptr<const void> lifetime_;
  std::string stage_;
  const Emu* emu_ = nullptr;
  int replica_ = 0;
  const StageState* state_ = nullptr;
  std::int64_t version_ = 0;
  const std::vector<BufferSpec>* buffers_ = nullptr;
  std::vector<std::span<std::byte>> memory_;
  std::vector<std::pair<DeviceId, std::span<std::byte>>> workspace_;
  std::shared_ptr<const std::int64_t> aborts_;  ///< the stage's abort count, and its value at entry
  std::int64_t aborts_at_entry_ = 0;
};

/// The framework's work for one unit of a model-stage.
using StageWork = std::function<asio::awaitable<void>(UnitContext&)>;

/// Device memory as the job's accounting sees it.
struct DeviceUse {
  DeviceId device;
  std::uint64_t used, peak, budget;
  /// The most in use when a stage of the current step entered (its units, the other
  /// stages' units and its workspace on the device): the step's peak as the controller
  /// models it, without a transition's staging. Reset by end_step().
  std::uint64_t step_peak = 0;
};

class TransitionRun;
class WeightUpdate;  // weight_update.hpp
struct WeightUpdateReport;
class JobState;
struct LiveUnit;

/// A framework's CUDA stream on one GPU (a cudaStream_t as an integer; 0: the GPU's
/// legacy default stream, where PyTorch enqueues unless told otherwise).
struct FrameworkStream {
  int gpu = 0;
  std::uintptr_t stream = 0;
};

/// A model-stage held busy while the framework computes on its units (Job::enter_stage):
/// transitions schedule their transfers around its devices until leave().
class StageLease {
 public:
  StageLease() = default;
  StageLease(StageLease&&) noexcept;
  StageLease& operator=(StageLease&&) noexcept;
  /// Leaves as failed when still held (call leave() on the job's executor instead).
  ~StageLease();

  const std::vector<UnitContext>& units() const { return ctx_; }
  bool held() const { return s_ != nullptr; }
  /// Leaves the stage: `completed` counts it as run this step (a training stage's units
  /// then hold the next policy version) at once. Its devices, units and workspace are
  /// given back once the framework's work on them is done: for GPU memory, an event is
  /// recorded on the framework's stream of each GPU the stage uses (`streams`; a GPU not
  /// named: its legacy default stream), and until every one is ready transitions do not
  /// touch its devices, nothing it used is freed, and end_step() waits. Host memory: at
  /// once. Call on the job's executor.
  void leave(bool completed = true, std::span<const FrameworkStream> streams = {});
  /// The same with the framework's own completion events (null or ready: done).
  void leave_after(bool completed, std::vector<std::shared_ptr<DeviceEvent>> events);

 private:
  friend class Job;
  std::shared_ptr<JobState> s_;
  std::size_t stage_ = 0;
  std::vector<std::shared_ptr<LiveUnit>> units_;
  std::vector<DeviceBuffer> workspace_;
  std::vector<UnitContext> ctx_;
};

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
  /// The waiting and holding of run_stage() without the work: for a framework computing
  /// on its own threads. Throws Error when the stage is already held.
  asio::awaitable<StageLease> enter_stage(std::string model_stage);
  /// Bytes per device each run of `model_stage` allocates as its workspace from now on
  /// (UnitContext::workspace), and transitions compiled from now on keep free for it.
  /// Throws Error naming an unknown model-stage.
  void set_workspace(std::string_view model_stage, std::uint64_t bytes);
  /// The units of a model-stage in effect now, in replica order.
  std::vector<UnitView> units(std::string_view model_stage) const;
  /// Ends the step: weight sync from each training stage to its model's generation and
  /// inference stages (an async job's generation stages are left to weight updates); the
  /// next step starts. GPU memory: first waits for
  /// the framework's work queued on `streams` (a GPU not named: its default stream) and
  /// for every stage left while its work still ran (StageLease::leave).
  asio::awaitable<void> end_step(std::span<const FrameworkStream> streams = {});

  /// Compiles the transition to `target` and starts it; throws Error on bad input or an
  /// infeasible transition (nothing moves then). Stages that already ran this step keep
  /// their old units until the step ends; the new plan takes effect from the next step
  /// (or from this one, when no stage has run in it yet). GPU memory: no byte moves
  /// before the framework's work queued on `streams` (as end_step) has completed.
  TransitionHandle begin_transition(const GlobalPlan& target, std::span<const FrameworkStream> streams = {});
  /// Async jobs (weight_update.hpp): starts copying the trainer's current params into
  /// staging beside `model_stage`'s units (a generation stage of a trained model) while
  /// generation keeps running. Throws Error when the job is not async, the stage is not a
  /// generation stage, its trainer is running (begin after it leaves), an update of the
  /// stage is already in flight, the units already hold that version, a transition is in
  /// flight, or the staging does not fit a device's budget; nothing changes then.
  WeightUpdate begin_weight_update(std::string_view model_stage);
  /// Async jobs: how many versions generation may run behind the trainer.
  std::int64_t max_staleness() const;
  /// Async jobs: the report of every weight update switched in so far, in order (those the
  /// job began itself to keep generation within max_staleness included).
  std::vector<WeightUpdateReport> weight_updates() const;

  /// begin_transition + wait.
  asio::awaitable<TransitionReport> transition(const GlobalPlan& target, std::span<const FrameworkStream> streams = {});

  /// Checks every live unit's bytes against the verification fill.
  FillCheck verify() const;
  /// Where the units live, and the GPU of a device when that is GPU memory. Fixed at
  /// construction (safe to read from any thread).
  MemoryKind memory() const;
  int gpu_of(DeviceId device) const;
  std::vector<DeviceUse> devices() const;
  /// Allocations refused because they would have gone over a device's budget.
  std::uint64_t cap_violations() const;

  // Weights and checkpoints (job_weights.cpp). Synchronous file I/O on the caller's
  // thread, which must be the job's executor; call between steps, with no transition in
  // flight and no stage held (Error otherwise). Nothing changes when one throws before
  // the first byte is written into a unit.

  /// Reads a checkpoint (a .safetensors file, or a model.safetensors.index.json with its
  /// shard files) into the units of `what` — a model-stage, or a model's role ("actor")
  /// for all its stages: param, and for training stages master (as f32) with zeroed Adam
  /// moments. Each unit reads only its own boxes. Throws Error naming a missing tensor or a
  /// shape that does not match.
  void load_weights(std::string_view what, const std::string& path);
  /// Writes one slot of a model-stage as a .safetensors file with the model's tensor
  /// names, gathered from the boxes of replica 0 one tensor at a time.
  void save_weights(std::string_view model_stage, const std::string& path, Slot slot = Slot::param) const;
  /// Writes DIR/checkpoint.json (step, plan, each stage's state and unit versions) and
  /// DIR/<stage>.<slot>.safetensors for every stage and slot, from replica 0 (DP replicas
  /// hold the same state).
  void save_checkpoint(const std::string& dir) const;
  /// A job continued from save_checkpoint(DIR): its plan, every slot's bytes in every
  /// replica, the step, states and versions. Throws Error when the checkpoint does not
  /// belong to `spec` or does not fit the devices.
  static std::unique_ptr<Job> resume(asio::any_io_executor ex, JobSpec spec, const std::string& dir, JobOptions options = {});

 private:
  std::shared_ptr<JobState> s_;
};

}  // namespace nereus
