#pragma once
// What the reshard planner and the placement optimiser both need to know about a
// transition, computed once: distinct layouts and their TP range tables, tensor
// templates (tensors that share a shard pattern: one kind, layers whose stage is the
// same in every layout), slot groups, and the source positions by device and by node.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nereus/core/emu.hpp"

namespace nereus {

/// One source position: collection c, unit u, stage s, rank r, on device dev.
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

/// Tensors of one kind whose shards follow the same pattern in every layout.
struct Template {
  TensorKind kind;
  std::vector<TensorId> tensors;  ///< one per layer of the group
  std::vector<StageSet> stages;   ///< per layout index
  std::int64_t slab_width;        ///< elements per unit of the split axis
};

/// Target slots planned together, and which source collections hold them.
struct SlotGroup {
  std::vector<Slot> slots;
  std::vector<char> eligible;        ///< per source collection
  std::uint64_t bytes_per_element;   ///< summed over slots
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
  const std::vector<Range>& ranges(int layout, TensorKind k) const {
    return ranges_[layout][static_cast<int>(k)];
  }
  int node_of(DeviceId d) const { return d / gpus_per_node; }
  /// Ranks r of `layout` whose range of kind k contains x (ranges are sorted by rank).
  std::pair<int, int> ranks_containing(int layout, TensorKind k, std::int64_t x) const;

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
  std::vector<std::array<std::vector<Range>, kTensorKinds>> ranges_;
  std::uint16_t layout_index(const Layout& l);
};

}  // namespace nereus
