#pragma once
// Half-open ranges and N-d boxes in global element coordinates, and where a global box
// sits inside a local row-major buffer.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

namespace nereus {

/// Half-open index range [lo, hi).
struct Range {
  std::int64_t lo = 0;
  std::int64_t hi = 0;

  constexpr std::int64_t size() const { return hi > lo ? hi - lo : 0; }
  constexpr bool empty() const { return hi <= lo; }
  constexpr bool contains(std::int64_t x) const { return lo <= x && x < hi; }
  constexpr bool contains(Range o) const { return o.empty() || (lo <= o.lo && o.hi <= hi); }
  constexpr Range intersect(Range o) const { return {std::max(lo, o.lo), std::min(hi, o.hi)}; }
  constexpr bool operator==(const Range&) const = default;
};

/// The i-th of k nearly equal parts of n: [floor(i·n/k), floor((i+1)·n/k)).
constexpr Range part(std::int64_t n, std::int64_t k, std::int64_t i) {
  return {i * n / k, (i + 1) * n / k};
}

/// Box of up to four dimensions; dims past `rank` are unused.
struct Box {
  static constexpr int kMaxRank = 4;
  int rank = 0;
  std::array<Range, kMaxRank> dims{};

  static Box of_shape(std::initializer_list<std::int64_t> shape);
  std::int64_t elements() const;
  bool empty() const { return elements() == 0; }
  Box intersect(const Box& o) const;
  bool contains(const Box& o) const;
  bool operator==(const Box& o) const;
  std::string to_string() const;
};

/// Where a box lies in a local buffer: element offset of its first element and the
/// element stride of each box dimension.
struct LocalView {
  std::int64_t offset = 0;
  std::array<std::int64_t, Box::kMaxRank> strides{};
};

/// Maps global box `b` (inside `shard`) into a buffer that stores `shard` as one
/// contiguous row-major block starting at element `base` (a fused buffer stacks its
/// parts by rows, so each part is such a block).
LocalView local_view(const Box& b, const Box& shard, std::int64_t base);

}  // namespace nereus
