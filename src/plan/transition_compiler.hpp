#pragma once
// Internal: the state shared by the parts of compile_transition() — unit classification
// (transition_graph.cpp) and the memory schedule and cost (transition_schedule.cpp).
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <span>

#include "nereus/plan/geometry.hpp"
#include "nereus/plan/transition_graph.hpp"

namespace nereus::detail {

/// An old unit's position on a device.
struct Holder {
  std::uint16_t stage;
  std::uint32_t unit;
  std::uint32_t code;  ///< position code in the stage's geometry
};

/// A node's memory change on one GPU.
struct Touch {
  DeviceId device;
  std::uint64_t bytes;
};

/// Each node's touches, stored flat (one allocation for the whole graph).
class TouchTable {
 public:
  void start() { begin_.push_back(static_cast<std::uint32_t>(all_.size())); }
  void add(Touch t) { all_.push_back(t); }
  std::span<const Touch> operator[](std::size_t node) const {
    const std::uint32_t end = node + 1 < begin_.size() ? begin_[node + 1] : static_cast<std::uint32_t>(all_.size());
    return {all_.data() + begin_[node], end - begin_[node]};
  }

 private:
  std::vector<Touch> all_;
  std::vector<std::uint32_t> begin_;
};

/// Per-device traffic estimate for the link bound.
struct DeviceLoad {
  double send_seconds = 0;
  double recv_seconds = 0;
};

class TransitionCompiler {
 public:
  explicit TransitionCompiler(const TransitionRequest& req);
  TransitionGraph run();

  // transition_graph.cpp
  void validate();
  void find_kept();
  void classify_builds();
  void add_destroys_and_edges();
  void decide_strategies();

  // transition_schedule.cpp
  void schedule();
  template <class Fits, class Apply>
  std::vector<std::uint32_t> search_order(std::size_t nodes, const std::vector<std::uint32_t>& indeg,
                                          const std::vector<std::uint32_t>& first, const std::vector<std::uint32_t>& succ,
                                          const std::vector<std::uint64_t>& before, Fits&& fits, Apply&& apply);
  void estimate_cost();

  const TransitionRequest& req_;
  TransitionGraph g_;
  std::size_t n_ = 0;  // model-stages
  std::vector<int> role_;
  std::vector<bool> train_, stale_;
  std::vector<UnitGeometry*> geo_;
  std::map<const ModelSpec*, std::unique_ptr<UnitGeometry>> geometries_;
  std::vector<std::vector<Holder>> holders_on_;  // by device: old unit positions
  std::vector<std::vector<std::int32_t>> build_of_, destroy_of_;  // node per (stage, unit) or −1
  std::vector<std::vector<bool>> reshard_class_;
  std::map<std::size_t, std::map<DeviceId, std::uint32_t>> new_unit_on_;  // per stage and new unit: built by a plain reshard
  std::vector<DeviceLoad> load_;
  TouchTable touch_;  // per node (creation order): bytes per GPU
  std::vector<std::uint32_t> stamp_;       // per device: scratch marks
  std::uint32_t stamp_now_ = 0;
  // Per stage: bytes of each position of a unit of an interned layout.
  std::vector<std::map<int, std::vector<std::uint64_t>>> footprints_;
  DeviceId max_device_ = 0;
  bool search_exhausted_ = true;  // the fallback search looked at every order

  bool eligible(std::size_t src_stage, std::size_t dst_stage) const {
    return role_[src_stage] == role_[dst_stage] && !stale_[src_stage] && (!train_[dst_stage] || train_[src_stage]);
  }
  int node_of(DeviceId d) const { return static_cast<int>(d / std::max(1, req_.links.gpus_per_node)); }
  double link_gbps(DeviceId a, DeviceId b) const;
  /// Memory-first: a replica on none of the new unit's GPUs to build it from.
  std::optional<UnitRef> far_donor(std::size_t stage, std::uint32_t unit);
  /// Memory-first: the new unit (not kept) of stage i on each GPU; units of a stage are
  /// disjoint, so that is the first (and only) one that needs the GPU. Built once per stage.
  const std::map<DeviceId, std::uint32_t>& new_unit_on(std::size_t stage);
  /// Bytes a unit of `layout` in stage i holds at each position (index s·tp + r).
  const std::vector<std::uint64_t>& footprint(std::size_t stage, const Layout& layout);
  /// Records the memory a new node's unit occupies on each of its GPUs (plus `extra`
  /// per GPU); returns the total.
  std::uint64_t add_touches(std::size_t stage, const Emu& e, std::uint64_t extra);
};

}  // namespace nereus::detail
