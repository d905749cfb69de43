#pragma once
// Shared by the transition driver and a node's part (src/cluster only).
#include "../bench/transition_bench.hpp"
#include "nereus/cluster/messages.hpp"

namespace nereus::cluster::detail {

/// The bench settings a transition request carries.
bench::TransitionConfig config_of(const TransitionSpec& s);

}  // namespace nereus::cluster::detail
