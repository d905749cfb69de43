#include "nereus/core/bytes.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {
std::string format(double v, const char* unit) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, unit);
  return buf;
}
}  // namespace

std::size_t parse_capacity(std::string_view text) {
  const std::string t(text);
  double value = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
  if (ec != std::errc() || p == t.data() || !(value > 0))
    throw Error("capacity '" + t + "' is not a positive size (examples: 2GiB, 512MiB, 1000000)");
  const std::string unit(p, t.data() + t.size());
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kB" || unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else throw Error("capacity '" + t + "' has unknown unit '" + unit + "' (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)");
  const double bytes = value * mult;
  if (bytes > 1.2e15) throw Error("capacity '" + t + "' is too large");
  return static_cast<std::size_t>(std::llround(bytes));
}


std::string human_bytes(std::uint64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1e12) return format(v / 1e12, "TB");
  if (v >= 1e9) return format(v / 1e9, "GB");
  if (v >= 1e6) return format(v / 1e6, "MB");
  if (v >= 1e3) return format(v / 1e3, "kB");
  return std::to_string(b) + " B";
}

}  // namespace nereus
