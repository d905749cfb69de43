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

/// An Error that refuses what a command was given (a config, a layout, a plan, a flag, or
/// what this machine or build cannot run) before anything ran or moved: `nereus` exits 2
/// on it, 1 on a run that failed.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

/// Runs f(); an Error it throws becomes an InputError with the same message: for the
/// steps that only read and check their input.
template <class F>
decltype(auto) refusing_input(F&& f) {
  try {
    return f();
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(e.what());
  }
}

}  // namespace nereus
