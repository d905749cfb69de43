#pragma once
// Tensor lists from checkpoints: a safetensors header or a model.safetensors.index.json,
// checked against the list a config implies.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nereus/core/model.hpp"

namespace nereus {

/// One tensor as a checkpoint lists it. Shape and dtype are absent when only an index
/// (names → shard files) was available.
struct CheckpointTensor {
  std::string name;
  std::optional<std::string> dtype;          ///< safetensors dtype, e.g. "BF16"
  std::optional<std::vector<std::int64_t>> shape;
  std::string file;                          ///< file that holds it
};

/// Reads the header of one .safetensors file; throws Error on a malformed header or
/// offsets that overrun the file.
std::vector<CheckpointTensor> read_safetensors_header(const std::string& path);

/// Reads a .safetensors file or a model.safetensors.index.json (whose shard files are
/// read too when they sit beside it).
std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path);

/// Throws Error naming the first mismatch between the checkpoint and the model's
/// tensor list (missing, unexpected, shape, dtype).
void check_checkpoint(const ModelSpec& model, const std::vector<CheckpointTensor>& tensors);

}  // namespace nereus
