#pragma once
// Local buffers of a unit position under a packing (sharding.md, "Local packing"): which
// buffer holds a tensor's shard and at which element it starts.
#include <string>
#include <vector>

#include "nereus/core/box.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// Where a tensor's local shard sits: buffer (named by its first tensor), start element
/// in that buffer, and the shard's global box. A shard is one row-major block, or under
/// Megatron packing (q, k, v and their biases in linear_qkv) `groups` blocks of equal rows,
/// one per local query group, block j at base + j·group_stride.
struct ShardPlace {
  TensorId buffer;    ///< first tensor of the buffer (q for fused qkv, gate for gate_up)
  std::int64_t base;  ///< element offset of the shard's first element in the buffer
  Box shard;
  int groups = 1;
  std::int64_t group_stride = 0;  ///< elements from one group's block to the next

  /// Global box of block j, and its first element in the buffer.
  Box block(int j) const;
  std::int64_t block_base(int j) const { return base + j * group_stride; }
  /// Where global box b (inside one block) lies in the buffer.
  LocalView view(const Box& b) const;
};

/// Rows of t in one query group when `packing` interleaves them (Megatron's linear_qkv:
/// q rows qpg·hd, k and v rows hd), else 0. A box split at multiples of it lies in one
/// block of any ShardPlace of t.
std::int64_t interleave_rows(const ModelConfig& m, TensorKind kind, Packing packing);

/// Place of tensor t at in-stage index g (g = e·tp + r) under the layout's packing. The
/// position must hold t.
ShardPlace place_shard(const ModelSpec& m, TensorId t, const Layout& layout, int g);

/// Where the block scales of quantizable t's shard sit in the scale buffer of a
/// `dtype=fp8` unit: the same buffer (named by its first tensor), `base` counted in
/// scales, `shard` the scale box (fp8_scale_box). A scale buffer stacks its parts' scale
/// boxes in the order the weight buffer stacks their shards (vLLM's `weight_scale_inv`,
/// `w13_weight_scale_inv`).
ShardPlace place_scale(const ModelSpec& m, TensorId t, const Layout& layout, int g);

/// Name of the local buffer that starts with tensor `buffer` under `packing`
/// (e.g. "model.layers.3.self_attn.qkv_proj.weight", "model.layers.3.mlp.experts.w13_weight",
/// "decoder.layers.3.self_attention.linear_qkv.weight"). Megatron names a routed expert's
/// buffers by its index among its group's experts (`mlp.experts.local_experts.{i}`):
/// `expert_groups` is the unit's tp·ep/etp.
std::string buffer_name(const ModelSpec& m, TensorId buffer, Packing packing, int expert_groups = 1);

/// Name of the scale buffer beside weight buffer `buffer` in a `dtype=fp8` unit: its
/// name with "weight" → "weight_scale_inv" ("…q_b_proj.weight_scale_inv",
/// "…mlp.experts.w13_weight_scale_inv").
std::string scale_buffer_name(const ModelSpec& m, TensorId buffer, Packing packing);

/// Whether tensors of `kind` share a local buffer with others under `packing`.
bool shares_buffer(const ModelConfig& m, TensorKind kind, Packing packing);

}  // namespace nereus
