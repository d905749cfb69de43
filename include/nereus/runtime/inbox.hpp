#pragma once
// A queue of messages from several senders, awaited with a deadline: the control side
// of a cross-process transition reads every peer's messages through one.
#include <chrono>
#include <deque>
#include <optional>

#include "nereus/base/asio.hpp"

namespace nereus {

template <class T>
class Inbox {
 public:
  using clock = std::chrono::steady_clock;
  explicit Inbox(asio::any_io_executor ex) : wake_(ex) {}
  void push(T m) {
    q_.push_back(std::move(m));
    wake_.cancel();
  }
  /// The next message, or nothing at the deadline.
  asio::awaitable<std::optional<T>> next(clock::time_point until) {
    while (q_.empty()) {
      if (clock::now() >= until) co_return std::nullopt;
      wake_.expires_at(until);
      co_await wake_.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    T m = std::move(q_.front());
    q_.pop_front();
    co_return m;
  }

 private:
  asio::steady_timer wake_;
  std::deque<T> q_;
};

}  // namespace nereus
