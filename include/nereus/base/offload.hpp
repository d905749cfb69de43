#pragma once
// Work run off an event loop: filling, checking, quantizing and dumping gigabytes must not
// stall a daemon's heartbeats and other sessions, nor a job's running steps.
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <type_traits>

#include "nereus/base/asio.hpp"

namespace nereus {

class Offload {
 public:
  /// Runs `f` on the helper thread (started on first use) and resumes on the caller's
  /// executor. (Named locals only around co_await: GCC 12 destroys some temporaries
  /// there twice.)
  template <class F>
  asio::awaitable<std::invoke_result_t<F>> operator()(F f) {
    if (!helper_) helper_ = std::make_unique<asio::thread_pool>(1);
    auto work = [f = std::move(f)]() -> asio::awaitable<std::invoke_result_t<F>> { co_return f(); };
    auto result = co_await asio::co_spawn(helper_->get_executor(), std::move(work), asio::use_awaitable);
    co_return result;
  }
  /// Ends the helper thread (joined here; none may be in flight): a daemon's session keeps
  /// no thread between the jobs or transitions it serves.
  void stop() { helper_.reset(); }

 private:
  std::unique_ptr<asio::thread_pool> helper_;
};

}  // namespace nereus
