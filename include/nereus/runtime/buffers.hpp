#pragma once
// Binding a plan to memory: which address holds each (model-stage, device, local
// buffer, slot), in this process or in a peer's.
#include <compare>
#include <cstdint>
#include <map>
#include <optional>

#include "nereus/core/emu.hpp"
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

}  // namespace nereus
