#pragma once
// The cost model (architecture.md, "Cost model"): predicted time and per-GPU memory of a
// model-stage candidate, and a plan's step latency, from FLOPs and bytes per op class at
// peak rate divided by one learned efficiency per class.
#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "nereus/core/cluster.hpp"
#include "nereus/core/job.hpp"
#include "nereus/core/layout.hpp"

namespace nereus {

/// What one RL step processes.
struct Workload {
  std::int64_t sequences = 0;     ///< prompts × samples per step
  double prompt_len = 0;
  double response_len_mean = 0;
  double response_len_p95 = 0;    ///< sizes the KV cache and activations
  double link_slowdown = 1;       ///< observed factor ≥ 1 on inter-node bandwidth

  static Workload of(const JobSpec& job, double response_len_mean, double response_len_p95);
};

/// Kinds of work whose efficiency is learned separately.
enum class OpClass : std::uint8_t {
  gemm,             ///< dense matrix multiplies (compute-bound)
  attention,        ///< attention scores and mixing (compute-bound, prefill and training)
  decode,           ///< memory-bound kernels: token-by-token decoding, optimizer step
  allreduce_intra,  ///< TP/DP all-reduce inside a node
  allreduce_inter,  ///< all-reduce across nodes
  p2p_intra,        ///< pipeline sends inside a node
  p2p_inter,        ///< pipeline sends across nodes
  launch,           ///< kernels launched one by one (eager: prefill, inference, training): a microsecond each at efficiency 1
  host,             ///< a generation engine's host work per decode iteration (scheduling, sampling): 0.1 ms at efficiency 1
  expert,           ///< MoE expert GEMMs: its efficiency also learns the busiest GPU's extra load (routing imbalance)
  alltoall_intra,   ///< MoE token dispatch and combine between expert groups inside a node
  alltoall_inter,   ///< the same across nodes (NICs: another efficiency than NVLink's)
  graph_launch,     ///< decode kernels replayed from a captured CUDA graph: a microsecond each at efficiency 1
  latency_intra,    ///< fixed latency of a collective's ring step, a pipeline hop or an all-to-all peer inside a node
  latency_inter,    ///< the same across nodes
};
inline constexpr std::size_t kOpClasses = 15;
std::string_view to_string(OpClass c);

/// Seconds a candidate would take at the peak rate of each class (FLOPs at bf16 peak,
/// bytes at HBM or link bandwidth, plus fixed per-collective latency).
struct StageOps {
  std::array<double, kOpClasses> ideal{};
  double seconds(const std::array<double, kOpClasses>& efficiency) const;
};

/// Per-GPU memory of a candidate (the busiest GPU of a unit).
struct StageMemory {
  std::uint64_t resident = 0;   ///< state kept between steps: params (+ grads and optimizer)
  std::uint64_t transient = 0;  ///< while it runs: activations, KV cache, logits
};

/// One placement of a model-stage: layout, replicas, and choices that trade memory for time.
/// Mixture-of-experts models add expert parallelism: ep attention copies per unit and
/// experts split in tp·ep/etp groups (sharding.md; etp 0 means tp). Dense models may add
/// FSDP: fsdp GPUs share each TP/PP shard in dim-0 chunks and each computes its own
/// share of the unit's sequences, gathering a layer's parameters when it runs it.
struct Candidate {
  int tp = 1, pp = 1, dp = 1;
  bool recompute = false;  ///< training: keep only layer inputs, recompute the rest
  int ep = 1, etp = 0;
  int fsdp = 1;
  int unit() const { return tp * pp * ep * fsdp; }
  int gpus() const { return unit() * dp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  Layout layout() const {
    Layout l;
    l.tp = tp;
    l.pp = pp;
    l.ep = ep;
    l.etp = etp;
    l.fsdp = fsdp;
    return l;
  }
  bool operator==(const Candidate&) const = default;
};

/// Efficiencies a cost model starts from before anything was measured: conservative.
std::array<double, kOpClasses> conservative_efficiency();

class CostModel {
 public:
  CostModel(ClusterSpec cluster, std::array<double, kOpClasses> efficiency = conservative_efficiency());

  const ClusterSpec& cluster() const { return cluster_; }
  const std::array<double, kOpClasses>& efficiency() const { return eff_; }
  void set_efficiency(const std::array<double, kOpClasses>& e) { eff_ = e; }
  /// Measured over predicted memory (≥ 1 once calibrated): fragmentation and activations
  /// the formulas miss. Applied to resident and transient bytes.
  double memory_scale() const { return memory_scale_; }
  void set_memory_scale(double s) { memory_scale_ = s; }
  /// Memory a GPU keeps for the framework (CUDA context, allocator slack).
  std::uint64_t overhead_bytes() const { return overhead_; }
  /// Usable bytes per GPU: capacity × (1 − headroom) − overhead.
  std::uint64_t budget(double headroom = 0.1) const;

  /// Work of one replica of `stage` under `c` (all replicas are alike; the step waits for
  /// the slowest, which this is).
  StageOps work(const ModelStage& stage, const Candidate& c, const Workload& w) const;
  double seconds(const ModelStage& stage, const Candidate& c, const Workload& w) const {
    return work(stage, c, w).seconds(eff_);
  }
  StageMemory memory(const ModelStage& stage, const Candidate& c, const Workload& w) const;
  /// Async jobs: the work of copying a new weight version from the training stage's
  /// candidate `train` into staging beside every GPU of the generation stage `generation`
  /// under `g` (runtime/weight_update.hpp): each generation GPU receives its shard (bf16),
  /// the training GPUs send all replicas' copies between them, one transfer per tensor,
  /// over NVLink when `inside` one node, else over the NICs.
  StageOps weight_update(const ModelStage& generation, const Candidate& g, const Candidate& train, bool inside,
                         const Workload& w) const;

 private:
  ClusterSpec cluster_;
  std::array<double, kOpClasses> eff_;
  std::uint64_t overhead_;
  double memory_scale_ = 1.0;
};

}  // namespace nereus
