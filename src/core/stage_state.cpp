#include "nereus/core/stage_state.hpp"

#include <string>

#include "nereus/base/error.hpp"
#include "nereus/core/fill.hpp"

namespace nereus {

StageState rebatch(const StageState& s, std::string_view model_stage, int dp, std::int64_t max_micro_batch) {
  if (!dp_allowed(s.global_batch, dp))
    throw Error("model-stage '" + std::string(model_stage) + "': dp " + std::to_string(dp) +
                " does not divide the global batch of " + std::to_string(s.global_batch) +
                " sequences (the batch per step is kept across plan changes)");
  if (max_micro_batch < 1) throw Error("model-stage '" + std::string(model_stage) + "': the largest micro-batch must be positive");
  StageState out = s;
  out.dp = dp;
  const std::int64_t per_replica = s.global_batch / dp;
  // The largest micro-batch that divides the replica's batch: fewest accumulation steps.
  std::int64_t micro = std::min(per_replica, max_micro_batch);
  while (per_replica % micro != 0) --micro;
  out.micro_batch = micro;
  out.accumulation_steps = per_replica / micro;
  return out;
}

StageState initial_stage_state(std::string_view model_stage, std::int64_t global_batch, int dp,
                               std::int64_t max_micro_batch, std::uint64_t seed) {
  if (global_batch < 1)
    throw Error("model-stage '" + std::string(model_stage) + "': the global batch must be positive, got " +
                std::to_string(global_batch));
  StageState s;
  s.global_batch = global_batch;
  s.rng_seed = seed ^ fnv1a64(model_stage);
  return rebatch(s, model_stage, dp, max_micro_batch);
}

std::uint64_t replica_rng(const StageState& s, int replica) {
  return splitmix64(s.rng_seed ^ splitmix64(static_cast<std::uint64_t>(s.policy_version) * 0x10001ull +
                                            static_cast<std::uint64_t>(replica)));
}

}  // namespace nereus
