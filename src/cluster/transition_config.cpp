#include <algorithm>

#include "transition_config.hpp"

namespace nereus::cluster::detail {

ReshardSpec config_of(const TransitionSpec& s) {
  ReshardSpec c;
  c.model = s.model;
  c.from = s.from;
  c.to = s.to;
  c.train = s.train;
  c.sync = s.sync;
  c.capacity = s.capacity;
  c.copy_threads = std::max(1u, s.copy_threads);
  c.per_link = std::max(1u, s.per_link);
  c.chunk_bytes = std::max<std::uint64_t>(s.chunk_bytes, 4096);
  c.gpus_per_node = s.gpus_per_node;
  c.two_sided = s.two_sided;
  c.rounds = s.rounds;
  c.cuda = s.cuda;
  c.ipc = s.ipc;
  c.nccl = s.nccl;
  c.shared_arenas = false;  // see ReshardSpec::shared_arenas: the daemon's loop heartbeats
  return c;
}

}  // namespace nereus::cluster::detail
