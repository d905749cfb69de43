// The cost model's formulas. Per replica of a model-stage candidate (tp, pp, dp):
//   B sequences (= step sequences / dp), P prompt tokens, R response tokens, T = P + R.
//   generate: prefill of B·P tokens (GEMM + attention, compute-bound), then R decode steps
//             reading the GPU's weights and the growing KV cache (memory-bound), with two
//             TP all-reduces per layer and step and a pipeline hop per stage and step;
//   infer:    one forward pass over B·T tokens, micro-batches of one sequence;
//   train:    forward + backward (×3 the forward FLOPs, ×4 with recomputation), the same
//             collectives twice, gradient all-reduce over DP, the optimizer step.
// Compute divides over tp·pp GPUs; a pipeline of m micro-batches takes (m + pp − 1)/m of
// the ideal time (the bubble), and a GPU's TP all-reduces and hops are those of its own
// stage's layers for m + pp − 1 micro-batch slots (the stages work at once). Collectives
// cost a latency per ring step plus a ring's bytes over the link they cross: inside a
// node when the group fits in one, else the GPU's share of its node's NICs, slowed by
// the observed link slowdown.
// Mixture-of-experts candidates (tp, pp, ep, etp): compute divides over tp·pp·ep GPUs;
// FLOPs count the active parameters (k experts per token) and the experts' go to their
// own class, whose efficiency absorbs the busiest GPU's extra routed load; memory counts
// every expert (the fullest of tp·ep/etp groups per GPU); each of the ep attention
// replicas runs its share of the sequences (its own KV cache and decode batch); a sparse
// layer dispatches and combines tokens all-to-all between expert groups (alltoall_intra
// when a stage's tp·ep GPUs fit in one node, else alltoall_inter: NVLink and the NICs
// reach different shares of their bandwidth); experts' gradients reduce over DP, the rest
// over ep·dp. The replicas pipeline their own sequences side by side, so pipeline hops
// and TP all-reduces count one replica's micro-batches and bytes.
#include "nereus/control/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "nereus/base/error.hpp"

