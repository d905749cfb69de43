#pragma once
// A type-erased, move-only completion for foreign callbacks (copy threads, UCX): it keeps
// the handler and its executor and always *posts* the result there, so no coroutine is
// resumed inside a copy thread or ucp_worker_progress. (Boost 1.81's
// any_completion_handler re-wraps itself when moved, so we erase by hand.)
#include <memory>

#include "nereus/base/asio.hpp"
#include "nereus/base/status.hpp"

namespace nereus::detail {

/// Completes one operation with a Status; call complete() once.
class Completion {
 public:
  virtual ~Completion() = default;
  /// Posts the result to the handler's executor.
  virtual void complete(Status st) = 0;
};

/// Holds the handler and tracked work on its executor, so the event loop does not run
/// out of work while the operation is in flight elsewhere.
template <class H>
class HandlerCompletion final : public Completion {
 public:
  explicit HandlerCompletion(H h)
      : handler_(std::move(h)),
        work_(asio::prefer(asio::get_associated_executor(handler_), asio::execution::outstanding_work.tracked)) {}
  void complete(Status st) override {
    auto ex = std::move(work_);
    asio::post(ex, [h = std::move(handler_), st = std::move(st)]() mutable { std::move(h)(std::move(st)); });
  }

 private:
  H handler_;
  asio::any_io_executor work_;
};

template <class Handler>
std::unique_ptr<Completion> make_completion(Handler&& h) {
  return std::make_unique<HandlerCompletion<std::decay_t<Handler>>>(std::forward<Handler>(h));
}

}  // namespace nereus::detail
