#pragma once
// Binding a plan to memory: which address holds each (model-stage, device, local
// buffer, slot), in this process or in a peer's.
#include <algorithm>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>

#include <span>

#include "nereus/core/emu.hpp"
#include "nereus/plan/transfer.hpp"
#include "nereus/transport/transport.hpp"

namespace nereus {

/// Which collection a buffer belongs to: a source index, or the target.
inline constexpr std::uint32_t kTargetSide = 0xffffffffu;

/// Names one local buffer of one slot on one device of one collection.
struct BufferKey {
  std::uint32_t side;  ///< source collection index, or kTargetSide
  DeviceId device;
  TensorId buffer;     ///< first tensor of the buffer (packing.hpp)
  Slot slot;
  auto operator<=>(const BufferKey&) const = default;
};

/// Where a buffer lives.
struct BoundBuffer {
  std::uint64_t address = 0;  ///< a local pointer, or the owning peer's virtual address
  std::uint64_t bytes = 0;
  PeerId owner = 0;
  MemoryKind kind = MemoryKind::host;  ///< the memory it lives in: the executor moves it only with a transport that can
};

/// Buffers bound for one transition.
class BufferTable {
 public:
  void bind(const BufferKey& key, const BoundBuffer& where) { buffers_[key] = where; }
  const BoundBuffer* find(const BufferKey& key) const {
    auto it = buffers_.find(key);
    return it == buffers_.end() ? nullptr : &it->second;
  }
  const std::map<BufferKey, BoundBuffer>& all() const { return buffers_; }

 private:
  std::map<BufferKey, BoundBuffer> buffers_;
};

/// The bytes each buffer that `transfers` name must hold (to the farthest element any of
/// their views reaches): what a caller binding a transfer set on memory of its own
/// allocates (tests, the GPU bench).
inline std::map<BufferKey, std::uint64_t> buffer_extents(std::span<const Transfer> transfers) {
  std::map<BufferKey, std::uint64_t> out;
  for (const Transfer& t : transfers) {
    const auto w = t.bytes / static_cast<std::uint64_t>(t.box.elements());
    auto reach = [&](const BufferView& v) {
      std::int64_t last = v.view.offset;
      for (int d = 0; d < t.box.rank; ++d) last += (t.box.dims[d].size() - 1) * v.view.strides[d];
      return static_cast<std::uint64_t>(last + 1) * w;
    };
    auto& s = out[{t.source, t.src, t.src_view.buffer, t.slot}];
    s = std::max(s, reach(t.src_view));
    auto& d = out[{kTargetSide, t.dst, t.dst_view.buffer, t.slot}];
    d = std::max(d, reach(t.dst_view));
  }
  return out;
}

}  // namespace nereus
