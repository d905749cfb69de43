#include "nereus/base/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};
std::mutex g_mutex;  // guards the prefix
std::string g_prefix = "nereus";
}  // namespace

LogLevel parse_log_level(std::string_view text) {
  for (LogLevel l : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug, LogLevel::trace})
    if (text == to_string(l)) return l;
  throw Error("log level '" + std::string(text) + "' is not one of error, warn, info, debug, trace");
}

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
    case LogLevel::trace: return "trace";
  }
  return "?";
}

void init_logging(std::string program, int rank, LogLevel fallback) {
  {
    const std::lock_guard lock(g_mutex);
    g_prefix = rank >= 0 ? program + "[" + std::to_string(rank) + "]" : std::move(program);
  }
  LogLevel level = fallback;
  if (const char* env = std::getenv("NEREUS_LOG"); env && *env) {
    try {
      level = parse_log_level(env);
    } catch (const Error& e) {
      throw Error(std::string("NEREUS_LOG: ") + e.what());
    }
  }
  set_log_level(level);
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void log_line(LogLevel level, std::string_view component, std::string_view message) {
  if (!log_enabled(level)) return;
  std::string line;
  {
    const std::lock_guard lock(g_mutex);
    line = g_prefix;
  }
  line += ' ';
  line += to_string(level);
  line += ' ';
  line += component;
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: whole lines
  std::fflush(stderr);
}

}  // namespace nereus
