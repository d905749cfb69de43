#include "nereus/runtime/async_scope.hpp"

#include <cstdio>
#include <cstdlib>

namespace nereus {

AsyncScope::AsyncScope(asio::any_io_executor ex) : ex_(ex), idle_(ex) {
  idle_.expires_at(asio::steady_timer::time_point::max());
}

AsyncScope::~AsyncScope() {
  if (pending_ != 0) {
    std::fprintf(stderr, "nereus: AsyncScope destroyed with %zu coroutines still running (join() first)\n", pending_);
    std::abort();
  }
}

void AsyncScope::prune() {
  children_.remove_if([](const Child& c) { return c.finished; });
}

namespace {

/// Runs `work`, then clears the coroutine's cancellation state: a child that cancels its
/// own scope (a worker that failed stops its siblings) has cancelled itself too, and
/// asio's co_spawn, handing the result on after the body, would throw that cancellation
/// out of the event loop instead of to the handler (Boost 1.81).
asio::awaitable<void> settled(asio::awaitable<void> work) {
  std::exception_ptr e;
  try {
    co_await std::move(work);
  } catch (...) {
    e = std::current_exception();
  }
  co_await asio::this_coro::reset_cancellation_state();
  if (e) std::rethrow_exception(e);
}

}  // namespace

void AsyncScope::spawn(asio::awaitable<void> work) {
  prune();
  ++pending_;
  auto child = children_.emplace(children_.end());
  asio::co_spawn(ex_, settled(std::move(work)),
                 asio::bind_cancellation_slot(child->signal.slot(), [this, child](std::exception_ptr e) {
                   if (e && !error_) error_ = e;
                   child->finished = true;
                   if (--pending_ == 0) idle_.cancel();
                 }));
}

void AsyncScope::cancel() {
  for (auto& c : children_)
    if (!c.finished) c.signal.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> AsyncScope::join() {
  // Joining is cleanup: a parent cancelled while it joins cancels its children and still
  // waits for them, rather than leave them running on a scope about to go away. Its own
  // cancellation stays set, so its next wait after the join throws it.
  const bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  bool cancelled = false;
  for (;;) {
    const asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
    if (!cancelled && cs.cancelled() != asio::cancellation_type::none) {
      cancelled = true;
      cancel();
    }
    if (pending_ == 0) break;
    idle_.expires_at(asio::steady_timer::time_point::max());
    co_await idle_.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  co_await asio::this_coro::throw_if_cancelled(throws);
  prune();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

asio::awaitable<bool> AsyncScope::join_within(std::chrono::milliseconds limit) {
  asio::steady_timer t(ex_);
  const auto until = std::chrono::steady_clock::now() + limit;
  while (pending_ > 0 && std::chrono::steady_clock::now() < until) {
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  if (pending_ > 0) co_return false;
  co_await join();
  co_return true;
}

}  // namespace nereus
