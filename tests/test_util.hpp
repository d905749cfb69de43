#pragma once
// Small helpers shared by the doctest files.
#include <string>

#include "nereus/base/error.hpp"

namespace testing {

/// Built with AddressSanitizer (gcc's macro, or clang's feature test): the sanitizer tree
/// of scripts/test.sh, several times slower, where random loops run a prefix of the same
/// sequence.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

/// `n` cases, or `sanitized` of them under the sanitizers.
constexpr int cases(int n, int sanitized) { return kSanitized ? sanitized : n; }

/// The message of the nereus::Error that f throws, or "" if it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const nereus::Error& e) {
    return e.what();
  }
  return "";
}

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace testing
