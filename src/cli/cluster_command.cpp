// `nereus cluster status`: what the coordinator knows of the job's nodes.
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "nereus/core/error.hpp"
#ifdef NEREUS_HAVE_CLUSTER
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/launch.hpp"
#include "nereus/core/bytes.hpp"
#endif

namespace nereus::cli {

namespace {

struct ClusterArgs {
  std::string coordinator, token_file;
  int timeout_ms = 5000;
  bool json = false;
};

#ifdef NEREUS_HAVE_CLUSTER
using namespace nereus::cluster;

ClusterStatus fetch_status(const ClusterArgs& a) {
  const Endpoint at = parse_endpoint(a.coordinator, "--coordinator");
  const std::string token = load_token(a.token_file);
  asio::io_context io;
  ClusterStatus out;
  std::exception_ptr err;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Channel ch(co_await connect_to(at.host, at.port, Millis(a.timeout_ms)));
    ch.set_peer(at.str());
    const Hello hello{Role::client, -1, 0, {}};
    co_await authenticate_as_client(ch, token, hello, Millis(a.timeout_ms));
    Body ask = StatusRequest{};
    Envelope r = co_await ch.call(std::move(ask), Millis(a.timeout_ms));
    if (auto* e = std::get_if<ErrorReply>(&r.body)) throw Error(at.str() + ": " + e->message);
    auto* s = std::get_if<ClusterStatus>(&r.body);
    if (!s) throw Error(at.str() + " answered status with " + kind_name(r.body));
    out = *s;
    ch.close();
  }, [&](std::exception_ptr e) { err = e; });
  io.run();
  if (err) std::rethrow_exception(err);
  return out;
}

void run_status(const ClusterArgs& a) {
  const ClusterStatus s = fetch_status(a);
  int alive = 0;
  for (const auto& m : s.members) alive += m.alive;
  if (a.json) {
    nlohmann::json members = nlohmann::json::array();
    for (const auto& m : s.members) {
      nlohmann::json devs = nlohmann::json::array();
      for (const auto& d : m.devices) devs.push_back({{"id", d.id}, {"capacity", d.capacity}, {"used", d.used}, {"peak", d.peak}});
      members.push_back({{"rank", m.rank}, {"alive", m.alive}, {"listen", m.listen}, {"pid", m.pid},
                         {"ms_since_heartbeat", m.ms_since_heartbeat}, {"heartbeats", m.heartbeats}, {"joins", m.joins},
                         {"devices", devs}});
    }
    std::cout << nlohmann::json{{"nodes", s.nodes}, {"alive", alive}, {"members", members}}.dump() << "\n";
    return;
  }
  std::cout << fmt::format("{} of {} nodes alive\n", alive, s.nodes);
  std::cout << fmt::format("{:>4} {:<6} {:<22} {:>8} {:>10} {:>6} {:>8}\n", "rank", "state", "listen", "pid", "heartbeat", "joins", "devices");
  for (const auto& m : s.members)
    std::cout << fmt::format("{:>4} {:<6} {:<22} {:>8} {:>8} ms {:>6} {:>8}\n", m.rank, m.alive ? "alive" : "lost", m.listen, m.pid,
                             m.ms_since_heartbeat, m.joins, m.devices.size());
}
#else
void run_status(const ClusterArgs&) {
  throw Error("this nereus was built without the control plane (Cap'n Proto and OpenSSL were not found)");
}
#endif

}  // namespace

void add_cluster_command(CLI::App& app) {
  auto a = std::make_shared<ClusterArgs>();
  CLI::App* cmd = app.add_subcommand("cluster", "Talk to running nereusd daemons");
  cmd->require_subcommand(1);
  CLI::App* status = cmd->add_subcommand("status", "The nodes the coordinator knows, alive or lost");
  status->add_option("--coordinator", a->coordinator, "HOST:PORT of the coordinator")->required();
  status->add_option("--token-file", a->token_file, "file with the shared secret; else $NEREUS_TOKEN");
  status->add_option("--timeout-ms", a->timeout_ms, "give up after this long (default 5000)");
  status->add_flag("--json", a->json, "print one JSON object");
  status->callback([a] { run_status(*a); });
}

}  // namespace nereus::cli
