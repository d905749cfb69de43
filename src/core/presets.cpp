#include "nereus/core/presets.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nereus/base/error.hpp"
#include "presets_table.hpp"

namespace nereus {

std::optional<std::string_view> find_preset(PresetKind kind, std::string_view name) {
  for (std::size_t i = 0; i < detail::kPresetCount; ++i) {
    const auto& e = detail::kPresets[i];
    if (e.kind == kind && e.name == name) return e.text;
  }
  return std::nullopt;
}

std::vector<std::string> preset_names(PresetKind kind) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < detail::kPresetCount; ++i)
    if (detail::kPresets[i].kind == kind) names.emplace_back(detail::kPresets[i].name);
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error("cannot read '" + path + "'");
  return ss.str();
}

std::string read_file_or_preset(PresetKind kind, std::string_view arg, std::string_view what) {
  std::error_code ec;
  const std::string path(arg);
  if (std::filesystem::is_regular_file(path, ec)) return read_text_file(path);
  if (auto text = find_preset(kind, arg)) return std::string(*text);
  std::string known;
  for (const auto& n : preset_names(kind)) known += (known.empty() ? "" : ", ") + n;
  throw Error(std::string(what) + " '" + path + "' is neither a file nor a preset (presets: " +
              known + ")");
}

}  // namespace nereus
