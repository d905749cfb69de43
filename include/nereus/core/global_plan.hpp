#pragma once
// Global plans (architecture.md, "Plan"): one candidate — layout, dp and GPU list — per
// model-stage of a job, and the plan file format of docs/cli.md.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nereus/core/emu.hpp"
#include "nereus/core/job.hpp"

namespace nereus {

/// A global plan S: one collection spec per model-stage, in the job's stage order.
struct GlobalPlan {
  std::vector<std::pair<std::string, CollectionSpec>> stages;  ///< model-stage name → spec

  /// The spec of a model-stage, or null.
  const CollectionSpec* find(std::string_view model_stage) const;
  /// Every device the plan uses, sorted, each once.
  std::vector<DeviceId> devices() const;
};

/// The model-stages of a job in stage order (phase by phase, as JobSpec::phases()).
std::vector<ModelStage> model_stages(const JobSpec& job);

/// Parses a plan: a JSON object {"actor/generate": "tp=2,pp=1,dp=4,devices=0-7", ...} that
/// names every model-stage of the job exactly once. Errors name the model-stage and key.
GlobalPlan parse_global_plan(const JobSpec& job, std::string_view json_text, std::string_view origin);

/// `arg` is a path to a plan file, or the JSON text itself when it starts with '{'.
GlobalPlan load_global_plan(const JobSpec& job, std::string_view arg);

/// The plan file text of `plan` (one line per model-stage).
std::string to_json_text(const GlobalPlan& plan);
/// Whether `plan` places a unit on a device outside a pool of devices 0..gpus − 1.
bool outside_pool(const GlobalPlan& plan, int gpus);
/// One line: "model-stage=spec model-stage=spec ..." (logs, and as a key).
std::string to_string(const GlobalPlan& plan);
/// In an async job generation and training run at once: "G and T share GPU d" for the
/// first generation and training model-stages of `plan` on one GPU, empty when none are.
std::string streams_sharing_gpu(const JobSpec& job, const GlobalPlan& plan);

/// The EMU collections of a plan, one per model-stage in stage order; training stages carry
/// the optimizer slots. Throws Error (naming the model-stage) on an invalid collection or,
/// with device_count > 0, a device id out of range.
std::vector<Collection> plan_collections(const JobSpec& job, const GlobalPlan& plan, std::int64_t device_count = 0);

/// "actor" of "actor/train".
std::string_view role_of(std::string_view model_stage);

}  // namespace nereus
