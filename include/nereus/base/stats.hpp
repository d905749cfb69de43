#pragma once
// Figures from repeated runs: what benches and reports print.
#include <algorithm>
#include <utility>
#include <vector>

namespace nereus {

/// Median and minimum of run times (`v` must not be empty).
inline std::pair<double, double> median_min(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

}  // namespace nereus
