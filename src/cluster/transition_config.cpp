#include <algorithm>

#include "transition_config.hpp"

namespace nereus::cluster::detail {

bench::TransitionConfig config_of(const TransitionSpec& s) {
  bench::TransitionConfig c;
  c.model = s.model;
  c.from = s.from;
  c.to = s.to;
  c.train = s.train;
  c.sync = s.sync;
  c.transport = "ucx";
  c.repeat = s.repeat;
  c.verify = s.verify;
  c.dump_dir = s.dump_dir;
  c.capacity = s.capacity;
  c.copy_threads = std::max(1u, s.copy_threads);
  c.per_link = std::max(1u, s.per_link);
  c.chunk_bytes = std::max<std::uint64_t>(s.chunk_bytes, 4096);
  c.gpus_per_node = s.gpus_per_node;
  c.timeout_seconds = s.timeout_seconds > 0 ? s.timeout_seconds : 300;
  return c;
}

}  // namespace nereus::cluster::detail
