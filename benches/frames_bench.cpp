// The control plane's cost of frame integrity: heartbeat-sized frames (a node with 8
// devices) one way, and request/answer round trips, over a loopback TCP connection in one
// process, clear and tagged (HMAC-SHA256 per frame, docs/cluster.md "Security"), measured
// alternately in the same run. Medians of --repeat rounds.
//   frames_bench [--repeat N] [--smoke] [--json]
#include <fmt/format.h>

#include <boost/asio/ip/tcp.hpp>

#include "bench_args.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/channel.hpp"

using namespace nereus;
using namespace nereus::cluster;

namespace {

struct Pair {
  asio::io_context io;
  std::optional<Channel> a, b;
  explicit Pair(bool tagged) {
    tcp::acceptor acc(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    tcp::socket s(io);
    s.connect(acc.local_endpoint());
    s.set_option(tcp::no_delay(true));
    b.emplace(acc.accept());
    a.emplace(std::move(s));
    if (tagged) {
      const SessionKeys k = session_keys("a-token-for-the-frames-bench", random_nonce(), random_nonce());
      a->protect(k.client_to_server, k.server_to_client);
      b->protect(k.server_to_client, k.client_to_server);
    }
  }
};

Heartbeat beat() {
  Heartbeat h{1, {}, 123456789, 0, 40000};
  for (std::uint32_t d = 0; d < 8; ++d) h.devices.push_back({d, 80ull << 30, 1ull << 30, 2ull << 30});
  return h;
}

/// Frames per second, one way: `n` heartbeats sent while the other end reads them.
double one_way(bool tagged, int n) {
  Pair p(tagged);
  const Envelope e{kProtocolVersion, 1, 0, beat()};
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(p.io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) co_await p.a->send(e);
  }, asio::detached);
  int got = 0;
  asio::co_spawn(p.io, [&]() -> asio::awaitable<void> {
    for (; got < n; ++got) (void)co_await p.b->receive(Millis(5000));
  }, asio::detached);
  p.io.run();
  return got / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Round trips per second: a heartbeat and its answer, one at a time.
double round_trips(bool tagged, int n) {
  Pair p(tagged);
  int done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(p.io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) {
      const Envelope e = co_await p.b->receive(Millis(5000));
      co_await p.b->reply(e.request_id, Heartbeat{1, {}, 5, 0, -1});
    }
  }, asio::detached);
  asio::co_spawn(p.io, [&]() -> asio::awaitable<void> {
    for (; done < n; ++done) (void)co_await p.a->call(beat(), Millis(5000));
  }, asio::detached);
  p.io.run();
  return done / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args = bench::parse_args(argc, argv, "frames_bench");
  const int n = args.repeat <= 3 ? 2000 : 20000;
  std::vector<double> clear, tagged, clear_rt, tagged_rt;
  for (int r = 0; r < args.repeat; ++r) {  // alternate, so drift on the machine hits both alike
    clear.push_back(one_way(false, n));
    tagged.push_back(one_way(true, n));
    clear_rt.push_back(round_trips(false, n / 4));
    tagged_rt.push_back(round_trips(true, n / 4));
  }
  const double c = bench::median(clear), t = bench::median(tagged), crt = bench::median(clear_rt), trt = bench::median(tagged_rt);
  if (args.json)
    fmt::print("{{\"frames_per_second_clear\":{:.0f},\"frames_per_second_tagged\":{:.0f},\"ratio\":{:.3f},"
               "\"round_trips_per_second_clear\":{:.0f},\"round_trips_per_second_tagged\":{:.0f},\"round_trip_ratio\":{:.3f}}}\n",
               c, t, t / c, crt, trt, trt / crt);
  else
    fmt::print("one way: {:.0f} frames/s clear, {:.0f} tagged ({:.2f}x)\nround trips: {:.0f}/s clear, {:.0f} tagged ({:.2f}x)\n", c,
               t, t / c, crt, trt, trt / crt);
  return 0;
}
