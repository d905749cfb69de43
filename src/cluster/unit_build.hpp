#pragma once
// A job's unit build as a reshard (src/cluster only). The coordinator and every node of a
// build derive its plan from the same message with these functions: with two-sided builds
// each end binds its side of the same messages, so they must agree exactly, and one
// function written once is how they do.
#include <vector>

#include "nereus/cluster/messages.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/plan/reshard.hpp"

namespace nereus::cluster::detail {

/// The unit `u` names, one unit of its model-stage; throws naming what is wrong.
Collection unit_collection(const std::vector<ModelStage>& stages, const UnitDesc& u);

/// Build `b`'s reshard: its source groups (in order, one model-stage each) to its target,
/// which `b.unit` describes.
ReshardPlan plan_build(const std::vector<ModelStage>& stages, const UnitBuild& b);

}  // namespace nereus::cluster::detail
