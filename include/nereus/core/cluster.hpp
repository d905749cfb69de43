#pragma once
// Cluster descriptions (interfaces.md, "Cluster").
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nereus {

/// A cluster: nodes of identical GPUs; bandwidths in GB/s (10^9 B/s), one direction.
struct ClusterSpec {
  std::string name;
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu_name;
  double gpu_memory_gib = 0;
  double gpu_bf16_tflops = 0;
  double hbm_gbps = 0;
  /// Streaming multiprocessors (NVIDIA) or compute units (AMD) of a GPU: the JSON's
  /// "gpu": {"compute_units"}, else data_sheet_compute_units() of its name; 0: unknown (the
  /// cost model then takes a GEMM's FLOPs at the full rate however few tiles it has).
  int gpu_compute_units = 0;
  double intra_node_gbps = 0;  ///< per GPU
  double inter_node_gbps = 0;  ///< per NIC
  int nics_per_node = 1;
  /// Bytes of each GPU the framework itself takes (context, libraries' buffers), which no
  /// stage can use; negative: the cost model's default (2 GiB, or a sixteenth of a small
  /// device). Host devices of an embedded job take none: the framework's heap is elsewhere.
  double framework_overhead_gib = -1;

  std::int64_t gpus() const { return static_cast<std::int64_t>(nodes) * gpus_per_node; }
  int node_of(std::int64_t device) const { return static_cast<int>(device / gpus_per_node); }
};

ClusterSpec parse_cluster(std::string_view json_text, std::string_view origin);
/// Compute units of the GPUs whose name starts with a known model (A100, H100, H200, H800,
/// B200, MI250X, MI300X); 0 for others.
int data_sheet_compute_units(std::string_view gpu_name);
/// A path to a cluster JSON, or a preset name (e.g. "h200-node").
ClusterSpec load_cluster(std::string_view arg);
/// The cluster an embedded job's controller plans for when it runs on `devices` host
/// devices of `capacity` bytes each: one "node" with rough speeds, which the controller's
/// calibration corrects from the times the job measures, and no framework overhead (the
/// devices' arenas hold only units and workspaces).
ClusterSpec host_cluster(int devices, std::size_t capacity);

}  // namespace nereus
