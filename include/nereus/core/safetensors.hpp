#pragma once
// Tensor lists from checkpoints: a safetensors header or a model.safetensors.index.json,
// checked against the list a config implies.
#include <array>
#include <functional>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nereus/core/dtype.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// One tensor as a checkpoint lists it. Shape and dtype are absent when only an index
/// (names → shard files) was available.
struct CheckpointTensor {
  std::string name;
  std::optional<std::string> dtype;          ///< safetensors dtype, e.g. "BF16"
  std::optional<std::vector<std::int64_t>> shape;
  std::string file;                          ///< file that holds it
  std::uint64_t offset = 0;                  ///< first data byte in the file (header read only)
};

/// safetensors dtype name of an element type ("BF16", "F16", "F32"), and back (nullopt
/// for a dtype no slot has).
std::string safetensors_dtype(DType t);
std::optional<DType> parse_safetensors_dtype(const std::string& name);

/// Converts n elements between element types (bf16 and f16 rounded to nearest even).
void convert_elements(DType from, const std::byte* in, DType to, std::byte* out, std::size_t n);

/// One tensor to write: name, element type, shape, and a function that writes its bytes
/// (row-major, `bytes` long) into `out`.
struct SafetensorsOut {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::function<void(std::byte* out, std::size_t bytes)> write;
};

/// Writes a .safetensors file one tensor at a time (memory: the largest tensor), to
/// PATH.tmp then renamed, so a failure leaves no half-written PATH. Throws Error.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors);

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
