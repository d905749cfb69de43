#pragma once
// `nereus bench transition`: fill the source shards, run a transition for real R times,
// time it, verify and dump the destination shards (interfaces.md).
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/participant.hpp"

namespace nereus::bench {

using json = nlohmann::json;

/// The bench's settings: the reshard, plus how to run and report it.
struct TransitionConfig : ReshardSpec {
  /// local | ucx | ucx-tag (two_sided set to match) | auto: each link the path that
  /// reaches it (runtime link_path): copies inside a process; across, UCX gets (CUDA IPC
  /// gets for GPU memory) | cuda: GPU memory, cuda copies, CUDA IPC gets across | nccl:
  /// GPU memory, every link between processes (in one process: every link) as NCCL
  /// messages in grouped rounds.
  std::string transport = "local";
  std::string memory = "host";  ///< host | cuda: where the units live (`cuda` set to match)
  /// Machines emulated on this one: worker r of procs is on machine r·nodes/procs, and CUDA
  /// IPC reaches only its own machine's workers; links across take `across`.
  int nodes = 1;
  std::string across = "ucx";  ///< ucx (tagged messages, GPU memory staged) | nccl
  /// The machine of worker `rank` (its CUDA IPC identity; empty with one node).
  std::string machine_of(int rank) const { return nodes > 1 ? "node" + std::to_string(rank * nodes / procs) : ""; }
  /// One process, and every link between its devices through UCX (--transport ucx or
  /// ucx-tag) or NCCL: what the bench measures of them without a second process.
  bool every_link_remote() const {
    return procs == 1 && daemons.empty() && (transport == "ucx" || transport == "ucx-tag" || transport == "nccl");
  }
  int procs = 1;
  int repeat = 3;
  bool verify = false;
  std::string dump_dir;
  std::string perfetto;  ///< write the last run's transfers as a Perfetto timeline here
  std::string plot;      ///< write the last run's bandwidth per link over time as SVG here
  bool json = false;
  bool quiet = false;  ///< no progress line (also with json)
  double timeout_seconds = 300;
  int kill_worker = -1;  ///< fault injection: this worker dies during the first run
  std::string daemons;     ///< HOST:PORT of a nereusd coordinator: run across the daemons
  std::string token_file;  ///< with daemons
  int kill_node = -1;      ///< fault injection: this node's daemon dies during the first run
  // Set in worker processes only.
  int worker_rank = -1;
  int control_fd = -1;
};

using Prepared = PreparedReshard;

/// prepare_reshard() after checking the bench's own flags.
Prepared prepare(const TransitionConfig& c);
/// Host memory the units of `p` take on this machine (sources, plus targets not kept in
/// their source's buffer), against what it has free: one clear error instead of the
/// kernel's OOM killer mid-fill. For the benches whose processes all run here.
void check_host_memory(const Prepared& p);
/// This machine's memcpy bandwidth in GB/s (10^9 B/s) with `threads` threads.
double memcpy_gbps(unsigned threads);
/// A run's transfers as JSON, [[src, dst, bytes, start, end], ...] (seconds from the run's
/// start), as they travel from worker processes to the parent.
json timings_json(const std::vector<TransferTiming>& timings);
/// Whether the last run's transfers are wanted (--perfetto or --plot).
inline bool wants_timings(const TransitionConfig& c) { return !c.perfetto.empty() || !c.plot.empty(); }

/// How the bench's executors moved each transfer, by the rule they bind with: "local copy"
/// inside a device, "local" between devices one process owns (one node with --daemons),
/// "ucx" between processes, or between any two devices of one process with --transport ucx
/// (which sends its links through UCX).
struct TransferLabels {
  std::function<int(int)> owner;  ///< device → the process (node) that owns it
  bool links_remote = false;      ///< every link through the remote transport
  TransportNames names;
  std::function<int(int)> machine = [](int) { return 0; };  ///< process → its (emulated) machine
  std::string operator()(int src, int dst) const;
};
/// The labels for a run of `c` over `p`'s devices. With --daemons, `devices_per_node` and
/// each node's machine (node rank → machine index, from the coordinator's report).
TransferLabels transfer_labels(const TransitionConfig& c, const Prepared& p, int devices_per_node = 0,
                               std::map<int, int> machines = {});
/// {transport: {bytes, gbps}} of the last run's transfers; GB/s over the span from the
/// transport's first transfer's start to its last one's end.
json transports_json(const TransferLabels& labels, const std::map<int, json>& timings);
/// Writes the last run's transfers where the flags ask. --perfetto: a Perfetto timeline, a
/// track per destination device and one per link (source → destination), each transfer
/// with its bytes, transport and the reshard it belongs to. --plot: an SVG of each link's
/// GB/s over the run. `timings`: per process (rank → timings_json); the processes' clocks
/// are taken as aligned at the run's start (the parent starts them together).
void write_transfer_outputs(const TransitionConfig& c, const TransferLabels& labels, const std::map<int, json>& timings);
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
