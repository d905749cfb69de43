#pragma once
// Control-path errors: one exception type whose message names what is wrong.
#include <stdexcept>
#include <string>

namespace nereus {

/// The one error type of the control path; its message names the offending input.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace nereus
