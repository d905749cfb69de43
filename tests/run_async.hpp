#pragma once
// Runs one coroutine to completion on an io_context (tests are synchronous).
#include <doctest/doctest.h>

#include <exception>
#include <optional>

#include "nereus/base/asio.hpp"

namespace testing {

/// Runs `a` on `io` until it completes (the loop may hold other work, such as timers,
/// forever); rethrows what it threw.
template <class T>
T run_on(boost::asio::io_context& io, boost::asio::awaitable<T> a) {
  std::optional<T> out;
  std::exception_ptr err;
  bool done = false;
  boost::asio::co_spawn(io, std::move(a), [&](std::exception_ptr e, T v) {
    err = e;
    if (!e) out = std::move(v);
    done = true;
  });
  io.restart();
  while (!done && io.run_one() > 0) {
  }
  REQUIRE(done);
  if (err) std::rethrow_exception(err);
  return std::move(*out);
}

}  // namespace testing
