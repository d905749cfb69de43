#pragma once
// Known values written into a job's units through their shard views, and read back by box:
// what a transition or weight update moved is checked element by element.
#include <cstdint>

#include "nereus/core/bytes.hpp"
#include "nereus/core/safetensors.hpp"
#include "nereus/runtime/job.hpp"

namespace testing {

using namespace nereus;

/// The value element `idx` of tensor t's slot s is given: exact in bf16, f16 and f32.
inline float value(TensorId t, Slot s, std::int64_t idx, int salt = 0) {
  const auto h = static_cast<std::uint64_t>(t) * 1000003u + static_cast<std::uint64_t>(s) * 7919u + static_cast<std::uint64_t>(salt) * 104729u;
  return static_cast<float>(static_cast<int>((h + static_cast<std::uint64_t>(idx) * 97u) % 255u) - 127) / 16.0f;
}

/// Calls f(global element index, pointer to the element) over a shard view.
template <class F>
void each_element(const ModelSpec& m, const ShardView& v, F&& f) {
  const TensorInfo& info = m.tensor(v.tensor);
  const std::int64_t cols = info.rank == 1 ? 1 : info.shape[1];
  const Range rows = v.box.dims[0];
  const Range cs = info.rank == 1 ? Range{0, 1} : v.box.dims[1];
  std::byte* p = v.data;
  for (std::int64_t r = rows.lo; r < rows.hi; ++r)
    for (std::int64_t c = cs.lo; c < cs.hi; ++c, p += width(v.dtype)) f(info.rank == 1 ? r : r * cols + c, p);
}

inline void write_values(const ModelSpec& m, const std::vector<UnitView>& units, int salt = 0) {
  for (const UnitView& u : units)
    for (const ShardView& v : u.shards)
      each_element(m, v, [&](std::int64_t i, std::byte* p) {
        const float x = value(v.tensor, v.slot, i, salt);
        convert_elements(DType::f32, reinterpret_cast<const std::byte*>(&x), v.dtype, p, 1);
      });
}

/// Number of elements that differ from value(); every shard of every unit is read by its box.
inline std::int64_t wrong_values(const ModelSpec& m, const std::vector<UnitView>& units, int salt = 0) {
  std::int64_t wrong = 0;
  for (const UnitView& u : units)
    for (const ShardView& v : u.shards)
      each_element(m, v, [&](std::int64_t i, std::byte* p) {
        float x = 0;
        convert_elements(v.dtype, p, DType::f32, reinterpret_cast<std::byte*>(&x), 1);
        wrong += x != value(v.tensor, v.slot, i, salt);
      });
  return wrong;
}

}  // namespace testing
