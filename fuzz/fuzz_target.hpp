#pragma once
// What every fuzz target shares: bad input may only end in one nereus::Error. Any other
// exception escapes and libFuzzer reports it, as it reports crashes, hangs, leaks and
// sanitizer findings.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nereus/base/error.hpp"

namespace fuzz {

template <class F>
void tolerate_errors(F&& f) {
  try {
    f();
  } catch (const nereus::Error&) {
  }
}

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace fuzz
