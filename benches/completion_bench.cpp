// Runtime overhead: empty transfers posted to the local transport and awaited, one
// coroutine on one io_context thread. Each goes through async_initiate, a posted
// completion and the coroutine's resumption.
//   completion_bench [--smoke]
#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "nereus/transport/local.hpp"

using namespace nereus;

namespace {
asio::awaitable<int> loop(LocalTransport& t, int n) {
  int ok = 0;
  for (int i = 0; i < n; ++i) ok += (co_await t.post(DescriptorList{})).is_ok();
  co_return ok;
}
}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && !std::strcmp(argv[1], "--smoke");
  const int n = smoke ? 20000 : 2000000;
  LocalTransport t({1, 1 << 20});
  asio::io_context io(1);
  int ok = 0;
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(io, loop(t, n), [&](std::exception_ptr, int v) { ok = v; });
  io.run();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{{\"completions\":{},\"seconds\":{:.4f},\"per_second\":{:.0f}}}\n", ok, s, ok / s);
  return ok == n ? 0 : 1;
}
