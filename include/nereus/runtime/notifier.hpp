#pragma once
// A condition variable for coroutines on one executor: wait() suspends until the next
// notify(); waiters re-check their condition after waking.
#include "nereus/base/asio.hpp"

namespace nereus {

class Notifier {
 public:
  explicit Notifier(asio::any_io_executor ex) : timer_(ex) { timer_.expires_at(asio::steady_timer::time_point::max()); }
  /// Suspends until notify(); throws asio's operation_aborted if the waiting coroutine is
  /// cancelled meanwhile.
  asio::awaitable<void> wait();
  /// Wakes every waiter.
  void notify() { timer_.cancel(); }
  asio::any_io_executor executor() { return timer_.get_executor(); }

 private:
  asio::steady_timer timer_;
};

}  // namespace nereus
