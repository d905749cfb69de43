#include "nereus/base/svg.hpp"

#include <algorithm>

namespace nereus::svg {

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? std::string("&lt;") : c == '>' ? std::string("&gt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
  return o;
}

std::size_t glyphs(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string clip(const std::string& s, std::size_t n) {
  if (glyphs(s) <= n) return s;
  std::size_t count = 0, i = 0;
  for (; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && count++ == n - 1) break;
  return s.substr(0, i) + "…";
}

std::vector<std::string> fit_title(const std::string& title, std::size_t width) {
  if (glyphs(title) <= width) return {title};
  std::size_t cut = std::string::npos;
  for (std::size_t at = title.find(" · "); at != std::string::npos; at = title.find(" · ", at + 1))
    if (glyphs(title.substr(0, at)) <= width) cut = at;
  if (cut == std::string::npos) return {clip(title, width)};
  return {title.substr(0, cut), clip(title.substr(cut + std::string(" · ").size()), width)};
}

const char* colour(std::size_t i) {
  static const char* const kColours[] = {"#236", "#d33", "#2a7", "#e80", "#85c", "#0aa", "#777", "#a52", "#5a5", "#c4a"};
  return kColours[i % (sizeof kColours / sizeof kColours[0])];
}

}  // namespace nereus::svg
