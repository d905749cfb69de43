#pragma once
// Logical state that moves with the units of a model-stage besides its tensors: versions,
// counters, batch geometry, data and RNG positions (issue 4, "Logical state").
#include <cstdint>
#include <string_view>

namespace nereus {

/// What a model-stage must carry across a plan change so the run continues where it was.
struct StageState {
  std::int64_t policy_version = 0;       ///< version of the params its units hold
  std::int64_t update_count = 0;         ///< optimizer steps applied (training stages)
  std::int64_t minibatch_position = 0;   ///< sequences of the current step already consumed
  std::int64_t dataloader_position = 0;  ///< prompts consumed since the start of the run
  std::uint64_t rng_seed = 0;            ///< base seed; replica streams derive from it
  std::int64_t global_batch = 0;         ///< sequences per step, kept across DP changes
  std::int64_t micro_batch = 0;          ///< sequences per forward/backward of one replica
  std::int64_t accumulation_steps = 1;   ///< micro-batches per replica per step
  int dp = 1;                            ///< replicas the batch is split over

  std::int64_t per_replica_batch() const { return micro_batch * accumulation_steps; }
  bool operator==(const StageState&) const = default;
};

/// Initial state of a stage: the global batch over dp replicas, micro-batches of at most
/// max_micro_batch sequences. Throws Error like rebatch().
StageState initial_stage_state(std::string_view model_stage, std::int64_t global_batch, int dp,
                               std::int64_t max_micro_batch, std::uint64_t seed);

/// The same state over `dp` replicas: the global batch is kept; per-replica batch and
/// accumulation steps change (the micro-batch is the largest divisor of the per-replica
/// batch not above max_micro_batch). Throws Error naming the model-stage when dp does not
/// divide the global batch.
StageState rebatch(const StageState& s, std::string_view model_stage, int dp, std::int64_t max_micro_batch);

/// Whether `dp` replicas can share the global batch evenly.
inline bool dp_allowed(std::int64_t global_batch, int dp) { return dp > 0 && global_batch % dp == 0; }

/// RNG stream of replica `replica` at `version`: distinct per replica and version, the
/// same on every node that computes it.
std::uint64_t replica_rng(const StageState& s, int replica);

}  // namespace nereus
