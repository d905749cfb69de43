#pragma once
// The table written by scripts/embed_presets.py at build time.
#include <cstddef>
#include <string_view>

#include "nereus/core/presets.hpp"

namespace nereus::detail {
struct PresetEntry {
  PresetKind kind;
  std::string_view name;
  std::string_view text;
};
extern const PresetEntry kPresets[];
extern const std::size_t kPresetCount;
}  // namespace nereus::detail
