#pragma once
// Built-in presets (model configs, clusters) compiled into the library, so a user's
// install needs no files beside it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nereus {

/// Which family of presets.
enum class PresetKind { model, cluster, job };

/// The JSON text of preset `name`, if there is one.
std::optional<std::string_view> find_preset(PresetKind kind, std::string_view name);

/// All preset names of a kind, sorted.
std::vector<std::string> preset_names(PresetKind kind);

/// Reads `arg` as a file if it exists, else as a preset name; `what` ("model",
/// "cluster", "job") words the error that lists the known presets.
std::string read_file_or_preset(PresetKind kind, std::string_view arg, std::string_view what);

/// Whole file as text; throws Error naming the path.
std::string read_text_file(const std::string& path);

}  // namespace nereus
