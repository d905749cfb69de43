#pragma once
// The reshard planner: which bytes move from a source collection (one or more
// model-stages of one model) to a target collection, from which sender, along which link.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nereus/base/huge_pages.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/core/emu.hpp"
#include "nereus/plan/transfer.hpp"

namespace nereus {

/// Link bandwidths (GB/s = 10^9 B/s, one direction) for the transition-time estimate.
struct LinkModel {
  int gpus_per_node = 8;
  double intra_node_gbps = 450;  ///< per GPU
  double inter_node_gbps = 50;   ///< per NIC
  int nics_per_node = 8;
  double hbm_gbps = 4800;        ///< local copies read and write HBM
  double setup_seconds = 2e-6;   ///< per transfer, on the busiest device

  static LinkModel of(const ClusterSpec& c);
};

/// Whole-transition figures (bytes are 10^0 B; see docs/planner.md).
struct ReshardSummary {
  std::uint64_t moved_bytes = 0;        ///< bytes that cross a link
  std::uint64_t lower_bound_bytes = 0;  ///< destination bytes not already on their device
  std::uint64_t local_bytes = 0;        ///< destination bytes found on their own device
  std::uint64_t kept_bytes = 0;         ///< of those, in a buffer that can be kept as is
  std::uint64_t target_bytes = 0;       ///< all destination bytes
  std::uint64_t max_device_send_bytes = 0;
  std::uint64_t max_device_recv_bytes = 0;
  std::uint64_t inter_node_bytes = 0;   ///< moved bytes that leave their node
  std::uint64_t transfer_count = 0;     ///< transfers that cross a link
  std::uint64_t local_copy_count = 0;   ///< on-device copies (kept buffers excluded)
  std::uint64_t quantized_bytes = 0;    ///< FP8 bytes and scales quantized from the config's dtype
  double estimated_seconds = 0;
  double plan_ms = 0;
};

/// Per-device traffic of a plan.
struct DeviceTraffic {
  DeviceId device = 0;
  std::uint64_t send_bytes = 0;
  std::uint64_t recv_bytes = 0;
  std::uint64_t local_bytes = 0;
};

struct ReshardOptions {
  LinkModel links;
};

class ReshardIndex;
struct Piece;

/// A planned transition. Stored compactly (per position and tensor class); transfers
/// are materialised on request, for all devices or only for some (one node's).
class ReshardPlan {
 public:
  ReshardPlan(ReshardPlan&&) noexcept;
  ReshardPlan& operator=(ReshardPlan&&) noexcept;
  ~ReshardPlan();

  const ReshardSummary& summary() const { return summary_; }
  const Collection& target() const;
  std::span<const Collection> sources() const;
  /// Devices with any traffic, in id order.
  std::vector<DeviceTraffic> traffic() const;
  /// Every transfer, local copies included, in a fixed order.
  std::vector<Transfer> transfers() const;
  /// Transfers whose source or destination is in `devices`, in the same order.
  std::vector<Transfer> transfers_touching(std::span<const DeviceId> devices) const;

 private:
  friend ReshardPlan plan_reshard(std::span<const Collection>, const Collection&, const ReshardOptions&);
  ReshardPlan();
  template <class Keep>
  std::vector<Transfer> materialise(Keep&& keep) const;

  std::unique_ptr<const ReshardIndex> index_;
  std::vector<Piece, HugePageAllocator<Piece>> pieces_;
  std::vector<DeviceTraffic> traffic_;
  ReshardSummary summary_;
};

/// Plans the move of `sources` (model-stages of one model) into `target`. Every slot the
/// target holds must be held by some source. Throws Error on invalid input.
ReshardPlan plan_reshard(std::span<const Collection> sources, const Collection& target,
                         const ReshardOptions& options = {});

inline ReshardPlan plan_reshard(const Collection& source, const Collection& target,
                                const ReshardOptions& options = {}) {
  return plan_reshard(std::span<const Collection>(&source, 1), target, options);
}

}  // namespace nereus
