#pragma once
// Transfers: one box of one (tensor, slot) from one device to another, bound to the
// local buffers at both ends (an address-free plan; the runtime binds real memory).
#include <cstdint>

#include "nereus/core/box.hpp"
#include "nereus/core/emu.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// Where a transfer's box lies in one end's local buffer.
struct BufferView {
  TensorId buffer = 0;  ///< first tensor of the local buffer (see packing.hpp)
  Packing packing = Packing::hf;
  LocalView view;       ///< element offset and per-dimension element strides
};

/// One box of one (tensor, slot) from device src to device dst.
struct Transfer {
  DeviceId src = 0;
  DeviceId dst = 0;
  std::uint32_t source = 0;  ///< index of the source collection the bytes come from
  TensorId tensor = 0;
  Slot slot = Slot::param;
  Box box;                   ///< global element coordinates
  BufferView src_view;
  BufferView dst_view;
  std::uint64_t bytes = 0;
  bool keep = false;         ///< local, and the destination may keep the source buffer as is

  bool local() const { return src == dst; }
};

}  // namespace nereus
