#pragma once
// Small helpers shared by the doctest files.
#include <string>

#include "nereus/base/error.hpp"

namespace testing {

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
