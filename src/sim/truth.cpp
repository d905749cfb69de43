// The ground truth's per-layer accounting (see sim/truth.hpp for what it models and why).
// Per replica: B = sequences / dp, P prompt tokens, responses lognormal with the load's
// mean and p95, t = tp. A pipeline of m micro-batches over pp stages takes (m + pp − 1)
// stage times (1F1B); the busiest pipeline stage holds ceil(L / pp) layers.
#include "nereus/sim/truth.hpp"

#include <map>

#include <algorithm>
#include <cmath>

namespace nereus {

namespace {

constexpr double kGemmEfficiency = 0.80;   // cuBLAS on large bf16 GEMMs reaches about 80% of peak
constexpr double kFlashEfficiency = 0.50;  // FlashAttention-2, causal, head_dim 128: 50–70% of peak (Dao 2023)
constexpr double kFlashBackward = 2.5;     // its backward over its forward
constexpr double kHbmEfficiency = 0.85;    // streaming kernels reach 85–90% of HBM bandwidth
constexpr double kEagerLaunch = 5e-6;      // a kernel launched from PyTorch eager mode
constexpr double kGraphLaunch = 1e-6;      // a kernel replayed from a CUDA graph (vLLM decode)
constexpr double kTruthKernelsPerLayer = 12;    // norm, qkv, rope, attention, o, all-reduce, norm, gate/up, act, down, all-reduce, add
constexpr double kSchedulerSeconds = 5e-4; // vLLM's scheduler and sampler per decode iteration
constexpr double kPrefillChunk = 8192;     // tokens per prefill batch (max_num_batched_tokens)
constexpr double kTruthMaxRunning = 256;        // vLLM's max_num_seqs default
constexpr double kBlockTokens = 16;        // paged KV block; a sequence wastes half a block on average
constexpr double kAllocatorSlack = 1.10;   // PyTorch caching allocator: reserved over allocated
constexpr double kAdamBytes = 18;          // bf16 param, fp32 main grad, fp32 master, two fp32 moments
constexpr double kOptimizerTraffic = 30;   // bytes an Adam step reads and writes per param
constexpr double kStragglerOdds = 0.02;    // a replica running slow (throttling, a noisy neighbour)
constexpr double kStragglerFactor = 1.15;
constexpr double kRouterSkew = 1.15;       // a trained router with a balance loss: busiest expert group 10–20% above the mean
constexpr double kAllToAllIntra = 0.60;    // NCCL all-to-all reaches about 60% of NVLink bandwidth
constexpr double kAllToAllInter = 0.50;    // and about half of the NICs' across nodes

/// The model as the truth reads it.
struct Dims {
  double H, I, L, nh, kv, hd, V, out;  // out: rows of the output head (vocab or score labels)
  bool tied;
  double E = 0, k = 0, Ie = 0, sparse = 0;  // experts, experts per token, their width, share of sparse layers
  explicit Dims(const ModelConfig& m)
      : H(double(m.hidden)), I(double(m.intermediate)), L(double(m.layers)), nh(double(m.heads)), kv(double(m.kv_heads)),
        hd(double(m.head_dim)), V(double(m.vocab)), out(m.score_labels > 0 ? double(m.score_labels) : double(m.vocab)),
        tied(m.tied_embeddings) {
    if (m.experts > 0) {
      E = double(m.experts), k = double(m.experts_per_token), Ie = double(m.expert_intermediate);
      for (std::int64_t l = 0; l < m.layers; ++l) sparse += m.sparse_layer(l) ? 1.0 / L : 0;
    }
  }
  bool score() const { return out != V || V == 0; }
  double kv_rank(int t) const { return std::max(1.0, kv / t); }  // KV heads replicate when t > kv
  double head_rows(int t) const { return out == V ? V / t : out; }
  /// Attention projections on one GPU (the first terms of every layer's sum, so a dense
  /// layer's total is added in the order it always was).
  double attention_weights(int t) const { return H * (nh / t + 2 * kv_rank(t)) * hd + nh / t * hd * H; }
  /// Expert groups and the experts on one GPU (the fullest group).
  static double groups(const TruthLayout& l) { return double(l.tp * l.ep / l.expert_tp()); }
  double local_experts(const TruthLayout& l) const { return std::ceil(E / groups(l)); }
  /// A layer's params on one GPU, the dense and sparse layers averaged by their share.
  double layer_params(const TruthLayout& l) const {
    const int t = l.tp;
    const double dense = attention_weights(t) + 3 * H * I / t + 2 * H + 2 * hd;
    const double moe = attention_weights(t) + 2 * H + 2 * hd + E * H + local_experts(l) * 3 * H * Ie / l.expert_tp();
    return sparse > 0 ? (1 - sparse) * dense + sparse * moe : dense;
  }
  double layers_per_stage(int pp) const { return std::ceil(L / pp); }
  /// Params on the busiest GPU: the first stage has the embedding, the last the head.
  double busiest_params(const TruthLayout& l) const {
    const int t = l.tp, pp = l.pp;
    const double layers = layers_per_stage(pp) * layer_params(l);
    const double embed = V * H / t;
    const double head = (out == V && tied && pp == 1) ? 0 : head_rows(t) * H;
    return pp == 1 ? layers + embed + head + H : layers + std::max(embed, head + H);
  }
};

double ceil_div(double a, double b) { return std::ceil(a / b); }

/// Lognormal σ from mean and p95: ln p95 = μ + 1.645σ, ln mean = μ + σ²/2.
double lognormal_sigma(double mean, double p95) {
  if (!(p95 > mean) || !(mean > 0)) return 0;
  const double z = 1.6448536;
  const double disc = z * z - 2 * std::log(p95 / mean);
  return disc > 0 ? z - std::sqrt(disc) : z;
}

double normal_quantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 80; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

/// E[R²] / E[R] of the lengths: the context a running sequence has on average is P + half this.
double second_over_first(double mean, double p95) {
  const double s = lognormal_sigma(mean, p95);
  return mean * std::exp(s * s);
}

}  // namespace

double expected_max_length(double mean, double p95, double n);

namespace {
/// Prompt plus the longest response of the whole batch, within the job's cap: what the
/// largest activations and the one sequence the KV cache must hold are sized by.
double longest_sequence(const TruthLoad& w) {
  const double cap = w.max_response > 0 ? w.max_response : 1e18;
  return w.prompt_len + std::min(cap, expected_max_length(w.response_mean, w.response_p95, double(w.sequences)));
}
}  // namespace

double expected_max_length(double mean, double p95, double n) {
  const double s = lognormal_sigma(mean, p95);
  if (s == 0 || n <= 1) return mean;
  const double mu = std::log(mean) - s * s / 2;
  return std::exp(mu + s * normal_quantile(1 - 1 / (n + 1)));
}

GroundTruth::GroundTruth(const ClusterSpec& cluster, std::uint64_t seed, double noise)
    : cluster_(cluster), rng_(seed), noise_(noise) {
  const std::string& g = cluster.gpu_name;
  // Streaming multiprocessors (compute units) per GPU, from the vendors' data sheets.
  sms_ = g.find("H1") != std::string::npos || g.find("H2") != std::string::npos ? 132
         : g.find("MI250") != std::string::npos                                  ? 110
         : g.find("MI300") != std::string::npos                                  ? 304
                                                                                 : 108;
}

std::uint64_t GroundTruth::capacity_bytes() const { return std::uint64_t(cluster_.gpu_memory_gib * double(1ull << 30)); }

std::uint64_t GroundTruth::context_bytes() const {
  // CUDA context about 0.5 GiB, NCCL communicators and cuBLAS workspaces about 1 GiB.
  return std::min<std::uint64_t>(3ull << 29, capacity_bytes() / 16);
}

double GroundTruth::copy_seconds(const std::vector<TruthFlow>& flows, double link_slowdown) {
  // Per-message costs of NCCL point-to-point operations, the small-message latencies
  // nccl-tests' sendrecv_perf reports: a few microseconds over NVLink, about ten across
  // InfiniBand (the same figures this file's p2p() uses: 3 and 8 µs).
  constexpr double kIntraMessage = 3e-6, kInterMessage = 8e-6;
  const int gpn = std::max(1, cluster_.gpus_per_node);
  const double nvlink = cluster_.intra_node_gbps * 1e9 * intra_efficiency();
  // A node's NICs are shared by its GPUs' traffic to other nodes.
  const double nics = cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node * inter_efficiency() / std::max(1.0, link_slowdown);
  std::map<int, double> sent, received, node_out, node_in, messages;
  for (const TruthFlow& f : flows) {
    if (f.src == f.dst || f.bytes == 0) continue;
    const bool inside = f.src / gpn == f.dst / gpn;
    if (inside) {
      sent[f.src] += double(f.bytes);
      received[f.dst] += double(f.bytes);
    } else {
      node_out[f.src / gpn] += double(f.bytes);
      node_in[f.dst / gpn] += double(f.bytes);
    }
    const double m = double(f.messages) * (inside ? kIntraMessage : kInterMessage);
    messages[f.src] += m;
    messages[f.dst] += m;
  }
  double t = 0;
  for (const auto* side : {&sent, &received})
    for (const auto& [gpu, bytes] : *side) t = std::max(t, bytes / nvlink);
  for (const auto* side : {&node_out, &node_in})
    for (const auto& [node, bytes] : *side) t = std::max(t, bytes / nics);
  double setup = 0;
  for (const auto& [gpu, m] : messages) setup = std::max(setup, m);
  if (t + setup <= 0) return 0;
  std::lognormal_distribution<double> jitter(0.0, noise_);
  return (t + setup) * jitter(rng_);
}

double GroundTruth::checkpoint_bytes_per_second() const {
  return cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node / cluster_.gpus_per_node * inter_efficiency();
}

double GroundTruth::gemm(double M, double N, double K, double count) const {
  if (M <= 0 || N <= 0 || K <= 0 || count <= 0) return 0;
  const double peak = cluster_.gpu_bf16_tflops * 1e12;
  // Tile quantization: whole output tiles, in waves over the SMs. Tiles are 128 wide and
  // as tall as the smallest power of two from 16 to 128 that covers M: cuBLAS and CUTLASS
  // pick skinny tiles for the few rows of a decode batch.
  const double tile_m = std::clamp(std::exp2(std::ceil(std::log2(std::max(1.0, M)))), 16.0, 128.0);
  // A grouped GEMM (count problems of one shape, vLLM's fused_moe, Megatron's GroupedMLP)
  // schedules all of their tiles in one kernel.
  const double tiles = count * ceil_div(M, tile_m) * ceil_div(N, 128);
  const double waves = ceil_div(tiles, sms_);
  const double compute = waves * 2.0 * tile_m * 128 * K / (peak / sms_ * kGemmEfficiency);
  const double memory = count * 2.0 * (M * K + K * N + M * N) / (cluster_.hbm_gbps * 1e9 * kHbmEfficiency);
  return std::max(compute, memory);
}

double GroundTruth::allreduce(double bytes, int n, bool inside, double slowdown) const {
  if (n <= 1 || bytes <= 0) return 0;
  if (inside) {  // NCCL rings over NVLink / Infinity Fabric
    const double bw = cluster_.intra_node_gbps * 1e9 * intra_efficiency();
    return 2.0 * (n - 1) * 2e-6 + 2.0 * (n - 1) / n * bytes / bw;
  }
  const double bw = cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node / cluster_.gpus_per_node * inter_efficiency() /
                    std::max(1.0, slowdown);
  const double ring = 2.0 * (n - 1) * 6e-6 + 2.0 * (n - 1) / n * bytes / bw;
  const double tree = 2.0 * std::ceil(std::log2(double(n))) * 6e-6 + 2.0 * bytes / bw;  // double binary tree
  return std::min(ring, tree);
}

double GroundTruth::alltoall(double bytes, int n, bool inside, double slowdown) const {
  if (n <= 1 || bytes <= 0) return 0;
  const double bw = inside ? cluster_.intra_node_gbps * 1e9 * kAllToAllIntra
                           : cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node / cluster_.gpus_per_node * kAllToAllInter /
                                 std::max(1.0, slowdown);
  return (n - 1) * (inside ? 2e-6 : 6e-6) + bytes * (n - 1) / n / bw;
}

double GroundTruth::p2p(double bytes, bool inside, double slowdown) const {
  if (inside) return 3e-6 + bytes / (cluster_.intra_node_gbps * 1e9 * intra_efficiency());
  return 8e-6 + bytes * std::max(1.0, slowdown) /
                    (cluster_.inter_node_gbps * 1e9 * cluster_.nics_per_node / cluster_.gpus_per_node * inter_efficiency());
}

TruthStage GroundTruth::memory(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w) const {
  const Dims d(m);
  const int t = l.tp;
  TruthStage out;
  out.resident = std::uint64_t(d.busiest_params(l) * (kind == StageKind::train ? kAdamBytes : 2.0));
  const double B = std::ceil(double(w.sequences) / l.dp / l.ep);  // an attention replica's sequences
  const double longest = longest_sequence(w);
  const double layers = d.layers_per_stage(l.pp);
  const double logits = longest * d.head_rows(t) * 4.0;  // fp32 logits of one micro-batch
  double working = 0;
  switch (kind) {
    case StageKind::generate: {
      out.kv_bytes_per_token = std::uint64_t(2.0 * layers * d.kv_rank(t) * d.hd * 2.0);
      // Sampler logits of the running batch and the CUDA graphs' activation buffers.
      working = std::min(B, kTruthMaxRunning) * (d.head_rows(t) * 4.0 + d.H * 2.0 * 8) + kPrefillChunk * d.H * 2.0 * 8;
      break;
    }
    case StageKind::infer:
      working = longest * 2.0 * (3 * d.H + 2 * std::max(d.I / t, d.k * d.Ie / l.expert_tp())) + logits;
      break;
    case StageKind::train: {
      // Korthikanti et al. 2022, Table 2 with flash attention (no a·s²/h term), TP without
      // sequence parallelism: s·b·h·(10 + 24/t) bytes per layer; full recomputation keeps
      // 2·s·b·h per layer and rebuilds one layer at a time. 1F1B: the first stage holds pp
      // micro-batches in flight, the last one and the logits with their gradient.
      const double full = longest * d.H * (10.0 + 24.0 / t);
      const double kept = l.recompute ? 2.0 * longest * d.H : full;
      const double inflight = std::min<double>(l.pp, B);
      const double first = layers * kept * inflight + (l.recompute ? full : 0);
      const double last = layers * kept + (l.recompute ? full : 0) + 2 * logits;
      working = l.pp == 1 ? first + 2 * logits : std::max(first, last);
      break;
    }
  }
  out.working = std::uint64_t(working * kAllocatorSlack);
  return out;
}

std::int64_t GroundTruth::concurrency(const ModelConfig& m, const TruthLayout& l, const TruthLoad& w, std::uint64_t kv_pool) const {
  const TruthStage s = memory(m, StageKind::generate, l, w);
  const double per_token = double(s.kv_bytes_per_token);
  if (double(kv_pool) < per_token * longest_sequence(w)) return 0;
  // A running sequence sits at a uniformly random point of its life: P + E[R²]/(2E[R]).
  const double ctx = w.prompt_len + second_over_first(w.response_mean, w.response_p95) / 2 + kBlockTokens / 2;
  const double B = std::ceil(double(w.sequences) / l.dp / l.ep);
  return std::int64_t(std::max(1.0, std::min({B, kTruthMaxRunning, std::floor(double(kv_pool) / (per_token * ctx))})));
}

double GroundTruth::expected_seconds(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w,
                                     std::uint64_t kv_pool) const {
  const Dims d(m);
  const int t = l.tp, pp = l.pp;
  const int gpn = cluster_.gpus_per_node;
  const bool tp_in = t <= gpn, pp_in = t * pp * l.ep <= gpn, dp_in = t * pp * l.ep * l.dp <= gpn;
  const bool ep_in = t * l.ep <= gpn;
  const double slow = w.link_slowdown;
  const double layers = d.layers_per_stage(pp);
  const double B = std::ceil(double(w.sequences) / l.dp / l.ep);  // an attention replica's sequences
  const double P = w.prompt_len, R = w.response_mean;
  const double hbm = cluster_.hbm_gbps * 1e9 * kHbmEfficiency;
  const double peak = cluster_.gpu_bf16_tflops * 1e12;

  // One layer's forward over n tokens on one GPU: GEMMs, elementwise traffic, TP all-reduces.
  auto attention_gemms = [&](double n) { return gemm(n, (d.nh / t + 2 * d.kv_rank(t)) * d.hd, d.H) + gemm(n, d.H, d.nh / t * d.hd); };
  auto dense_layer = [&](double n) {
    return attention_gemms(n) + gemm(n, 2 * d.I / t, d.H) + gemm(n, d.H, d.I / t) + n * (8 * d.H + 6 * d.I / t) * 2.0 / hbm +
           2 * allreduce(n * d.H * 2.0, t, tp_in, slow);
  };
  auto attention_part = [&](double n) { return attention_gemms(n) + n * 8 * d.H * 2.0 / hbm + 2 * allreduce(n * d.H * 2.0, t, tp_in, slow); };
  // A sparse MLP: every ep rank routes its n tokens at once, so a GPU's experts see their
  // share of the ep·n·k choices; the busiest GPU carries the maximum of G Poisson loads
  // times the router's skew. Only experts some token picked are read.
  const double G = Dims::groups(l), local = d.local_experts(l);
  auto sparse_mlp = [&](double n) {
    const double choices = n * l.ep * d.k;
    const double mean = choices / G;
    const double busiest = G > 1 ? kRouterSkew * (mean + std::sqrt(2 * std::log(G) * mean)) : mean;
    const double touched = std::max(1.0, local * (1 - std::exp(-choices / d.E)));
    const double m = busiest / touched;
    const double dispatch = G > 1 ? 2 * alltoall(n / t * d.k * d.H * 2.0, int(G), ep_in, slow) : 0;  // and combine
    return gemm(n, d.E, d.H) + gemm(m, 2 * d.Ie / l.expert_tp(), d.H, touched) + gemm(m, d.H, d.Ie / l.expert_tp(), touched) +
           busiest * 6 * d.Ie / l.expert_tp() * 2.0 / hbm + dispatch;
  };
  auto layer = [&](double n) {
    return d.sparse > 0 ? (1 - d.sparse) * dense_layer(n) + d.sparse * (attention_part(n) + sparse_mlp(n)) : dense_layer(n);
  };
  // The communication in a layer's forward: two TP all-reduces, and a sparse layer's
  // dispatch and combine. Its backward communicates as much, not twice: Megatron's f and
  // g operators swap (an identity forward is an all-reduce backward), two all-reduces
  // each way (Shoeybi et al. 2019, §3), and the backward of an all-to-all is one
  // all-to-all of the same size (GShard; Megatron-Core's token dispatcher).
  auto layer_comm = [&](double n) {
    const double dispatch = d.sparse > 0 && G > 1 ? 2 * alltoall(n / t * d.k * d.H * 2.0, int(G), ep_in, slow) : 0;
    return 2 * allreduce(n * d.H * 2.0, t, tp_in, slow) + d.sparse * dispatch;
  };
  auto head = [&](double n) { return gemm(n, d.head_rows(t), d.H); };
  // Causal flash attention of sequences whose squared length averages s2, per layer.
  auto attention = [&](double s2) { return 2.0 * s2 * d.nh / t * d.hd / (peak * kFlashEfficiency); };
  const double s_mean = P + R;
  const double s2 = P * P + 2 * P * R + R * second_over_first(w.response_mean, w.response_p95);

  switch (kind) {
    case StageKind::train: {
      // One micro-batch = one sequence. Backward: 2× the GEMMs and memory traffic, 2.5×
      // attention, the same communication.
      const double fwd = layers * (layer(s_mean) + attention(s2)) + head(s_mean) / pp;
      const double bwd = layers * (2 * layer(s_mean) - layer_comm(s_mean) + kFlashBackward * attention(s2)) + 2 * head(s_mean) / pp;
      const double re = l.recompute ? fwd : 0;
      const double launches = layers * kTruthKernelsPerLayer * (l.recompute ? 4 : 3) * kEagerLaunch;
      const double stage = fwd + bwd + re + launches + (pp > 1 ? 2 * p2p(s_mean * d.H * 2.0, pp_in, slow) : 0);
      const double params = d.busiest_params(l);
      // Experts' gradients reduce over DP; the rest (attention, replicated over ep) over ep·dp.
      const double expert_params = layers * d.sparse * d.local_experts(l) * 3 * d.H * d.Ie / l.expert_tp();
      const double grads = allreduce((params - expert_params) * 2.0, l.dp * l.ep, dp_in, slow) +
                           allreduce(expert_params * 2.0, l.dp, dp_in, slow);
      const double adam = params * kOptimizerTraffic / hbm + 20 * kEagerLaunch;
      return (B + pp - 1) * stage + grads + adam;
    }
    case StageKind::infer: {
      const double stage = layers * (layer(s_mean) + attention(s2)) + head(s_mean) / pp + layers * kTruthKernelsPerLayer * kEagerLaunch +
                           (pp > 1 ? p2p(s_mean * d.H * 2.0, pp_in, slow) : 0);
      return (B + pp - 1) * stage;
    }
    case StageKind::generate: {
      const std::int64_t c = concurrency(m, l, w, kv_pool);
      if (c == 0) return std::numeric_limits<double>::infinity();
      // Prefill: chunks of up to kPrefillChunk tokens, pipelined over the stages.
      const double chunks = std::max(1.0, ceil_div(B * P, kPrefillChunk));
      const double n = B * P / chunks;
      const double prefill = (chunks + pp - 1) * (layers * (layer(n) + attention(P * P) * n / std::max(1.0, P)) + head(n) / pp +
                                                   layers * kTruthKernelsPerLayer * kEagerLaunch);
      // Decode: continuous batching with c slots; the last wave lasts until the longest
      // response is done. The running batch is split into pp micro-batches in flight.
      const double longest = std::min(w.max_response > 0 ? w.max_response : 1e18, expected_max_length(R, w.response_p95, B));
      const double iterations = std::max(B * R / double(c), longest);
      const double running = B * R / iterations;
      const double ctx = P + second_over_first(R, w.response_p95) / 2;
      const double micro = std::max(1.0, running / pp);
      const double kv_read = micro * ctx * 2.0 * d.kv_rank(t) * d.hd * 2.0 / hbm;  // per layer
      const double stage = layers * (layer(micro) + kv_read + kTruthKernelsPerLayer * kGraphLaunch) + head(micro) +
                           (pp > 1 ? p2p(micro * d.H * 2.0, pp_in, slow) : 0);
      return prefill + iterations * (pp * stage + kSchedulerSeconds);
    }
  }
  return 0;
}

double GroundTruth::run_seconds(const ModelConfig& m, StageKind kind, const TruthLayout& l, const TruthLoad& w, std::uint64_t kv_pool) {
  std::lognormal_distribution<double> jitter(0.0, noise_);
  std::uniform_real_distribution<double> odds(0, 1);
  double slowest = 0;
  for (int r = 0; r < std::min(l.dp, 64); ++r)
    slowest = std::max(slowest, jitter(rng_) * (odds(rng_) < kStragglerOdds ? kStragglerFactor : 1.0));
  return expected_seconds(m, kind, l, w, kv_pool) * slowest;
}

}  // namespace nereus
