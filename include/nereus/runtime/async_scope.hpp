#pragma once
// An async scope: coroutines spawned into it are joined before it goes away, so no
// detached coroutine outlives what it uses (style.md, after folly::coro and Seastar).
// One scope belongs to one executor and is used from that executor's thread.
#include <chrono>
#include <exception>
#include <utility>
#include <list>

#include "nereus/base/asio.hpp"

namespace nereus {

/// Spawn coroutines; join() them all before destruction (checked).
class AsyncScope {
 public:
  explicit AsyncScope(asio::any_io_executor ex);
  AsyncScope(const AsyncScope&) = delete;
  AsyncScope& operator=(const AsyncScope&) = delete;
  /// Aborts the process if coroutines are still running: join() first.
  ~AsyncScope();

  /// Starts `work` on the scope's executor.
  void spawn(asio::awaitable<void> work);
  /// Requests cancellation of every running coroutine (they see it at their next
  /// cancellable wait, in-flight transfers included). A child may call it: it cancels
  /// itself too, and once it ends its outcome still reaches join().
  void cancel();
  /// Completes when every spawned coroutine has finished; rethrows the first exception
  /// one of them ended with. Cancelling the caller while it joins cancels the children,
  /// and the join still waits for them.
  asio::awaitable<void> join();
  /// join(), if every coroutine finishes within `limit`; false (nothing joined) when one
  /// is still running then, such as a transfer that would not stop.
  asio::awaitable<bool> join_within(std::chrono::milliseconds limit);
  std::size_t pending() const { return pending_; }

 private:
  asio::any_io_executor ex_;
  asio::steady_timer idle_;
  struct Child {
    asio::cancellation_signal signal;
    bool finished = false;
  };
  void prune();
  // A finished child's signal is freed later, never inside its own completion.
  std::list<Child> children_;
  std::size_t pending_ = 0;
  std::exception_ptr error_;
};

}  // namespace nereus
