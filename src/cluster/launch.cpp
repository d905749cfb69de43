#include "nereus/cluster/launch.hpp"

#include <charconv>

#include "nereus/base/error.hpp"

namespace nereus::cluster {

namespace {

int parse_int(const char* text, const std::string& what) {
  const std::string s = text;
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) throw Error(what + " is not an integer: '" + s + "'");
  return v;
}

}  // namespace

Endpoint parse_endpoint(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw Error(what + " must be HOST:PORT, got '" + text + "'");
  Endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  int port = 0;
  const auto ps = text.substr(colon + 1);
  const auto [p, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
  if (ec != std::errc() || p != ps.data() + ps.size() || port < 0 || port > 65535)
    throw Error(what + ": port '" + ps + "' is not in 0..65535");
  e.port = static_cast<unsigned short>(port);
  return e;
}

Launch resolve_launch(const LaunchArgs& a, const GetEnv& env) {
  Launch l;
  l.listen = parse_endpoint(a.listen.empty() ? "127.0.0.1:0" : a.listen, "--listen");
  if (a.coordinator_mode) {
    if (a.node_rank && *a.node_rank != 0) throw Error("--coordinator-mode is node 0; --node-rank " + std::to_string(*a.node_rank) + " contradicts it");
    if (!a.nodes) throw Error("--coordinator-mode needs --nodes K");
    l.source = "arguments";
    l.coordinator = true;
    l.node_rank = 0;
    l.nodes = *a.nodes;
    if (a.listen.empty()) throw Error("--coordinator-mode needs --listen HOST:PORT (the address nodes join)");
    l.coordinator_at = l.listen;
  } else if (a.node_rank) {
    if (!a.nodes) throw Error("--node-rank needs --nodes K");
    if (a.coordinator.empty()) throw Error("--node-rank needs --coordinator HOST:PORT");
    l.source = "arguments";
    l.node_rank = *a.node_rank;
    l.nodes = *a.nodes;
    l.coordinator_at = parse_endpoint(a.coordinator, "--coordinator");
    l.coordinator = l.node_rank == 0;  // as under a launcher: rank 0 listens on the coordinator's address
    if (l.coordinator) l.listen = l.coordinator_at;
  } else {
    const char* rank = nullptr;
    const char* size = nullptr;
    if ((rank = env("OMPI_COMM_WORLD_RANK"))) {
      size = env("OMPI_COMM_WORLD_SIZE");
      l.source = "mpirun";
    } else if ((rank = env("SLURM_PROCID"))) {
      size = env("SLURM_NTASKS");
      l.source = "srun";
    } else if ((rank = env("RANK"))) {
      size = env("WORLD_SIZE");
      l.source = "torchrun";
    } else {
      throw Error("no place in the job: pass --coordinator-mode, or --coordinator HOST:PORT --node-rank R --nodes K, "
                  "or start under mpirun, srun or torchrun");
    }
    if (!size) throw Error(l.source + " set the rank but not the world size");
    l.node_rank = parse_int(rank, l.source + " rank");
    l.nodes = parse_int(size, l.source + " world size");
    if (a.nodes && *a.nodes != l.nodes)
      throw Error("--nodes " + std::to_string(*a.nodes) + " but " + l.source + " started " + std::to_string(l.nodes));
    std::string at = a.coordinator;
    if (at.empty() && env("MASTER_ADDR") && env("MASTER_PORT")) at = std::string(env("MASTER_ADDR")) + ":" + env("MASTER_PORT");
    if (at.empty()) throw Error("under " + l.source + ", pass --coordinator HOST:PORT (rank 0 listens there) or set MASTER_ADDR and MASTER_PORT");
    l.coordinator_at = parse_endpoint(at, "--coordinator");
    l.coordinator = l.node_rank == 0;
    if (l.coordinator) l.listen = l.coordinator_at;
  }
  if (l.nodes < 1) throw Error("the node count must be at least 1, got " + std::to_string(l.nodes));
  if (l.node_rank < 0 || l.node_rank >= l.nodes)
    throw Error("node rank " + std::to_string(l.node_rank) + " is outside 0.." + std::to_string(l.nodes - 1));
  if (l.coordinator_at.port == 0 && !l.coordinator) throw Error("--coordinator needs a port, not 0");
  return l;
}

}  // namespace nereus::cluster
