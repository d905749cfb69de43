#pragma once
// Placement: which target GPU takes which position of which target unit, chosen to keep
// the most destination bytes on the device that already holds them.
#include <span>

#include "nereus/core/emu.hpp"

namespace nereus {

/// Returns `target` with its GPUs reassigned to positions. The node structure of the
/// given order is kept (the positions that share a node keep sharing one, so TP groups
/// inside a node stay inside a node); the optimiser chooses which node hosts which such
/// block and which GPU takes which position inside each node. Never worse than the
/// given order by the local-bytes measure; on ties the given order is kept.
Collection optimize_placement(std::span<const Collection> sources, const Collection& target,
                              int gpus_per_node);

}  // namespace nereus
