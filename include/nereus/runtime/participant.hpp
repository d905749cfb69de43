#pragma once
// One process's part of a reshard run across processes: the units on its devices (filled
// with the verification fill), its transports (local copies and UCX on host memory; the
// cuda transport, with CUDA IPC between processes, on GPU memory) and an executor. Driven by a
// control channel — the bench's worker processes (CBOR over a Unix socket) and nereusd
// (Cap'n Proto over TCP) — through the same steps: tell the peers what to reach
// (PeerInfo), connect to theirs, run, verify, dump.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/peer_info.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/mixed.hpp"
#include "nereus/transport/nccl.hpp"
#include "nereus/transport/ucx.hpp"

namespace nereus {

/// One reshard of one model's collections, as every process of it is told.
struct ReshardSpec {
  std::string model, from, to;  ///< preset or config path; collection specs (interfaces.md)
  bool train = false;           ///< both sides carry optimizer state
  bool sync = false;            ///< a training source into an inference target (params only)
  std::string capacity;         ///< per device, e.g. "2GiB"; empty: what it holds
  unsigned copy_threads = 2;
  unsigned per_link = 2;
  std::size_t chunk_bytes = 64 << 20;
  int gpus_per_node = 8;
  /// UCX peer-failure handling: detects dead peers inside UCX but rules out its shared
  /// memory transports (sysv/posix/cma lack it), so off by default on one host, where
  /// the control channel detects a dead peer.
  bool ucx_peer_errors = false;
  /// Units in arenas UCX allocates (shared memory peers read directly: one copy per get;
  /// docs/runtime.md). The copy then runs inside UCX progress on the event loop, and a
  /// gigabyte's first run on a slow-faulting host holds the loop for seconds: a daemon,
  /// whose loop also heartbeats, turns this off until that copy moves to copy threads.
  bool shared_arenas = true;
  /// Links between processes as UCX tagged messages, sender and receiver both posting
  /// (ExecutorOptions::two_sided), instead of gets.
  bool two_sided = false;
  /// Two-sided links in rounds (ExecutorOptions::rounds), as NCCL needs; asked for here
  /// so that UCX tagged messages run the same schedule across real processes.
  bool rounds = false;
  /// Units in CUDA memory (logical device d on GPU d mod the GPUs present), copied inside
  /// a process by the cuda transport; between processes over UCX as two-sided messages
  /// staged through host memory, or, with `ipc`, by CUDA IPC gets.
  bool cuda = false;
  /// Between processes of one machine, the cuda transport's CUDA IPC gets; processes on
  /// other machines are reached by NCCL (`nccl`) or UCX tagged messages staged through host
  /// memory, in the same transition (MixedTransport). Needs `cuda`; not with two_sided.
  bool ipc = false;
  /// Between processes, NCCL sends and receives (transport/nccl.hpp) in grouped rounds:
  /// one rank per (process, GPU). Needs `cuda`. With `ipc`, NCCL takes only the links
  /// that CUDA IPC does not reach (other machines); without, every link between processes.
  bool nccl = false;
  /// This process's machine as CUDA IPC sees it (CudaTransportOptions::machine); benches
  /// emulate machines with it.
  std::string machine;
};

/// What a report calls the way each transfer moved, by the rule the participants bind
/// with (ReshardSpec's flags): the keys of the benches' and the daemons' `transports`.
struct TransportNames {
  std::string local = "local";  ///< between devices of one process: local | cuda
  std::string remote = "ucx";   ///< between processes: ucx | ucx-tag | nccl | cuda-ipc
  std::string across = "ucx";   ///< between machines, where CUDA IPC does not reach
  /// "local copy" inside a device, else by who owns the two ends.
  std::string operator()(bool same_device, bool same_process, bool same_machine) const {
    if (same_device) return "local copy";
    if (same_process) return local;
    return same_machine ? remote : across;
  }
};
TransportNames transport_names(const ReshardSpec& c);

/// The reshard to run, planned the same way in every process.
struct PreparedReshard {
  std::shared_ptr<const ModelSpec> model;
  std::vector<Collection> sources;
  Collection target;
  ReshardPlan plan;
  std::vector<DeviceId> devices;  ///< every device of sources and target, sorted
};

/// Loads the model and plans the reshard; throws Error naming a bad flag or layout.
PreparedReshard prepare_reshard(const ReshardSpec& s);
/// The figures of repeated runs every driver of a reshard reports (seconds_median,
/// seconds_min, gbps over links, copied_bytes, copy_gbps, and quantize_seconds_median when
/// the runs quantized first: their quantize passes' seconds, counted in `secs` too); `secs`
/// must not be empty.
nlohmann::json run_figures(const PreparedReshard& p, const std::vector<double>& secs, std::uint64_t copied_bytes,
                           const std::vector<double>& quantize_secs = {});
/// What a driver reports when a run failed: the first error, when the failure was known,
/// and whether every surviving process still holds intact sources.
nlohmann::json failure_figures(const std::string& error, double detected_seconds, bool sources_ok, std::size_t survivors);

/// Devices of process `rank` of `procs`: an even, contiguous split.
std::vector<DeviceId> devices_of(const std::vector<DeviceId>& all, int rank, int procs);

struct RunResult {
  bool ok = false;
  std::string error;
  ExecutionReport report;
};

class Participant {
 public:
  /// `mine`: the devices this process owns; `owner`: which process owns any device.
  Participant(asio::io_context& io, const ReshardSpec& c, const PreparedReshard& p, std::vector<DeviceId> mine, PeerId self,
              std::function<PeerId(DeviceId)> owner);
  ~Participant();

