#pragma once
// The compact form of a plan: one piece is a range of one template's split axis, for
// one slot group, from one source position to one destination position. It stands for
// (layers of the template) × (slots of the group) transfers.
#include <cstdint>

#include "nereus/core/box.hpp"
#include "reshard_index.hpp"

namespace nereus {

struct Piece {
  std::uint32_t tmpl;
  std::uint32_t dst_unit;
  std::uint16_t dst_stage;
  std::uint16_t dst_rank;
  std::uint8_t group;
  bool local;
  bool keep;
  std::uint32_t holding;  ///< index into ReshardIndex::holdings
  DeviceId dst;
  Range range;
};

}  // namespace nereus
