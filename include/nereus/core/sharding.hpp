#pragma once
// The TP and PP rules of sharding.md: which slab of which tensor a position holds.
//
// Every shard is a slab: a range along the tensor's split axis and the full extent of
// the other axis (replicated tensors: the full range of axis 0). Planning therefore
// works on 1-d ranges along that axis; boxes are built only for output.
#include <optional>

#include "nereus/core/box.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// Axis a tensor kind is split along under TP: 0 rows, 1 columns, -1 replicated.
int split_axis(TensorKind kind);

/// Range along the split axis (axis 0 for replicated kinds) held by TP rank r of tp.
Range tp_range(const ModelConfig& m, const TensorInfo& t, int tp, int r);

/// Elements of the tensor per unit of its split axis (columns of a row split, rows of a
/// column split, 1 for 1-d tensors).
std::int64_t slab_width(const TensorInfo& t);

/// Whether pipeline stage s of `layout` holds tensor t.
bool stage_holds(const ModelConfig& m, const Layout& layout, int s, const TensorInfo& t);

/// Global box held at position (stage s, rank r), or nothing if that stage lacks t.
std::optional<Box> shard_box(const ModelConfig& m, const Layout& layout, int s, int r,
                             const TensorInfo& t);

/// The box of a slab [range) along t's split axis.
Box slab_box(const TensorInfo& t, Range range);

}  // namespace nereus
