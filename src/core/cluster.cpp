#include "nereus/core/cluster.hpp"

#include <algorithm>

#include "json_fields.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

int data_sheet_compute_units(std::string_view gpu_name) {
  // Vendors' data sheets: streaming multiprocessors of the SXM parts, compute units of one
  // MI250X die (a GCD, which the system sees as one GPU) and of an MI300X.
  struct Known {
    std::string_view prefix;
    int units;
  };
  static constexpr Known kKnown[] = {{"A100", 108}, {"H100", 132}, {"H200", 132}, {"H800", 132}, {"B200", 148},
                                     {"MI250X", 110}, {"MI300X", 304}};
  for (const Known& k : kKnown)
    if (gpu_name.substr(0, k.prefix.size()) == k.prefix) return k.units;
  return 0;
}

ClusterSpec parse_cluster(std::string_view text, std::string_view origin) {
  using namespace detail;
  const json j = parse_json(text, origin);
  ClusterSpec c;
  c.name = string_field(j, "name", origin);
  c.nodes = static_cast<int>(integer_field(j, "nodes", origin));
  c.gpus_per_node = static_cast<int>(integer_field(j, "gpus_per_node", origin));
  const json& gpu = field(j, "gpu", origin);
  const std::string gorigin = std::string(origin) + " gpu";
  c.gpu_name = string_field(gpu, "name", gorigin);
  c.gpu_memory_gib = number_field(gpu, "memory_gib", gorigin);
  c.gpu_bf16_tflops = number_field(gpu, "bf16_tflops", gorigin);
  c.hbm_gbps = number_field(gpu, "hbm_gbps", gorigin);
  if (gpu.is_object() && gpu.contains("compute_units") && !gpu["compute_units"].is_null())
    c.gpu_compute_units = static_cast<int>(std::min<std::int64_t>(integer(gpu["compute_units"], "compute_units", gorigin), 1 << 20));
  else
    c.gpu_compute_units = data_sheet_compute_units(c.gpu_name);
  c.intra_node_gbps = number_field(j, "intra_node_gbps", origin);
  c.inter_node_gbps = number_field(j, "inter_node_gbps", origin);
  c.nics_per_node = static_cast<int>(integer_field(j, "nics_per_node", origin));
  return c;
}

ClusterSpec load_cluster(std::string_view arg) {
  return parse_cluster(read_file_or_preset(PresetKind::cluster, arg, "cluster"), arg);
}

ClusterSpec host_cluster(int devices, std::size_t capacity) {
  ClusterSpec s;
  s.name = "host";
  s.nodes = 1;
  s.gpus_per_node = devices;
  s.gpu_name = "host memory";
  s.gpu_memory_gib = static_cast<double>(capacity) / static_cast<double>(1ull << 30);
  s.gpu_bf16_tflops = 0.05;
  s.hbm_gbps = 10;
  s.intra_node_gbps = 5;
  s.inter_node_gbps = 1;
  s.framework_overhead_gib = 0;
  return s;
}

}  // namespace nereus
