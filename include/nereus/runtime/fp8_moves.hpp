#pragma once
// FP8 transfers as the executor moves them (sharding.md, "Per-tensor dtypes and FP8
// block-scaled weights"). The planner keeps one transfer per box of an FP8-held weight
// (its bytes count the FP8 elements and their scales together); the executor moves plain
// element runs. Here each such transfer becomes two: the weight's FP8 bytes (one per
// element) and its block scales (slot `scale`, in block coordinates). A bf16 source is
// quantized where it is read: the sender's process quantizes the blocks it sends into a
// staging copy of its buffer (side quantized_side(c)) before the run, and the transfers
// read from there, so FP8 bytes, not bf16 ones, cross the link.
#include <cstdint>
#include <span>
#include <vector>

#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/buffers.hpp"

namespace nereus {

/// The side of source collection c's quantized staging: FP8 weight buffers (same element
/// offsets as c's) and their scale buffers, written by the quantize pass.
inline constexpr std::uint32_t kQuantizedSide = 0x40000000u;
constexpr std::uint32_t quantized_side(std::uint32_t c) { return c | kQuantizedSide; }
constexpr bool is_quantized_side(std::uint32_t side) { return side != kTargetSide && (side & kQuantizedSide) != 0; }

/// One block-aligned box a sender quantizes before a run: from source buffer `source`
/// (slot param, the config's dtype) into the staging buffers of quantized_side(c).
struct QuantizeTask {
  BufferKey source;  ///< the bf16 (config dtype) buffer read
  TensorId tensor = 0;
  Box box;           ///< global element coordinates, on the block grid
  LocalView weight;  ///< the box in the source buffer and, the same offsets, in the staging FP8 buffer
  LocalView scales;  ///< its scale box in the staging scale buffer
};

/// What the executor binds, and what the quantize pass must do first.
struct ExecutableTransfers {
  std::vector<Transfer> transfers;     ///< no Fp8Move left: FP8 bytes and scales as element runs
  std::vector<QuantizeTask> quantize;  ///< distinct boxes, each once, whose source device is in `devices`
};

/// The executable form of the plan's transfers touching `devices`.
ExecutableTransfers executable_transfers(const ReshardPlan& plan, std::span<const DeviceId> devices);

}  // namespace nereus
