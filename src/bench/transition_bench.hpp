#pragma once
// `nereus bench transition`: fill the source shards, run a transition for real R times,
// time it, verify and dump the destination shards (interfaces.md).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nereus/plan/reshard.hpp"

namespace nereus::bench {

struct TransitionConfig {
  std::string model, from, to;
  bool train = false;
  bool sync = false;
  std::string transport = "local";  ///< local | ucx
  int procs = 1;
  int repeat = 3;
  bool verify = false;
  std::string dump_dir;
  bool json = false;
  std::string capacity;             ///< per device, e.g. "2GiB"; empty: what it holds
  unsigned copy_threads = 2;
  unsigned per_link = 2;
  std::size_t chunk_bytes = 64 << 20;
  int gpus_per_node = 8;
  double timeout_seconds = 300;
  int kill_worker = -1;  ///< fault injection: this worker dies during the first run
  std::string daemons;     ///< HOST:PORT of a nereusd coordinator: run across the daemons
  std::string token_file;  ///< with daemons
  int kill_node = -1;      ///< fault injection: this node's daemon dies during the first run
  /// UCX peer-failure handling: detects dead peers inside UCX but rules out its shared
  /// memory transports (sysv/posix/cma lack it), so off by default on one host, where
  /// the control channel detects a dead worker.
  bool ucx_peer_errors = false;
  // Set in worker processes only.
  int worker_rank = -1;
  int control_fd = -1;
};

/// The transition to run, planned the same way in every process.
struct Prepared {
  std::shared_ptr<const ModelSpec> model;
  std::vector<Collection> sources;
  Collection target;
  ReshardPlan plan;
  std::vector<DeviceId> devices;  ///< every device of sources and target, sorted
};

Prepared prepare(const TransitionConfig& c);
/// Devices of process `rank` of `procs`: an even, contiguous split.
std::vector<DeviceId> devices_of(const std::vector<DeviceId>& all, int rank, int procs);
/// This machine's memcpy bandwidth in GB/s (10^9 B/s) with `threads` threads.
double memcpy_gbps(unsigned threads);
/// Median and minimum of run times.
std::pair<double, double> median_min(std::vector<double> v);
/// Prints the result (JSON or a readable summary); returns the exit code.
int report(const TransitionConfig& c, const Prepared& p, nlohmann::json result);

int run_single_process(const TransitionConfig& c);
int run_parent(const TransitionConfig& c, const std::string& self_exe, const std::vector<std::string>& argv);
int run_worker(const TransitionConfig& c);
/// Across running nereusd daemons (the coordinator at c.daemons).
int run_on_daemons(const TransitionConfig& c);

/// Entry point of the sub-command.
int run_transition_bench(const TransitionConfig& c, const std::vector<std::string>& argv);

}  // namespace nereus::bench
