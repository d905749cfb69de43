#pragma once
// Element types of tensor slots.
#include <cstdint>
#include <string_view>

namespace nereus {

/// Element type of one slot of a tensor shard.
/// `e4m3`: float8_e4m3fn, the weights of a `dtype=fp8` unit (sharding.md, "FP8"), never a
/// model's own dtype.
enum class DType : std::uint8_t { bf16, f16, f32, e4m3 };

/// Bytes per element.
constexpr std::uint32_t width(DType t) { return t == DType::f32 ? 4 : t == DType::e4m3 ? 1 : 2; }

/// Short name used in manifests and JSON ("bf16", "f16", "f32", "f8_e4m3").
constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::e4m3: return "f8_e4m3";
  }
  return "?";
}

}  // namespace nereus
