#include "nereus/core/box.hpp"

#include "nereus/base/error.hpp"

namespace nereus {

Box Box::of_shape(std::initializer_list<std::int64_t> shape) {
  if (shape.size() > kMaxRank) throw Error("box rank " + std::to_string(shape.size()) + " exceeds 4");
  Box b;
  for (std::int64_t n : shape) b.dims[b.rank++] = {0, n};
  return b;
}

std::int64_t Box::elements() const {
  std::int64_t n = rank == 0 ? 0 : 1;
  for (int d = 0; d < rank; ++d) n *= dims[d].size();
  return n;
}

Box Box::intersect(const Box& o) const {
  Box r;
  r.rank = rank;
  for (int d = 0; d < rank; ++d) r.dims[d] = dims[d].intersect(o.dims[d]);
  return r;
}

bool Box::contains(const Box& o) const {
  if (o.rank != rank) return false;
  for (int d = 0; d < rank; ++d)
    if (!dims[d].contains(o.dims[d])) return false;
  return true;
}

bool Box::operator==(const Box& o) const {
  if (rank != o.rank) return false;
  for (int d = 0; d < rank; ++d)
    if (!(dims[d] == o.dims[d])) return false;
  return true;
}

std::string Box::to_string() const {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) {
    if (d) s += ",";
    s += "[" + std::to_string(dims[d].lo) + "," + std::to_string(dims[d].hi) + ")";
  }
  return s + "]";
}

LocalView local_view(const Box& b, const Box& shard, std::int64_t base) {
  LocalView v;
  std::int64_t stride = 1;
  std::int64_t offset = base;
  for (int d = shard.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    offset += (b.dims[d].lo - shard.dims[d].lo) * stride;
    stride *= shard.dims[d].size();
  }
  v.offset = offset;
  return v;
}

}  // namespace nereus
