#include "nereus/core/cluster.hpp"

#include "json_fields.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

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
  c.intra_node_gbps = number_field(j, "intra_node_gbps", origin);
  c.inter_node_gbps = number_field(j, "inter_node_gbps", origin);
  c.nics_per_node = static_cast<int>(integer_field(j, "nics_per_node", origin));
  return c;
}

ClusterSpec load_cluster(std::string_view arg) {
  return parse_cluster(read_file_or_preset(PresetKind::cluster, arg, "cluster"), arg);
}

}  // namespace nereus
