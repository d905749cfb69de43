#include "nereus/runtime/notifier.hpp"

#include <boost/system/system_error.hpp>

namespace nereus {

asio::awaitable<void> Notifier::wait() {
  // notify() cancels the timer: every wait ends with operation_aborted, which is the wake-up.
  co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
  const auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none)
    throw boost::system::system_error(asio::error::operation_aborted);
}

}  // namespace nereus