  /// Allocates the units (throws Error when a device cap is too small) and fills the
  /// sources. No UCX calls: a daemon runs this off its event loop thread.
  void fill();
  /// Registers the arenas with UCX; what the peers need (on the event loop thread).
  PeerInfo publish();
  PeerInfo start() {
    fill();
    return publish();
  }
  /// Connects to every other peer and binds the transition.
  void connect(const std::vector<PeerInfo>& peers);
  /// Faults in this process's mappings of the peers' source buffers that UCX reads
  /// directly (shared memory), so that the first run's copies do not take those page
  /// faults inside UCX progress on the event loop. No UCX calls: run it off the loop.
  void warm() const;
  /// Before each run of a bf16 → FP8 transition, and before any peer's run reads what it
  /// writes: the bf16 blocks of ours an FP8 target reads, quantized into the staging the
  /// peers get from (UnitStore::quantize; nothing when there are none). Touches only
  /// memory: run it off the loop.
  void quantize() { store_.quantize(c_.copy_threads); }
  /// Starts one run in the background; `done` is called with its outcome.
  void run(std::function<asio::awaitable<void>(RunResult)> done);
  /// Cancels a running run and waits up to `limit` for it; false when a transfer would not
  /// stop (UCX gets cannot always be cancelled; they only write destination buffers).
  asio::awaitable<bool> abort(std::chrono::milliseconds limit);
  /// A peer may be dead or frozen: never destroy the UCX worker (transport/ucx.hpp).
  void quarantine() {
    if (ucx_) ucx_->quarantine();
  }
  /// Waits for a started run (unless abort() gave up on it).
  asio::awaitable<void> settle();
  // These three touch only memory and files (no UCX): a daemon runs them off its loop.
  FillCheck verify_sources() const;
  FillCheck verify_targets() const;
  nlohmann::json dump(const std::string& dir) const;
  /// Deregisters memory and closes UCX; false when a run is stuck (the caller should not
  /// free the arenas under it).
  asio::awaitable<bool> finish(std::chrono::milliseconds limit);

 private:
  asio::io_context& io_;
  const ReshardSpec& c_;
  const PreparedReshard& p_;
  std::vector<DeviceId> mine_;
  PeerId self_;
  std::function<PeerId(DeviceId)> owner_;
  std::unique_ptr<UcxTransport> ucx_;  // host memory; before the store: it allocates the store's arenas (and outlives them)
  std::unique_ptr<Transport> cuda_;    // cuda memory: copies and IPC gets
  UnitStore store_;
  LocalTransport local_;
  std::unique_ptr<Transport> nccl_;   // cuda memory between processes, as NCCL messages
  std::unique_ptr<MixedTransport> mixed_;  // with ipc: CUDA IPC inside a machine, NCCL or UCX across
  Transport& remote() { return mixed_ ? *mixed_ : nccl_ ? *nccl_ : static_cast<Transport&>(*ucx_); }
  std::vector<Registration> regs_;
  std::vector<std::pair<const std::byte*, std::size_t>> mapped_sources_;  // what warm() touches
  std::unique_ptr<Executor> ex_;
  std::unique_ptr<BoundTransition> bound_;
  AsyncScope scope_;
  bool stuck_ = false;
};

}  // namespace nereus
