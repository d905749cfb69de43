#include "strided_copy.hpp"

#include <algorithm>

namespace nereus::detail {

std::vector<StridedLaunch> strided_launches(const std::vector<Segment>& runs) {
  std::vector<StridedLaunch> out;
  for (std::size_t first = 0; first < runs.size(); first += kStridedRunsPerLaunch) {
    StridedLaunch l{first, std::min(kStridedRunsPerLaunch, runs.size() - first), 1};
    std::uint64_t most = 0;  // elements of the launch's largest run
    for (std::size_t i = first; i < first + l.runs; ++i) most = std::max(most, runs[i].bytes / strided_width(runs[i]) * runs[i].count);
    const std::uint64_t per_block = std::uint64_t{kStridedThreads} * 4;
    l.blocks = static_cast<unsigned>(std::clamp<std::uint64_t>((most + per_block - 1) / per_block, 1, kStridedMaxBlocks));
    out.push_back(l);
  }
  return out;
}

}  // namespace nereus::detail
