#pragma once
// Where FP8 bytes live in a `dtype=fp8` unit (sharding.md, "Per-tensor dtypes and FP8
// block-scaled weights"): which tensors are quantized, their scale tensors, the bytes a
// slab of one holds, and the rule that no split may cut a block. The quantizer itself is
// fp8.hpp (dependency-free for the CUDA build); this header knows models and layouts.
#include <array>
#include <cstdint>
#include <string>

#include "nereus/core/box.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// Whether a `dtype=fp8` unit holds t as float8_e4m3fn with a float32 scale: every 2-D
/// `*_proj.weight` inside a decoder layer (attention, dense MLP, shared and routed
/// experts); never the embedding, lm_head, score, norms, the router or its bias.
bool quantizable(const TensorInfo& t);

/// The quantizer's source type for a tensor of `dtype` (bf16, f16 or f32).
fp8::Source fp8_source(DType dtype);

/// `<name minus .weight>.weight_scale_inv`.
std::string scale_name(const TensorInfo& t);

/// t's block size along its split axis (axis 0 for a replicated tensor) and across it,
/// from quantization_config.weight_block_size [bo, bi].
struct Fp8Blocks {
  std::int64_t along;
  std::int64_t across;
};
Fp8Blocks fp8_blocks(const ModelConfig& m, const TensorInfo& t);

/// Blocks whose elements a slab [range) of quantizable t touches: ⌈hi/b⌉ − ⌊lo/b⌋ along
/// its split axis times ⌈extent/b⌉ across it (or, given `across`, the blocks that part of
/// the other axis touches: a row band of a column-split tensor under FSDP).
std::int64_t fp8_block_count(const ModelConfig& m, const TensorInfo& t, Range range);
std::int64_t fp8_block_count(const ModelConfig& m, const TensorInfo& t, Range range, Range across);

/// Bytes a `dtype=fp8` unit holds for a slab [range) of quantizable t: one per element and
/// four per block (its scale_inv).
std::uint64_t fp8_slab_bytes(const ModelConfig& m, const TensorInfo& t, Range range);

/// The scale box of a weight box: rows [a/bo, ⌈b/bo⌉), columns [c/bi, ⌈d/bi⌉).
Box fp8_scale_box(const ModelConfig& m, const Box& weight);

/// What a `dtype=fp8` unit holds of quantizable t's weight box `w` under the verification
/// fill (sharding.md): the fill of t's `param` slot in its own dtype, quantized block by
/// block, each block read whole from the fill (so any shard is checkable on its own).
/// `fp8` gets w's elements row-major, `scales` those of fp8_scale_box(m, w) row-major.
void fp8_fill(const ModelConfig& m, const TensorInfo& t, const Box& w, std::uint8_t* fp8, float* scales);

/// Throws Error with one line naming the tensor, the boundary and the block size when a
/// split boundary (TP, expert TP) of a quantizable tensor in `layout` does not fall on a
/// block boundary or the tensor's end. `role` names the side ("target", "source
/// actor/train") in the message.
void check_fp8_blocks(const ModelSpec& model, const Layout& layout, const std::string& role);
/// The same rule as a question (the planner's candidates): whether `layout` cuts a block.
bool cuts_fp8_block(const ModelSpec& model, const Layout& layout);

}  // namespace nereus
