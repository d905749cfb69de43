#pragma once
// What the reshard planner and the placement optimiser both need to know about a
// transition, computed once: distinct layouts and their TP range tables, tensor
// templates (tensors that share a shard pattern: one kind, layers whose stage is the
// same in every layout), slot groups, and the source positions by device and by node.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nereus/core/emu.hpp"

namespace nereus {

/// One source position: collection c, unit u, stage s, in-stage index r (g = e·tp + tensor
/// rank), on device dev.
struct Holding {
  std::uint32_t c;
  std::uint32_t u;
  std::uint16_t s;
  std::uint16_t r;
  std::uint16_t layout;
  DeviceId dev;
};

/// Stages of one layout that hold a template's tensors (two for a tied embedding).
struct StageSet {
  std::uint8_t n = 0;
  std::array<std::int16_t, 2> s{};
  bool has(int x) const { return (n > 0 && s[0] == x) || (n > 1 && s[1] == x); }
};

/// Tensors of one kind (and, for experts, one expert) whose shards follow the same
/// pattern in every layout. Under FSDP a column-split kind is planned in row bands (the
/// rows between any two FSDP chunk boundaries of any layout): inside a band every
/// position holds a column range or nothing, so each band is a template of its own.
struct Template {
  TensorKind kind;
  std::uint32_t cls;              ///< shard class: the kind, or one expert's kind (and band)
  std::vector<TensorId> tensors;  ///< one per layer of the group
  std::vector<StageSet> stages;   ///< per layout index
  std::int64_t slab_width;        ///< elements per unit of the split axis (in the band)
  DType dtype;                    ///< its tensors' param dtype (one kind: one dtype)
  bool quantizable;               ///< held as FP8 in a `dtype=fp8` unit (fp8_layout.hpp)
  Range band{};                   ///< rows of a banded column-split template; empty: all
};

/// Target slots planned together, and which source collections hold them.
struct SlotGroup {
  std::vector<Slot> slots;
  std::vector<char> eligible;        ///< per source collection
  /// Bytes of one element over these slots, for tensors whose param slot is `param`.
  std::uint64_t bytes_per_element(DType param) const {
    std::uint64_t n = 0;
    for (Slot s : slots) n += width(slot_dtype(s, param));
    return n;
  }
  /// The same in a destination layout: one byte for an FP8-held tensor (its scales, four
  /// bytes a block, counted apart).
  std::uint64_t bytes_per_element(const Template& t, bool fp8_target) const {
    return fp8_target && t.quantizable ? 1 : bytes_per_element(t.dtype);
  }
};

/// Contiguous lists by key (device id or node id).
struct HoldingLists {
  std::vector<std::uint32_t> start;  ///< key → first index in `items`; size keys+1
  std::vector<std::uint32_t> items;  ///< indices into ReshardIndex::holdings
  std::span<const std::uint32_t> of(std::int64_t key) const {
    if (key < 0 || key + 1 >= static_cast<std::int64_t>(start.size())) return {};
    return {items.data() + start[key], items.data() + start[key + 1]};
  }
};

class ReshardIndex {
 public:
  /// Validates the inputs (same model, valid collections, target slots held).
  ReshardIndex(std::span<const Collection> sources, const Collection& target, int gpus_per_node);

  const ModelSpec& model() const { return *model_; }
  /// Ranges of a shard class along its split axis, by in-stage index (empty where the
  /// position holds none of it: an expert outside its group).
  const std::vector<Range>& ranges(int layout, std::uint32_t cls) const { return ranges_[layout][cls]; }
  /// In-stage indices g of `layout` that hold some of class cls, ascending (for a routed
  /// expert only its group's: iterating these skips the rest of the stage).
  const std::vector<int>& holders(int layout, std::uint32_t cls) const { return holders_[layout][cls]; }
  int node_of(DeviceId d) const { return d / gpus_per_node; }
  /// Calls f(g) for each in-stage index g of `layout` whose range of class cls contains x.
  template <class F>
  void positions_containing(int layout, std::uint32_t cls, std::int64_t x, F&& f) const {
    const auto& sorted = by_lo_[layout][cls];
    auto it = std::partition_point(sorted.begin(), sorted.end(), [x](const RangeAt& r) { return r.range.hi <= x; });
    for (; it != sorted.end() && it->range.lo <= x; ++it)
      if (it->range.contains(x)) f(it->g);
  }

  std::shared_ptr<const ModelSpec> model_;
  std::vector<Collection> sources;
  Collection target;
  int gpus_per_node;
  std::vector<Layout> layouts;                         ///< distinct shardings
  std::vector<std::vector<std::uint16_t>> source_layout;  ///< [c][u] → layout index
  std::vector<std::uint16_t> target_layout;            ///< [u] → layout index
  std::vector<Template> templates;
  std::vector<SlotGroup> groups;
  std::vector<Holding> holdings;
  HoldingLists by_device;
  HoldingLists by_node;
  DeviceId max_device = 0;  ///< largest device id of sources and target

 private:
  struct RangeAt {
    Range range;
    int g;
  };
  std::vector<std::vector<std::vector<Range>>> ranges_;    // [layout][class][g]
  std::vector<std::vector<std::vector<RangeAt>>> by_lo_;   // [layout][class]: non-empty, by lo
  std::vector<std::vector<std::vector<int>>> holders_;     // [layout][class]: g with a non-empty range
  std::vector<std::vector<std::pair<Range, std::uint32_t>>> bands_;  // [kind class] → (rows, class); none: unbanded
  std::uint16_t layout_index(const Layout& l);
  void push_template(Template t);
};

}  // namespace nereus
