#pragma once
// Maximum-weight perfect assignment (the Hungarian method, O(n^3)).
#include <cstdint>
#include <vector>

namespace nereus {

/// weight[i][j]: value of giving row i column j; all rows have n columns. Returns the
/// column of each row. Deterministic for equal inputs.
std::vector<int> max_weight_assignment(const std::vector<std::vector<std::int64_t>>& weight);

}  // namespace nereus
