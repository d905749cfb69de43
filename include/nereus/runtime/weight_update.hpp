#pragma once
// In-flight weight updates of an asynchronous job (job file `"mode": "async"`): the
// trainer's new params reach a generation model-stage while it keeps decoding, then switch
// in at a boundary the framework chooses — the shape inference engines take updates in
// ("begin, receive named tensors, finish"):
//
//   WeightUpdate u = job.begin_weight_update("actor/generate");  // copies into staging
//   ... generation keeps running on the old weights ...
//   co_await u.wait();                                           // staging complete
//   WeightUpdateReport r = co_await u.finish(PauseMode::keep);    // the switch
//
// The bytes land in staging buffers beside each generation unit (the same buffers, on the
// same devices, paid from the device budget until the switch), so a unit reads all old or
// all new weights, never a mix, and an update that fails leaves the old version intact.
// The switch swaps the staging in as the unit's memory; a unit backed by framework memory
// (JobOptions::adopt) has the staging copied into that memory instead.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/runtime/job.hpp"

namespace nereus {

/// Where the switch happens, as engines offer it.
enum class PauseMode {
  wait,   ///< once the stage's run in flight has ended (its sequences finished); the next run waits for the switch. Not from inside that run: it would wait on itself
  keep,   ///< now, between two decode steps of a run in flight (the caller is between them); its workspace (KV cache) stays
  abort,  ///< now, like keep, and the run in flight is told to drop its sequences (UnitContext::aborted)
};
std::string_view to_string(PauseMode p);
/// "wait", "keep" or "abort"; throws Error naming the mode otherwise.
PauseMode parse_pause_mode(std::string_view s);

/// One local buffer of a generation unit as an engine names it.
struct EngineTensor {
  DeviceId device = 0;
  std::string name;   ///< the buffer's name in the stage's packing (sharding.md)
  DType dtype = DType::bf16;
  std::vector<std::int64_t> shape;
  std::string slot;   ///< "param", or "scale" for an FP8 weight's block scales
};

struct WeightUpdateReport {
  std::string model_stage;
  std::int64_t version = 0;      ///< the policy version the units hold after the switch
  bool completed = false;
  std::string error;             ///< why it failed or was cancelled (the old version stays)
  PauseMode pause = PauseMode::keep;
  bool automatic = false;        ///< switched by the job to keep generation within max_staleness
  double started = 0;            ///< when it began, in seconds on the steady clock (CLOCK_MONOTONIC)
  double seconds = 0;            ///< begin to switch
  double copy_seconds = 0;       ///< begin to staging complete
  double paused_seconds = 0;     ///< the time the stage could not run: from the switch point to the switch
  std::uint64_t moved_bytes = 0; ///< between devices
  std::uint64_t copied_bytes = 0;///< within a device
  std::vector<std::int64_t> unit_versions;  ///< each unit's weight version after it ended
};

struct UpdateRun;

/// An update in flight. Copyable handle; every call on the job's executor.
class WeightUpdate {
 public:
  WeightUpdate() = default;
  WeightUpdate(std::shared_ptr<JobState> job, std::shared_ptr<UpdateRun> run);
  std::int64_t version() const;
  const std::string& model_stage() const;
  /// The generation units' local buffers, device by device, as an engine receives them.
  const std::vector<EngineTensor>& metadata() const;
  /// Whether the staging is complete (or the update failed or was cancelled).
  bool ready() const;
  /// Whether it has switched in (by finish() or by the job).
  bool switched() const;
  /// Completes when the staging is complete; throws Error when the copy failed.
  asio::awaitable<void> wait();
  /// Waits for the staging, then switches at `pause`'s boundary and returns the report.
  /// Throws Error when the update failed or was cancelled (no unit changed). GPU memory:
  /// the old weights are given back once the framework's work on `streams` is done.
  asio::awaitable<WeightUpdateReport> finish(PauseMode pause, std::vector<FrameworkStream> streams = {});
  /// Stops the copy and frees the staging; the units keep their version.
  void cancel();
  bool valid() const { return run_ != nullptr; }

 private:
  std::shared_ptr<JobState> s_;
  std::shared_ptr<UpdateRun> run_;
};

}  // namespace nereus
