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
  int expert_groups = 1;  ///< its unit's expert groups: Megatron names a local expert by its index in its group
};

/// How a transfer to a `dtype=fp8` unit treats a quantized weight (sharding.md, "FP8").
enum class Fp8Move : std::uint8_t {
  none,      ///< not an FP8-held tensor: elements as they are
  quantize,  ///< the source holds the config's dtype: quantized per block where it is read
  copy,      ///< both ends hold FP8: the bytes and their scales as they are
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
  std::uint64_t bytes = 0;   ///< at the destination's element width; FP8: one per element, four per block
  Fp8Move fp8 = Fp8Move::none;
  bool keep = false;         ///< local, and the destination may keep the source buffer as is

  bool local() const { return src == dst; }
};

}  // namespace nereus
