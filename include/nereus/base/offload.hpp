#pragma once
// Work run off an event loop: filling, checking, quantizing and dumping gigabytes must not
// stall a daemon's heartbeats and other sessions, nor a job's running steps.
#include <boost/asio/thread_pool.hpp>
#include <type_traits>

#include "nereus/base/asio.hpp"

namespace nereus {

class Offload {
 public:
  /// Runs `f` on the helper thread and resumes on the caller's executor.
  /// (Named locals only around co_await: GCC 12 destroys some temporaries there twice.)
  template <class F>
  asio::awaitable<std::invoke_result_t<F>> operator()(F f) {
    auto work = [f = std::move(f)]() -> asio::awaitable<std::invoke_result_t<F>> { co_return f(); };
    auto result = co_await asio::co_spawn(helper_.get_executor(), std::move(work), asio::use_awaitable);
    co_return result;
  }

 private:
  asio::thread_pool helper_{1};
};

}  // namespace nereus
