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

void AsyncScope::spawn(asio::awaitable<void> work) {
  ++pending_;
  auto sig = signals_.emplace(signals_.end());
  asio::co_spawn(ex_, std::move(work),
                 asio::bind_cancellation_slot(sig->slot(), [this, sig](std::exception_ptr e) {
                   if (e && !error_) error_ = e;
                   signals_.erase(sig);
                   if (--pending_ == 0) idle_.cancel();
                 }));
}

void AsyncScope::cancel() {
  for (auto& s : signals_) s.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> AsyncScope::join() {
  while (pending_ > 0) {
    idle_.expires_at(asio::steady_timer::time_point::max());
    co_await idle_.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace nereus
