#include "assignment.hpp"

#include <algorithm>
#include <limits>

namespace nereus {

// Shortest augmenting paths with row/column potentials, minimising cost = max − weight.
std::vector<int> max_weight_assignment(const std::vector<std::vector<std::int64_t>>& weight) {
  const int n = static_cast<int>(weight.size());
  if (n == 0) return {};
  std::int64_t top = 0;
  for (const auto& row : weight)
    for (std::int64_t w : row) top = std::max(top, w);
  auto cost = [&](int i, int j) { return top - weight[i - 1][j - 1]; };
  constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max() / 4;
  std::vector<std::int64_t> u(n + 1, 0), v(n + 1, 0);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<std::int64_t> minv(n + 1, inf);
    std::vector<char> used(n + 1, 0);
    do {
      used[j0] = 1;
      const int i0 = p[j0];
      std::int64_t delta = inf;
      int j1 = 0;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const std::int64_t cur = cost(i0, j) - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      const int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> col(n, 0);
  for (int j = 1; j <= n; ++j) col[p[j] - 1] = j - 1;
  return col;
}

}  // namespace nereus
