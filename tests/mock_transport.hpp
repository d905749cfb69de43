#pragma once
// A transport that moves no bytes: it records what was posted, completes each post
// after a timer, and can fail or hang on request. Executor tests run against it.
#include <boost/asio/steady_timer.hpp>
#include <chrono>

#include "nereus/transport/transport.hpp"

namespace testing {

class MockTransport final : public nereus::Transport {
 public:
  explicit MockTransport(boost::asio::any_io_executor ex) : ex_(ex) {}

  std::string_view name() const override { return "mock"; }
  nereus::Capabilities capabilities() const override {
    return {true, true, true, true, memory, two_sided, grouped, strided_messages};
  }
  nereus::Registration register_memory(const nereus::MemoryRegion& r) override { return {r, {}, 0}; }

  boost::asio::awaitable<nereus::Status> post(nereus::DescriptorList list) override {
    const int n = ++posts;
    posted.push_back(list);
    if (fail_at_once) co_return nereus::Status{nereus::StatusCode::io_error, "mock failure at once"};
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    boost::asio::steady_timer t(ex_);
    t.expires_after(hang_on == n ? std::chrono::hours(1) : delay);
    auto [ec] = co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    --in_flight;
    if (ec) co_return nereus::Status{nereus::StatusCode::cancelled, "mock post cancelled"};
    if (fail_on == n) co_return nereus::Status{nereus::StatusCode::io_error, "mock failure"};
    co_return nereus::Status::ok();
  }

  /// Records the group and completes it after `delay` (moves no bytes).
  boost::asio::awaitable<nereus::Status> post_group(std::vector<nereus::DescriptorList> lists) override {
    groups.push_back(lists);
    boost::asio::steady_timer t(ex_);
    t.expires_after(delay);
    auto [ec] = co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    if (ec) co_return nereus::Status{nereus::StatusCode::cancelled, "mock group cancelled"};
    if (fail_group == static_cast<int>(groups.size())) co_return nereus::Status{nereus::StatusCode::io_error, "mock group failure"};
    co_return nereus::Status::ok();
  }

  std::vector<nereus::DescriptorList> posted;
  std::vector<std::vector<nereus::DescriptorList>> groups;
  bool grouped = false;           ///< whether it says messages go in groups
  bool strided_messages = false;  ///< whether it says it packs strided messages itself
  int fail_group = 0;             ///< group number that fails (1-based), 0 for none
  std::vector<nereus::MemoryKind> memory{nereus::MemoryKind::host};  ///< what it says it moves
  bool two_sided = false;  ///< whether it says it sends and receives tagged messages
  int posts = 0;
  int in_flight = 0;
  int max_in_flight = 0;
  int fail_on = 0;  ///< post number that fails (1-based), 0 for none
  int hang_on = 0;  ///< post number that waits until cancelled
  bool fail_at_once = false;  ///< every post fails before it suspends
  std::chrono::microseconds delay{200};

 private:
  boost::asio::any_io_executor ex_;
};

}  // namespace testing
