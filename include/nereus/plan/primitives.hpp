#pragma once
// The Nereus primitives as transformations of EMU collections. Each returns the
// collection after the primitive; compile() turns before → after into a transfer set.
#include <cstddef>
#include <span>
#include <vector>

#include "nereus/core/emu.hpp"
#include "nereus/plan/reshard.hpp"

namespace nereus {

/// Split: unit `unit` becomes k units of `smaller` on the same GPUs, in order (unit i
/// takes the i-th run of tp·pp of them). k·|smaller| must equal the unit's size.
Collection split(const Collection& c, std::size_t unit, const Layout& smaller);

/// Merge: units `units` (replicas) become one unit of `larger` on their GPUs,
/// concatenated in the order given; it takes the place of the first of them.
Collection merge(const Collection& c, std::span<const std::size_t> units, const Layout& larger);

/// Extend: new replicas of the collection's first unit's layout on `gpus` (disjoint
/// from the collection's), |layout| GPUs each, appended in order.
Collection extend(const Collection& c, std::span<const DeviceId> gpus);

/// Destroy: drops unit `unit`. Refused for the last unit: nothing is lost only while
/// another replica holds the state.
Collection destroy(const Collection& c, std::size_t unit);

/// Sync target: the generation/inference model-stage `generation` as it will be after a
/// weight sync (param only); compile(train, synced) moves params only.
Collection sync_target(const Collection& train, const Collection& generation);

/// The transfer set that turns `before` into `after`.
inline ReshardPlan compile(const Collection& before, const Collection& after,
                           const ReshardOptions& options = {}) {
  return plan_reshard(before, after, options);
}

}  // namespace nereus
