#pragma once
// How a daemon learns its place: by hand (--coordinator-mode / --coordinator, --node-rank,
// --nodes) or from the launcher that started it (mpirun, srun, torchrun). Pure: the
// environment is passed in, so tests can try every launcher.
#include <functional>
#include <optional>
#include <string>

namespace nereus::cluster {

struct Endpoint {
  std::string host;
  unsigned short port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

/// "HOST:PORT" (port 0..65535; 0 lets the system choose). Throws nereus::Error naming `what`.
Endpoint parse_endpoint(const std::string& text, const std::string& what);

/// What the command line said (empty / nullopt: not given).
struct LaunchArgs {
  bool coordinator_mode = false;
  std::string coordinator;  ///< HOST:PORT
  std::optional<int> node_rank, nodes;
  std::string listen;       ///< HOST:PORT
};

struct Launch {
  int node_rank = 0;
  int nodes = 1;
  bool coordinator = false;   ///< this daemon is the coordinator (node 0)
  Endpoint coordinator_at;    ///< where the coordinator listens
  Endpoint listen;            ///< where this daemon listens
  std::string source;         ///< "arguments", "mpirun", "srun" or "torchrun"
};

using GetEnv = std::function<const char*(const char*)>;

/// Resolves the daemon's rank, node count and addresses. Arguments win; without
/// --node-rank or --coordinator-mode the launcher's variables are read
/// (OMPI_COMM_WORLD_RANK/SIZE, SLURM_PROCID/NTASKS, RANK/WORLD_SIZE with
/// MASTER_ADDR/MASTER_PORT). Rank 0 (under a launcher, or --node-rank 0) is the
/// coordinator and listens on the coordinator address. Throws nereus::Error with one message naming what is missing or
/// inconsistent.
Launch resolve_launch(const LaunchArgs& args, const GetEnv& env);

}  // namespace nereus::cluster
