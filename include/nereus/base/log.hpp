#pragma once
// Logs with levels: one line per event on stderr, "<program>[<rank>] <level> <component>:
// <message>". The level comes from --log-level, else the NEREUS_LOG environment variable,
// else the program's default (warn for `nereus`, info for `nereusd`). Lines are written
// whole, so lines of concurrent threads do not interleave.
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace nereus {

enum class LogLevel : int { error = 0, warn, info, debug, trace };

/// "error", "warn", "info", "debug", "trace"; throws Error naming the levels otherwise.
LogLevel parse_log_level(std::string_view text);
std::string_view to_string(LogLevel level);

/// Sets the program name and rank that prefix every line, and its default level; the
/// level then comes from NEREUS_LOG when set (a bad value is an error naming it).
void init_logging(std::string program, int rank, LogLevel fallback);
void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(log_level()); }

/// Writes one line if `level` is enabled.
void log_line(LogLevel level, std::string_view component, std::string_view message);

template <class... A>
void log(LogLevel level, std::string_view component, fmt::format_string<A...> f, A&&... a) {
  if (log_enabled(level)) log_line(level, component, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace nereus
