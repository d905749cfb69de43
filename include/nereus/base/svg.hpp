#pragma once
// Small helpers for the SVG plots the commands write (simulate --plot, bench transition
// --plot): escaped text, and titles fitted to a width.
#include <cstddef>
#include <string>
#include <vector>

namespace nereus::svg {

/// `s` with <, > and & escaped for SVG text.
std::string escape(const std::string& s);
/// Characters of UTF-8 text (not bytes).
std::size_t glyphs(const std::string& s);
/// The first `n` glyphs of `s`, with an ellipsis when it was longer.
std::string clip(const std::string& s, std::size_t n);
/// A title on at most two lines of `width` glyphs, split at the last " · " that fits.
std::vector<std::string> fit_title(const std::string& title, std::size_t width);
/// Line colours, cycled.
const char* colour(std::size_t i);

}  // namespace nereus::svg
