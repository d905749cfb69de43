#include "nereus/transport/chaos.hpp"

#include <chrono>

namespace nereus {

asio::awaitable<Status> ChaosTransport::post(DescriptorList list) {
  const std::int64_t n = posts_++;
  if (options_.max_delay_seconds > 0) {
    const double d = std::uniform_real_distribution<double>(0, options_.max_delay_seconds)(rng_);
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(d)));
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return Status{StatusCode::cancelled, "cancelled while delayed"};
  }
  if (n == options_.fail_post) co_return Status{StatusCode::io_error, "injected failure of post " + std::to_string(n)};
  co_return co_await inner_.post(std::move(list));
}

}  // namespace nereus
