// nereusd: one daemon per node (interfaces.md, "nereusd").
#include <CLI/CLI.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>

#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/daemon.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"

using namespace nereus;
using namespace nereus::cluster;

namespace {

struct Args {
  LaunchArgs launch;
  int node_rank = -1, nodes = -1;
  std::string token_file, devices = "host:1", metrics, advertise, machine;
  int heartbeat_ms = 250, dead_after_ms = 1500, handshake_ms = 5000, join_timeout_ms = 60000;
  std::uint32_t frame_cap = kDefaultFrameCap;
};

/// "host:N[:CAPACITY]" or "cuda:N[:CAPACITY]".
void parse_devices(const std::string& text, DaemonOptions& o) {
  const auto bad = [&] {
    return Error("--devices must be host:N[:CAPACITY] or cuda:N[:CAPACITY] (like host:4:2GiB), got '" + text + "'");
  };
  const bool cuda = text.rfind("cuda:", 0) == 0;
  if (text.rfind("host:", 0) != 0 && !cuda) throw bad();
  o.device_kind = cuda ? MemoryKind::cuda : MemoryKind::host;
  const std::string rest = text.substr(5);
  const auto colon = rest.find(':');
  const std::string count = rest.substr(0, colon);
  if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos || count.size() > 4) throw bad();
  o.devices = std::stoi(count);
  if (o.devices < 1) throw Error("--devices: at least one device, got " + count);
  if (colon != std::string::npos) o.device_capacity = parse_capacity(rest.substr(colon + 1));
}

int run(const Args& a) {
  DaemonOptions o;
  LaunchArgs l = a.launch;
  if (a.node_rank >= 0) l.node_rank = a.node_rank;
  if (a.nodes >= 0) l.nodes = a.nodes;
  o.launch = resolve_launch(l, [](const char* k) { return std::getenv(k); });
  o.token = load_token(a.token_file);
  parse_devices(a.devices, o);
  if (!a.machine.empty() && o.device_kind != MemoryKind::cuda) throw Error("--machine names the machine CUDA IPC sees: it needs --devices cuda:N");
  o.machine = a.machine;
  if (!a.metrics.empty()) o.metrics = parse_endpoint(a.metrics, "--metrics");
  if (!a.advertise.empty()) o.advertise = parse_endpoint(a.advertise, "--advertise");
  if (a.heartbeat_ms < 1 || a.dead_after_ms <= a.heartbeat_ms)
    throw Error("--dead-after-ms must exceed --heartbeat-ms, and both be positive");
  o.heartbeat_every = Millis(a.heartbeat_ms);
  o.dead_after = Millis(a.dead_after_ms);
  o.handshake_limit = Millis(a.handshake_ms);
  o.join_limit = Millis(a.join_timeout_ms);
  o.frame_cap = a.frame_cap;

  asio::io_context io;
  Daemon d(io, o);
  d.bind();
  const std::string node = "node " + std::to_string(o.launch.node_rank);
  log(LogLevel::info, node, "{} of {} nodes (from {}), listening on {}{}, {} {}devices of {}", o.launch.coordinator ? "coordinator" : "node",
      o.launch.nodes, o.launch.source, d.listening().str(), d.metrics_listening() ? ", metrics on " + d.metrics_listening()->str() : "",
      o.devices, o.device_kind == MemoryKind::cuda ? "CUDA " : "", human_bytes(o.device_capacity));
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) d.stop();
  });
  std::string error;
  asio::co_spawn(io, d.run(), [&](std::exception_ptr e) {
    signals.cancel();
    io.stop();  // a transfer left behind on a dead peer must not keep the process alive
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      error = x.what();
    }
  });
  io.run();
  if (!error.empty()) {
    log(LogLevel::error, node, "{}", error);
    return 1;
  }
  log(LogLevel::info, node, "stopped");
  if (d.stuck()) {
    // A transfer that would not stop still references its coroutines and memory: end here
    // rather than destroy them under it.
    log(LogLevel::warn, node, "leaving a transfer that would not stop behind");
    std::_Exit(0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("nereusd: the Nereus daemon, one per node");
  Args a;
  app.add_option("--listen", a.launch.listen, "HOST:PORT to serve on (default 127.0.0.1:0; the coordinator needs one)");
  app.add_option("--advertise", a.advertise, "HOST:PORT the other daemons reach this one at, when not --listen's (NAT, a proxy)");
  app.add_option("--token-file", a.token_file, "file with the shared secret (mode 600); else $NEREUS_TOKEN");
  app.add_option("--devices", a.devices, "host:N[:CAPACITY] or cuda:N[:CAPACITY] (device i on GPU i mod the GPUs present), the node's devices (default host:1, 1GiB each)");
  app.add_option("--machine", a.machine, "with --devices cuda:N: a name added to this machine's identity as CUDA IPC sees it; daemons "
                                         "whose names differ move GPU memory between them over UCX only, as across machines (tests)");
  app.add_flag("--coordinator-mode", a.launch.coordinator_mode, "be the coordinator (node 0)");
  app.add_option("--coordinator", a.launch.coordinator, "HOST:PORT of the coordinator");
  app.add_option("--node-rank", a.node_rank, "this node's rank (0..K-1)");
  app.add_option("--nodes", a.nodes, "number of nodes K");
  app.add_option("--metrics", a.metrics, "HOST:PORT for the Prometheus endpoint");
  app.add_option("--heartbeat-ms", a.heartbeat_ms, "heartbeat period (default 250)");
  app.add_option("--dead-after-ms", a.dead_after_ms, "silence after which a node is lost (default 1500)");
  app.add_option("--handshake-ms", a.handshake_ms, "time a connection has to authenticate (default 5000)");
  app.add_option("--join-timeout-ms", a.join_timeout_ms, "how long a node tries to reach the coordinator (default 60000)");
  app.add_option("--frame-cap", a.frame_cap, "largest control frame accepted after authentication, bytes (default 64 MiB; 64 KiB before)");
  app.add_option("--log-level", "error | warn | info | debug | trace (default info, or $NEREUS_LOG)")
      ->each([](const std::string& v) { set_log_level(parse_log_level(v)); });
  try {
    init_logging("nereusd", -1, LogLevel::info);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nereusd: error: %s\n", e.what());
    return 1;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nereusd: error: %s\n", e.what());
    return 1;
  }
}
