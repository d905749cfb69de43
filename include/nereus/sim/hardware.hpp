#pragma once
// The simulator's ground truth: how long a stage really takes and how much memory it
// really needs on a virtual cluster. Deliberately not the cost model: efficiencies depend
// on shape (smaller matrices per GPU, small decode batches and short sequences run worse),
// kernels pay a launch overhead per layer, replicas straggle, and memory fragments. The
// controller never sees these numbers, only measured times.
#include <cstdint>
#include <random>

#include "nereus/control/cost_model.hpp"

namespace nereus {

class HardwareModel {
 public:
  HardwareModel(ClusterSpec cluster, std::uint64_t seed, double noise = 0.03);

  /// A measured time of one stage run: the slowest of its replicas.
  double stage_seconds(const ModelStage& stage, const Candidate& c, const Workload& w);
  /// The same without noise (for held-out checks and tests).
  double expected_seconds(const ModelStage& stage, const Candidate& c, const Workload& w) const;
  /// Peak bytes on the busiest GPU when `resident` bytes of state are there and the stage
  /// with `transient` working memory runs (fragmentation and activation overheads).
  std::uint64_t peak_bytes(std::uint64_t resident, std::uint64_t transient) const;
  std::uint64_t capacity_bytes() const;
  /// Link efficiency transfers really reach (for transition times).
  double link_efficiency() const { return 0.7; }
  const CostModel& work_model() const { return work_; }

 private:
  double efficiency(OpClass c, const ModelStage& stage, const Candidate& cand, const Workload& w) const;
  CostModel work_;  // only for the FLOP and byte counts, at efficiency 1
  std::mt19937_64 rng_;
  double noise_;
};

}  // namespace nereus