namespace nereus {

std::string_view to_string(OpClass c) {
  switch (c) {
    case OpClass::gemm: return "gemm";
    case OpClass::attention: return "attention";
    case OpClass::decode: return "decode";
    case OpClass::allreduce_intra: return "allreduce_intra";
    case OpClass::allreduce_inter: return "allreduce_inter";
    case OpClass::p2p_intra: return "p2p_intra";
    case OpClass::p2p_inter: return "p2p_inter";
    case OpClass::launch: return "launch";
    case OpClass::host: return "host";
    case OpClass::expert: return "expert";
    case OpClass::alltoall_intra: return "alltoall_intra";
    case OpClass::alltoall_inter: return "alltoall_inter";
    case OpClass::graph_launch: return "graph_launch";
    case OpClass::latency_intra: return "latency_intra";
    case OpClass::latency_inter: return "latency_inter";
  }
  return "?";
}

Workload Workload::of(const JobSpec& job, double mean, double p95) {
  Workload w;
  w.sequences = job.prompts_per_step * job.samples_per_prompt;
  w.prompt_len = static_cast<double>(job.prompt_len);
  w.response_len_mean = mean;
  w.response_len_p95 = std::max(mean, p95);
  return w;
}

double StageOps::seconds(const std::array<double, kOpClasses>& efficiency) const {
  double t = 0;
  for (std::size_t c = 0; c < kOpClasses; ++c)
    if (ideal[c] > 0) t += ideal[c] / std::max(1e-3, efficiency[c]);
  return t;
}

std::array<double, kOpClasses> conservative_efficiency() {
  // Below what tuned kernels reach, so that an unmeasured class is not chosen on hope.
  return {0.35, 0.25, 0.35, 0.35, 0.25, 0.35, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
}

namespace {

constexpr double kIntraLatency = 1e-6;   // ideal seconds per ring step or hop inside a node (launch class)
constexpr double kInterLatency = 2e-6;   // across nodes
constexpr std::uint64_t kOverhead = 2ull << 30;
constexpr double kLaunch = 1e-6;          // ideal seconds per kernel launch (the launch class learns the rest)
constexpr double kHostStep = 1e-4;        // ideal host seconds per decode iteration (the host class learns the rest)
constexpr double kKernelsPerLayer = 12;   // a transformer layer's forward: norms, projections, attention, all-reduces
constexpr double kExpertTileRows = 64;   // rows of a grouped-GEMM tile (MoE expert kernels)
constexpr double kMaxRunning = 256;       // sequences a generation engine decodes at once (vLLM's max_num_seqs)

/// What the formulas need of a model. Mixture-of-experts models (sharding.md): Ls of the
/// L layers are sparse, with a router and E experts of width Ie, k of them per token, and
/// (DeepSeek-V3-style) a shared expert MLP of width Es·Ie that every token passes through.
/// MLA attention (sharding.md, "DeepSeek-V3-style models"): queries through a latent of
/// qr (or straight from H), keys and values decompressed from a latent of kvr, rope
/// dimensions dr; its KV cache is that latent and the rope keys, per token and layer,
/// replicated on every TP rank (vLLM's MLA).
struct Shape {
  double H, I, L, nh, nkv, hd, V;
  bool tied;
  double labels;  ///< rows of a score head (value and reward models); 0: a language-model head
  double E = 0, k = 0, Ie = 0, Ls = 0, Es = 0;
  bool mla = false;
  double qr = 0, kvr = 0, dn = 0, dr = 0, dv = 0;
  explicit Shape(const ModelConfig& m)
      : H(static_cast<double>(m.hidden)), I(static_cast<double>(m.intermediate)), L(static_cast<double>(m.layers)),
        nh(static_cast<double>(m.heads)), nkv(static_cast<double>(m.kv_heads)), hd(static_cast<double>(m.head_dim)),
        V(static_cast<double>(m.vocab)), tied(m.tied_embeddings), labels(static_cast<double>(m.score_labels)) {
    if (m.moe()) {
      E = static_cast<double>(m.experts), k = static_cast<double>(m.experts_per_token);
      Ie = static_cast<double>(m.expert_intermediate);
      Ls = static_cast<double>(m.sparse_layers());
      Es = static_cast<double>(m.shared_experts);
    }
    if (m.mla()) {
      mla = true;
      qr = static_cast<double>(m.q_lora_rank), kvr = static_cast<double>(m.kv_lora_rank);
      dn = static_cast<double>(m.qk_nope_dim), dr = static_cast<double>(m.qk_rope_dim), dv = static_cast<double>(m.v_head_dim);
    }
  }
  /// Attention weights a GPU of tensor rank group tp holds per layer: the heads' share of
  /// the projections, the replicated ones whole (MLA's latents, norms).
  double attention_elements(int tp) const {
    if (!mla) return 2 * H * nh * hd / tp + 2 * H * hd * kv_heads(tp);
    const double q = qr > 0 ? H * qr + qr + qr * nh * (dn + dr) / tp : H * nh * (dn + dr) / tp;
    return q + H * (kvr + dr) + kvr + kvr * nh * (dn + dv) / tp + nh * dv * H / tp;
  }
  /// KV cache elements one token puts in one layer on a GPU of tensor rank group tp.
  double kv_elements(int tp) const { return mla ? kvr + dr : 2 * kv_heads(tp) * hd; }
  /// Score and value widths summed over the heads (attention's T² FLOPs).
  double attention_width() const { return mla ? nh * (dn + dr + dv) / 2 : nh * hd; }
  /// Output rows a GPU of tensor rank group tp computes: the vocabulary split by TP, or a
  /// score head's labels, replicated.
  double out_rows(int tp) const { return labels > 0 ? labels : V / tp; }
  double attention_linear() const { return mla ? attention_elements(1) : H * nh * hd * 2 + 2 * H * nkv * hd; }
  /// Matrix-multiply weights a token passes through outside the experts (attention, dense
  /// MLPs, routers, shared experts, the output projection), and inside the k experts it picks.
  double linear() const {
    return L * attention_linear() + (L - Ls) * 3 * H * I + Ls * (E * H + 3 * H * Es * Ie) + out_rows(1) * H;
  }
  double expert_linear() const { return Ls * k * 3 * H * Ie; }
  /// Parameters of all experts, and of everything else.
  double expert_params() const { return Ls * E * 3 * H * Ie; }
  double params() const {
    return L * (attention_linear() + 2 * H) + (L - Ls) * 3 * H * I + Ls * (E * H + 3 * H * Es * Ie) + expert_params() +
           V * H + (labels > 0 ? labels * H : tied ? 0 : V * H) + H;
  }
  /// KV heads a GPU of tensor rank group tp holds (replicated when tp > nkv).
  double kv_heads(int tp) const { return std::max(1.0, nkv / tp); }
  /// Elements one layer puts on one GPU: a sparse layer's router is replicated and its
  /// experts spread over tp·ep/etp groups (the fullest one counted).
  double layer_elements(const Candidate& c) const {
    const double attention = attention_elements(c.tp) + 2 * H;
    const double dense = 3 * H * I / c.tp;
    const double sparse = E * H + 3 * H * Es * Ie / c.tp + std::ceil(E * c.expert_tp() / (c.tp * c.ep)) * 3 * H * Ie / c.expert_tp();
    return attention + (Ls == 0 ? dense : Ls == L ? sparse : std::max(dense, sparse));
  }
  /// Elements on the busiest GPU of a unit: the most layers of a stage plus the embedding
  /// (first stage) and output projection (last stage), both on one GPU when pp = 1.
  double busiest_elements(const Candidate& c) const {
    const double layers = std::ceil(L / c.pp);
    const double embed = V * H / c.tp, head = out_rows(c.tp) * H;
    return layers * layer_elements(c) + (c.pp == 1 ? embed + head : std::max(embed, head)) + H;
  }
  /// Parameters one GPU holds of the whole model, summed over the pipeline (what decoding
  /// reads per iteration): experts split tp·ep ways, the rest tp ways.
  double gpu_params(const Candidate& c) const { return (params() - expert_params()) / c.tp + expert_params() / (c.tp * c.ep); }
};

/// A ring all-reduce of `bytes` over n GPUs moves 2(n−1)/n of the bytes over each link,
/// in 2(n−1) steps that each pay a latency (counted apart: the launch class).
double allreduce(double bytes, int n, double bw) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bw;
}
double ring_steps(int n) { return n <= 1 ? 0 : 2.0 * (n - 1); }

/// FLOPs a GPU spends per decoded token of a micro-batch of `rows` sequences in the GEMMs
/// outside the experts, counted as the GPU spends them: a GEMM's output is computed in
/// tiles of 128 columns, one per compute unit at a time, so a GEMM of few tiles (the thin
/// per-GPU slices of high TP) leaves units idle and takes as long as if it filled them.
/// (NVIDIA's "Matrix Multiplication Background" guide: tile and wave quantization.)
/// Without the GPU's compute units in the cluster description, the FLOPs themselves.
double decode_gemm_flops(const Shape& m, const Candidate& c, const ClusterSpec& k, double rows) {
  const double units = k.gpu_compute_units;
  const double row_tiles = std::ceil(std::max(1.0, rows) / 128);
  // A GEMM of n output columns and K inputs, per token: 2·n·K over the busy share of units.
  auto gemm = [&](double n, double K) {
    const double busy = units > 0 ? std::min(1.0, row_tiles * std::ceil(n / 128) / units) : 1.0;
    return 2 * n * K / busy;
  };
  const double heads = m.nh / c.tp * m.hd;
  double attention = gemm(heads + 2 * m.kv_heads(c.tp) * m.hd, m.H) + gemm(m.H, heads);
  if (m.mla) {
    const double q = m.qr > 0 ? gemm(m.qr, m.H) + gemm(m.nh / c.tp * (m.dn + m.dr), m.qr) : gemm(m.nh / c.tp * (m.dn + m.dr), m.H);
    attention = q + gemm(m.kvr + m.dr, m.H) + gemm(m.nh / c.tp * (m.dn + m.dv), m.kvr) + gemm(m.H, m.nh / c.tp * m.dv);
  }
  const double dense = gemm(2 * m.I / c.tp, m.H) + gemm(m.H, m.I / c.tp);
  const double router = m.Ls > 0 ? gemm(m.E, m.H) + (m.Es > 0 ? gemm(2 * m.Es * m.Ie / c.tp, m.H) + gemm(m.H, m.Es * m.Ie / c.tp) : 0) : 0;
  // Every GPU of a pipeline works on its layers of each micro-batch: summed over the
  // pipeline, the whole model per token; the output projection once.
  return m.L * attention + (m.L - m.Ls) * dense + m.Ls * router + gemm(m.out_rows(c.tp), m.H);
}

}  // namespace

CostModel::CostModel(ClusterSpec cluster, std::array<double, kOpClasses> efficiency)
    : cluster_(std::move(cluster)), eff_(efficiency), overhead_(0) {
  if (!(cluster_.gpu_bf16_tflops > 0) || !(cluster_.hbm_gbps > 0) || !(cluster_.intra_node_gbps > 0) ||
      !(cluster_.inter_node_gbps > 0) || cluster_.gpus_per_node < 1 || !(cluster_.gpu_memory_gib > 0))
    throw Error("cost model: cluster '" + cluster_.name + "' lacks positive memory, peak FLOPs, HBM or link bandwidths");
  // The framework's share of a GPU: 2 GiB, or a sixteenth of a small device.
  const double cap = cluster_.gpu_memory_gib * 1024.0 * 1024.0 * 1024.0;
  overhead_ = cluster_.framework_overhead_gib >= 0
                  ? static_cast<std::uint64_t>(cluster_.framework_overhead_gib * 1024.0 * 1024.0 * 1024.0)
                  : std::min<std::uint64_t>(kOverhead, static_cast<std::uint64_t>(cap / 16));
}

std::uint64_t CostModel::budget(double headroom) const {
  const double cap = cluster_.gpu_memory_gib * 1024.0 * 1024.0 * 1024.0 * (1.0 - headroom);
  return cap > static_cast<double>(overhead_) ? static_cast<std::uint64_t>(cap) - overhead_ : 0;
}

StageOps CostModel::work(const ModelStage& stage, const Candidate& c, const Workload& w) const {
  const Shape m(stage.model->config());
  const ClusterSpec& k = cluster_;
  const double peak = k.gpu_bf16_tflops * 1e12, hbm = k.hbm_gbps * 1e9;
  const double intra = k.intra_node_gbps * 1e9;
  const double inter = k.inter_node_gbps * 1e9 * k.nics_per_node / k.gpus_per_node / std::max(1.0, w.link_slowdown);
  const int unit = c.unit();
  const bool tp_inside = c.tp <= k.gpus_per_node;
  const bool ep_inside = c.tp * c.ep <= k.gpus_per_node;
  const bool pp_inside = unit <= k.gpus_per_node;
  const bool dp_inside = unit * c.dp <= k.gpus_per_node;
  const bool fsdp_inside = c.tp * c.fsdp <= k.gpus_per_node;  // an FSDP group strides over its TP group
  const double B = static_cast<double>(w.sequences) / c.dp;
  const double groups = static_cast<double>(c.tp * c.ep / c.expert_tp());  // expert groups of a stage
  const double P = w.prompt_len, R = w.response_len_mean, T = P + R;
  const double H = m.H, act = 2.0;  // bf16 activations

  StageOps out;
  auto add = [&](OpClass cls, double s) { out.ideal[static_cast<std::size_t>(cls)] += s; };
  // Fixed latencies of collectives and hops have classes of their own, apart from their
  // bytes and from kernel launches: a link's per-message cost and its bandwidth, and a
  // NIC's and NVLink's, are learned separately.
  auto latency = [](bool inside) { return inside ? OpClass::latency_intra : OpClass::latency_inter; };
  auto tp_allreduce = [&](double count, double bytes) {
    if (c.tp > 1) {
      add(tp_inside ? OpClass::allreduce_intra : OpClass::allreduce_inter, count * allreduce(bytes, c.tp, tp_inside ? intra : inter));
      add(latency(tp_inside), count * ring_steps(c.tp) * (tp_inside ? kIntraLatency : kInterLatency));
    }
  };
  // A pipeline of m micro-batches sends between its stages at once, so its hops add up
  // to m + pp − 1 on the critical path; one sequence at a time (decoding) crosses pp − 1.
  auto pp_hops = [&](double micro, double count, double bytes) {
    if (c.pp > 1) {
      add(pp_inside ? OpClass::p2p_intra : OpClass::p2p_inter, count * (micro + c.pp - 1) * bytes / (pp_inside ? intra : inter));
      add(latency(pp_inside), count * (micro + c.pp - 1) * (pp_inside ? kIntraLatency : kInterLatency));
    }
  };
  auto launches = [&](double kernels) { add(OpClass::launch, kernels * kLaunch); };
  // Token dispatch and combine of a sparse layer: a GPU sends its share (1/(tp·ep)) of the
  // micro-batch's tokens to k experts each, all but 1/groups of them to another group.
  auto dispatch = [&](double count, double tokens) {
    if (m.Ls == 0 || groups <= 1) return;
    const double bytes = 2 * tokens / (c.tp * c.ep) * m.k * H * act * (groups - 1) / groups;
    add(ep_inside ? OpClass::alltoall_intra : OpClass::alltoall_inter, count * m.Ls / c.pp * bytes / (ep_inside ? intra : inter));
    add(latency(ep_inside), count * m.Ls / c.pp * 2 * (groups - 1) * (ep_inside ? kIntraLatency : kInterLatency));
  };
  const double stage_layers = std::ceil(m.L / c.pp);
  // FSDP: before a layer runs (forward, and again in backward) its fsdp GPUs all-gather
  // the layer's chunks (bf16), and backward reduce-scatters its gradients; a ring moves
  // (F−1)/F of the bytes either way, half an all-reduce. One collective per layer each.
  auto fsdp_collectives = [&](double count) {
    if (c.fsdp <= 1) return;
    const double shard = m.gpu_params(c) / c.pp * 2.0;  // the stage's TP shard, bf16
    add(fsdp_inside ? OpClass::allreduce_intra : OpClass::allreduce_inter,
        count * allreduce(shard, c.fsdp, fsdp_inside ? intra : inter) / 2);
    add(latency(fsdp_inside), count * stage_layers * ring_steps(c.fsdp) / 2 * (fsdp_inside ? kIntraLatency : kInterLatency));
  };
  // Forward FLOPs of n sequences of t tokens; attention is causal. Experts apart: their
  // class learns the routing imbalance.
  const double gemm_flops = 2.0 * m.linear();  // per token
  const double expert_flops = 2.0 * m.expert_linear();
  // An expert's GEMM has as many rows as tokens routed to it at once: a micro-batch's
  // tokens over all ep attention replicas, times k choices, over E experts. Grouped-GEMM
  // kernels compute rows in tiles of 64, so few rows per expert (decoding, short
  // sequences) pay for the padded tile.
  auto expert_padding = [&](double tokens) {
    if (m.Ls == 0) return 1.0;
    const double rows = std::max(1e-9, tokens * c.ep * m.k / m.E);
    return std::ceil(rows / kExpertTileRows) * kExpertTileRows / rows;
  };
  auto attention_flops = [&](double t) { return 2.0 * m.L * m.attention_width() * t * t; };  // per sequence
  auto bubble = [&](double micro) { return (micro + c.pp - 1) / std::max(1.0, micro); };

  switch (stage.kind) {
    case StageKind::generate: {
      const double micro = std::min(B, 4.0 * c.pp);
      fsdp_collectives(1);  // prefill; decoding gathers each iteration (below)
      add(OpClass::gemm, gemm_flops * B * P / unit / peak * bubble(micro));
      add(OpClass::expert, expert_flops * B * P / unit / peak * bubble(micro) * expert_padding(B * P / micro / c.ep));
      add(OpClass::attention, attention_flops(P) * B / unit / peak * bubble(micro));
      tp_allreduce(stage_layers * 2 * (micro + c.pp - 1), B * P * H * act / micro / c.ep);
      dispatch(micro + c.pp - 1, B * P / micro);
      pp_hops(micro, 1, B * P * H * act / micro / c.ep);
      launches((micro + c.pp - 1) * stage_layers * kKernelsPerLayer);
      // Decoding: per step every GPU of a tensor group reads its weights and KV cache; a
      // token crosses the pipeline stages one after the other.
      // At most kMaxRunning sequences decode at once: the weights are read once per
      // iteration, and there are B·R / kMaxRunning iterations when the batch is larger,
      // but never fewer than the long responses take (the step waits for them: p95).
      // The running batch is split into pp micro-batches in flight, so a GPU reads its
      // stage's weights pp times per iteration (the whole model over the pipeline) but
      // only its own layers' KV cache, while the other stages read theirs.
      // With expert parallelism each of the ep attention replicas decodes its own batch.
      const double weights = m.gpu_params(c) * 2.0;
      const double kv_per_token = m.L * m.kv_elements(c.tp) * 2.0;
      const double iterations = std::max(w.response_len_p95, B / c.ep * R / kMaxRunning);
      const double bytes = iterations * weights + B / c.ep * kv_per_token * (P * R + R * R / 2) / c.pp;
      const double flops = decode_gemm_flops(m, c, k, std::min(B / c.ep, kMaxRunning) / c.pp) * B / c.ep * R / c.pp +
                           expert_flops * B * R / unit * expert_padding(std::min(B / c.ep, kMaxRunning) / c.pp) + attention_flops(T) * B / unit;
      add(OpClass::decode, std::max(bytes / hbm, flops / peak));
      tp_allreduce(iterations * m.L * 2, std::min(B / c.ep, kMaxRunning) * H * act);
      dispatch(iterations * c.pp, std::min(B / c.ep, kMaxRunning) * c.ep / c.pp);
      pp_hops(0, iterations, std::min(B / c.ep, kMaxRunning) * H * act);
      fsdp_collectives(iterations);
      add(OpClass::graph_launch, iterations * m.L * kKernelsPerLayer * kLaunch);
      add(OpClass::host, iterations * kHostStep);
      break;
    }
    case StageKind::infer: {
      const double micro = B / (c.ep * c.fsdp);  // a replica's sequences, one per micro-batch
      fsdp_collectives(1);
      add(OpClass::gemm, gemm_flops * B * T / unit / peak * bubble(micro));
      add(OpClass::expert, expert_flops * B * T / unit / peak * bubble(micro) * expert_padding(T));
      add(OpClass::attention, attention_flops(T) * B / unit / peak * bubble(micro));
      tp_allreduce(stage_layers * 2 * (micro + c.pp - 1), T * H * act);
      dispatch(micro + c.pp - 1, T * c.ep);
      pp_hops(micro, 1, T * H * act);
      launches((micro + c.pp - 1) * stage_layers * kKernelsPerLayer);
      break;
    }
    case StageKind::train: {
      const double passes = c.recompute ? 4.0 : 3.0;
      const double micro = B / (c.ep * c.fsdp);
      fsdp_collectives(c.recompute ? 4 : 3);  // gathers for forward and backward (and the recompute), one reduce-scatter
      add(OpClass::gemm, passes * gemm_flops * B * T / unit / peak * bubble(micro));
      add(OpClass::expert, passes * expert_flops * B * T / unit / peak * bubble(micro) * expert_padding(T));
      add(OpClass::attention, passes * attention_flops(T) * B / unit / peak * bubble(micro));
      tp_allreduce((c.recompute ? 3 : 2) * stage_layers * 2 * (micro + c.pp - 1), T * H * act);
      dispatch((c.recompute ? 3 : 2) * (micro + c.pp - 1), T * c.ep);
      pp_hops(micro, 2, T * H * act);
      launches((micro + c.pp - 1) * stage_layers * kKernelsPerLayer * passes);
      // Gradients: the experts' reduce over DP, everything else (replicated over the ep
      // attention copies) over ep·dp.
      const double expert_grads = m.expert_params() / unit * 2.0;
      const double other_grads = (m.params() - m.expert_params()) / (c.tp * c.pp * c.fsdp) * 2.0;
      for (auto [bytes, n] : {std::pair{other_grads, c.dp * c.ep}, std::pair{expert_grads, c.dp}})
        if (n > 1 && bytes > 0) {
          add(dp_inside ? OpClass::allreduce_intra : OpClass::allreduce_inter, allreduce(bytes, n, dp_inside ? intra : inter));
          add(latency(dp_inside), ring_steps(n) * (dp_inside ? kIntraLatency : kInterLatency));
        }
      // Adam: read and write params, grads, master weights and both moments.
      add(OpClass::decode, m.gpu_params(c) / (c.pp * c.fsdp) * 2 * 16 / hbm);
      break;
    }
  }
  return out;
}

StageOps CostModel::weight_update(const ModelStage& generation, const Candidate& g, const Candidate& train,
                                  bool inside, const Workload& w) const {
  const Shape m(generation.model->config());
  const ClusterSpec& k = cluster_;
  const double bw = inside ? k.intra_node_gbps * 1e9
                           : k.inter_node_gbps * 1e9 * k.nics_per_node / k.gpus_per_node / std::max(1.0, w.link_slowdown);
  // The busiest receiver takes its GPU's shard; the senders share every replica's copy
  // (each unit of the generation stage receives the whole model once).
  const double receive = m.busiest_elements(g) * 2.0;
  const double send = m.params() * 2.0 * g.dp / std::max(1, train.gpus());
  StageOps out;
  out.ideal[static_cast<std::size_t>(inside ? OpClass::p2p_intra : OpClass::p2p_inter)] = std::max(receive, send) / bw;
  // A transfer per tensor a receiver holds: about ten per layer.
  out.ideal[static_cast<std::size_t>(inside ? OpClass::latency_intra : OpClass::latency_inter)] =
      10.0 * std::ceil(m.L / g.pp) * (inside ? kIntraLatency : kInterLatency);
  return out;
}

StageMemory CostModel::memory(const ModelStage& stage, const Candidate& c, const Workload& w) const {
  const Shape m(stage.model->config());
  const double B = std::ceil(static_cast<double>(w.sequences) / c.dp);
  const double T = w.prompt_len + w.response_len_p95;
  const bool train = stage.kind == StageKind::train;
  StageMemory out;
  // bf16 params; training adds bf16 grads, fp32 master weights and Adam moments.
  // FSDP keeps a chunk of everything and gathers a layer at a time, the next one
  // prefetched: two layers' bf16 parameters (and in backward their gradients) transient.
  out.resident = static_cast<std::uint64_t>(std::ceil(m.busiest_elements(c) / c.fsdp) * (train ? 16.0 : 2.0));
  const double layers = std::ceil(m.L / c.pp);
  const double gathered = c.fsdp > 1 ? 2 * m.layer_elements(c) * 2.0 * (train ? 2 : 1) : 0.0;
  const double logits = T * m.out_rows(c.tp) * 4.0;
  double transient = 0;
  switch (stage.kind) {
    case StageKind::generate:
      // KV cache of the sequences decoding at once (at most kMaxRunning) at full length,
      // plus their logits.
      transient = std::min(B / c.ep, kMaxRunning) * (T * layers * m.kv_elements(c.tp) * 2.0 + m.V / c.tp * 4.0);
      break;
    case StageKind::infer:
      transient = T * m.H * 2.0 * 12.0 + logits;
      break;
    case StageKind::train: {
      // 1F1B keeps up to pp micro-batches of activations on the first stage; flash
      // attention stores no T² scores (34 bytes per token and hidden unit per layer).
      const double inflight = std::min(static_cast<double>(c.pp), B);
      const double per_layer = 34.0 * T * m.H / c.tp;
      transient = c.recompute ? (2.0 * T * m.H * layers * inflight + per_layer) : per_layer * layers * inflight;
      transient += 2.0 * logits;
      break;
    }
  }
  out.transient = static_cast<std::uint64_t>((transient + gathered) * memory_scale_);
  out.resident = static_cast<std::uint64_t>(static_cast<double>(out.resident) * memory_scale_);
  return out;
}

}  // namespace nereus
