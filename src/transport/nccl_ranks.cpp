// The NCCL rank table, in every build: pure, so tests check it without NCCL or a GPU.
#include <set>

#include "nereus/transport/nccl.hpp"

namespace nereus {

std::vector<NcclRank> nccl_ranks(const NcclTransportOptions& o) {
  std::set<NcclRank> ranks;
  for (DeviceId d : o.devices) ranks.insert({o.owner_of(d), o.gpu_of(d)});
  return {ranks.begin(), ranks.end()};
}

}  // namespace nereus
