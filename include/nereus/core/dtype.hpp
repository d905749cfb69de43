#pragma once
// Element types of tensor slots.
#include <cstdint>
#include <string_view>

namespace nereus {

/// Element type of one slot of a tensor shard.
enum class DType : std::uint8_t { bf16, f16, f32 };

/// Bytes per element.
constexpr std::uint32_t width(DType t) { return t == DType::f32 ? 4 : 2; }

/// Short name used in manifests and JSON ("bf16", "f16", "f32").
constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
  }
  return "?";
}

}  // namespace nereus
