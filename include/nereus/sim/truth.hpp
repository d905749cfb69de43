#pragma once
// The simulator's ground truth: how long a model-stage really runs and how much memory it
// really takes on a virtual GPU cluster. Written apart from the cost model on purpose —
// this header and its source include nothing from control/ or plan/ (a test checks; the
// transitions' truth, truth_transition.cpp, reads plan/ for which bytes move where, and
// nothing of control/), and
// they account per layer and per kernel where the cost model counts per op class:
//   - GEMMs by tile and wave quantization of their per-GPU shapes (M×N×K in tiles 128
//     wide and 16–128 tall over the GPU's SMs), bounded below by reading their operands
//     from HBM;
//   - FlashAttention at its own efficiency, causal, backward 2.5× forward;
//   - a launch overhead per kernel (eager training and prefill; decode in CUDA graphs);
//   - generation as vLLM runs it: a paged KV cache in whatever memory the GPU has free,
//     continuous batching bounded by it — long responses at low TP run fewer sequences at
//     once and get slower rather than fail — and a step that lasts until the longest
//     response (the maximum of the batch's lognormal lengths) is done;
//   - training activations per layer as Korthikanti et al. (2022) count them with flash
//     attention and TP without sequence parallelism, s·b·h·(10 + 24/t) bytes, or 2·s·b·h
//     with full recomputation; mixed-precision Adam with fp32 main grads, 18 B/param;
//   - NCCL-like all-reduce: ring or tree, whichever is faster for the size;
//   - mixture of experts: attention data-parallel over the ep ranks, each GPU's experts
//     as grouped GEMMs over the tokens routed to them (only the experts some token picks
//     are read), the busiest GPU's load above the mean as the maximum of G Poisson loads
//     times a trained router's skew, and an all-to-all dispatch and combine;
//   - stragglers: lognormal jitter per replica and an occasional slow replica;
//   - copies between GPUs (an async job's weight updates): each GPU's NVLink ports and
//     each node's NICs at their achieved rates, a per-message cost, jitter;
//   - transitions (run_transition): the graph's builds as flows sharing those links
//     max-min fairly, event by event, with contention from the stages beside them.
// The constants are published or typical figures (named where they are set), never tuned
// to make a policy win.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "nereus/core/cluster.hpp"
#include "nereus/core/job.hpp"

namespace nereus {

struct TransitionGraph;  // plan/transition_graph.hpp: what a transition moves

/// How one model-stage runs: the truth's own view of a candidate. A mixture-of-experts
/// unit runs ep attention replicas, each on its share of the sequences, and spreads the
/// experts over tp·ep/etp groups that exchange tokens all-to-all.
struct TruthLayout {
  int tp = 1, pp = 1, dp = 1;
  bool recompute = false;  ///< training keeps only each layer's input
  int ep = 1, etp = 0;     ///< etp: expert tensor parallelism; 0 means tp
  int expert_tp() const { return etp > 0 ? etp : tp; }
};

/// What one step processes.
struct TruthLoad {
  std::int64_t sequences = 0;  ///< prompts × samples
  double prompt_len = 0;
  double response_mean = 0, response_p95 = 0;  ///< lengths are lognormal with these
  double max_response = 0;     ///< the job's cap (0: none)
  double link_slowdown = 1;
};

/// What a copy moves from one GPU to another: bytes and messages (the plan's transfers
/// between the two; which bytes move where is the planner's, not a model).
struct TruthFlow {
  int src = 0, dst = 0;
  std::uint64_t bytes = 0;
  std::uint64_t messages = 0;
};

/// How a transition graph runs (GroundTruth::run_transition).
struct TruthTransitionOptions {
  /// Beside the steps, as the runtime runs it: a role that trains moves from the step
  /// boundary (its optimizer state changes until then), frozen models' units from `early`
  /// (≤ 0: seconds before the boundary), and transfers share their links with the stages
  /// running then. Otherwise the graph runs alone, from 0.
  bool beside = false;
  double early = 0;
  double link_slowdown = 1;
};
struct TruthTransition {
  double span = 0;                      ///< first node's start to last node's end
  std::map<std::string, double> ready;  ///< model-stage → when its last new unit is built (from the boundary)
};

/// One stage's truth on the busiest GPU of a replica.
struct TruthStage {
  std::uint64_t resident = 0;  ///< state kept between steps
  std::uint64_t working = 0;   ///< activations, logits, buffers while it runs (generation: besides the KV cache)
  std::uint64_t kv_bytes_per_token = 0;  ///< generation: KV cache per token on one GPU
};

class GroundTruth {
 public:
  GroundTruth(const ClusterSpec& cluster, std::uint64_t seed, double noise = 0.03);

  TruthStage memory(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w) const;
  /// Sequences a generation replica runs at once with `kv_pool` bytes free for the KV cache
  /// on its busiest GPU; 0 when not even the longest response fits.
  std::int64_t concurrency(const ModelConfig& m, const TruthLayout& l, const TruthLoad& w, std::uint64_t kv_pool) const;
  /// Time of the slowest replica without jitter; `kv_pool` only matters for generation.
  double expected_seconds(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w,
                          std::uint64_t kv_pool) const;
  /// A measured run: every replica jitters, and the step waits for the slowest.
  double run_seconds(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w, std::uint64_t kv_pool);

  std::uint64_t capacity_bytes() const;
  /// CUDA context, NCCL and cuBLAS buffers a GPU loses before any stage runs.
  std::uint64_t context_bytes() const;
  /// Share of link bandwidth bulk copies reach (intra-node, inter-node).
  double intra_efficiency() const { return 0.80; }
  double inter_efficiency() const { return 0.85; }
  /// A measured copy of `flows` on the cluster's links with nothing else on them: the
  /// slowest of every GPU's NVLink sends and receives, every node's NIC traffic out and in,
  /// plus each GPU's messages one after another, times a lognormal jitter.
  double copy_seconds(const std::vector<TruthFlow>& flows, double link_slowdown);
  /// A transition graph as it runs on the cluster (truth_transition.cpp): the plan's
  /// transfers of each build as flows sharing the links, per-message setup, contention
  /// with the stages beside it, jitter. Reads nothing of the cost model (not the nodes'
  /// estimated times either).
  TruthTransition run_transition(const TransitionGraph& g, const JobSpec& job, const TruthTransitionOptions& o);
  /// Bytes per second one GPU reads a checkpoint at (its share of the node's NICs).
  double checkpoint_bytes_per_second() const;

 private:
  /// count GEMMs of M×N×K (count > 1: one grouped GEMM kernel).
  double gemm(double M, double N, double K, double count = 1) const;
  double allreduce(double bytes, int n, bool inside, double slowdown) const;
  double p2p(double bytes, bool inside, double slowdown) const;
  double alltoall(double bytes, int n, bool inside, double slowdown) const;

  ClusterSpec cluster_;
  int sms_;
  std::mt19937_64 rng_;
  double noise_;
};

/// The largest of n lognormal draws with this mean and 95th percentile, in expectation
/// (the quantile 1 − 1/(n + 1)); exposed for tests.
double expected_max_length(double mean, double p95, double n);

}  // namespace nereus
