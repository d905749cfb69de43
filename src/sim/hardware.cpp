#include "nereus/sim/hardware.hpp"

#include <algorithm>
#include <cmath>

namespace nereus {

namespace {
std::array<double, kOpClasses> unit_efficiency() {
  std::array<double, kOpClasses> e;
  e.fill(1.0);
  return e;
}
}  // namespace

HardwareModel::HardwareModel(ClusterSpec cluster, std::uint64_t seed, double noise)
    : work_(std::move(cluster), unit_efficiency()), rng_(seed), noise_(noise) {}

double HardwareModel::efficiency(OpClass c, const ModelStage& stage, const Candidate& cand, const Workload& w) const {
  const ModelConfig& m = stage.model->config();
  const double per_gpu_hidden = static_cast<double>(m.hidden) / cand.tp;
  const double batch = static_cast<double>(w.sequences) / cand.dp;
  const double len = w.prompt_len + w.response_len_mean;
  switch (c) {
    case OpClass::gemm: return 0.78 * (0.8 + 0.2 * std::min(1.0, per_gpu_hidden / 2048.0));
    case OpClass::attention: return 0.55 * (0.75 + 0.25 * std::min(1.0, len / 4096.0));
    case OpClass::decode: return stage.kind == StageKind::generate ? 0.7 * batch / (batch + 2.0) : 0.8;
    case OpClass::allreduce_intra: return 0.75;
    case OpClass::allreduce_inter: return 0.6;
    case OpClass::p2p_intra: return 0.7;
    case OpClass::p2p_inter: return 0.55;
  }
  return 0.5;
}

double HardwareModel::expected_seconds(const ModelStage& stage, const Candidate& c, const Workload& w) const {
  const StageOps work = work_.work(stage, c, w);
  double t = 0;
  for (std::size_t k = 0; k < kOpClasses; ++k)
    if (work.ideal[k] > 0) t += work.ideal[k] / efficiency(static_cast<OpClass>(k), stage, c, w);
  // Kernel launches: per layer and micro-batch, per decode step and layer (graphs help).
  const double layers = static_cast<double>(stage.model->config().layers) / c.pp;
  const double batch = static_cast<double>(w.sequences) / c.dp;
  if (stage.kind == StageKind::generate) t += w.response_len_mean * layers * c.pp * 4e-6;
  else t += batch * layers * 30e-6 * (stage.kind == StageKind::train ? 3 : 1);
  return t;
}

double HardwareModel::stage_seconds(const ModelStage& stage, const Candidate& c, const Workload& w) {
  // Every replica draws its own noise; the step waits for the slowest.
  std::lognormal_distribution<double> jitter(0.0, noise_);
  double slowest = 0;
  for (int r = 0; r < std::min(c.dp, 64); ++r) slowest = std::max(slowest, jitter(rng_));
  return expected_seconds(stage, c, w) * slowest;
}

std::uint64_t HardwareModel::peak_bytes(std::uint64_t resident, std::uint64_t transient) const {
  // Allocator fragmentation, and activations a little larger than the textbook count.
  return static_cast<std::uint64_t>((static_cast<double>(resident) + 1.08 * static_cast<double>(transient)) * 1.03) +
         work_.overhead_bytes();
}

std::uint64_t HardwareModel::capacity_bytes() const {
  return static_cast<std::uint64_t>(work_.cluster().gpu_memory_gib * 1024.0 * 1024.0 * 1024.0);
}

}  // namespace nereus
