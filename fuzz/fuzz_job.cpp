// Job files, and global plans (--from-plan/--to-plan files) for the tiny PPO job.
#include "fuzz_target.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/core/job.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const nereus::JobSpec job = nereus::load_job("ppo-tiny");
  const auto text = fuzz::text_of(data, size);
  fuzz::tolerate_errors([&] { nereus::parse_job(text, "fuzz"); });
  fuzz::tolerate_errors([&] { nereus::parse_global_plan(job, text, "fuzz"); });
  return 0;
}
