#pragma once
// The TP, PP and expert rules of sharding.md: which slab of which tensor a position holds.
// A position is (pipeline stage s, in-stage index g = e·tp + r); dense layouts have g = r.
//
// Every shard is a slab: a range along the tensor's split axis and the full extent of
// the other axis (replicated tensors: the full range of axis 0). Planning therefore
// works on 1-d ranges along that axis; boxes are built only for output. FSDP (sharding.md)
// keeps this for every tensor split by rows or not at all (its dim-0 chunk of the TP
// range is again a range), and cuts a column-split tensor's rows: such a shard is the
// slab's columns × fsdp_rows(), which the planner handles as row bands.
#include <optional>

#include "nereus/core/box.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// Axis a tensor kind is split along under TP: 0 rows, 1 columns, -1 replicated.
int split_axis(TensorKind kind);

/// Range along the split axis (axis 0 for replicated kinds) held by TP rank r of tp (for
/// an expert kind: expert rank r of etp = tp, for an expert its group holds).
Range tp_range(const ModelConfig& m, const TensorInfo& t, int tp, int r);

/// The expert group of in-stage GPU g (g = e·tp + r) and its expert rank in the group.
struct ExpertGroup {
  int group;
  int rank;
};
ExpertGroup expert_group(const Layout& layout, int g);
/// Experts of expert group q: part(E, tp·ep/etp, q).
Range group_experts(const ModelConfig& m, const Layout& layout, int q);

/// FSDP chunk f of F of `rows`, as torch.chunk cuts dim 0: c = ⌈n/F⌉ rows each, the last
/// ones shorter or empty.
Range fsdp_chunk(Range rows, int F, int f);

/// Rows of a column-split tensor held by in-stage GPU g: FSDP chunk g / tp of all rows
/// (every row when fsdp = 1). Meaningless for other kinds, whose FSDP chunk is in
/// stage_range().
Range fsdp_rows(const TensorInfo& t, const Layout& layout, int g);

/// Range along the split axis held by in-stage GPU g of `layout` (ignoring the stage):
/// the TP rule by r = g mod tp, or for an expert tensor the expert rule, empty when g's
/// expert group does not hold that expert. With FSDP: for a row-split or replicated
/// tensor its chunk of that range; for a column-split one the TP columns, or empty when
/// g's rows (fsdp_rows) are.
Range stage_range(const ModelConfig& m, const TensorInfo& t, const Layout& layout, int g);

/// The global box in-stage GPU g holds of t (stage aside): slab_box(stage_range) with a
/// column-split tensor's rows cut to fsdp_rows.
Box held_box(const ModelConfig& m, const TensorInfo& t, const Layout& layout, int g);

/// Elements of the tensor per unit of its split axis (columns of a row split, rows of a
/// column split, 1 for 1-d tensors).
std::int64_t slab_width(const TensorInfo& t);

/// Whether pipeline stage s of `layout` holds tensor t.
bool stage_holds(const ModelConfig& m, const Layout& layout, int s, const TensorInfo& t);

/// Global box held at position (stage s, in-stage index g), or nothing if it lacks t.
std::optional<Box> shard_box(const ModelConfig& m, const Layout& layout, int s, int g,
                             const TensorInfo& t);

/// The box of a slab [range) along t's split axis.
Box slab_box(const TensorInfo& t, Range range);

}  // namespace nereus
