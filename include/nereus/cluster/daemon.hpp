#pragma once
// nereusd: one daemon per node. It owns the node's devices, serves the control plane on
// its listen address (authenticated clients; on the coordinator also the nodes), and,
// unless it is the coordinator, joins the coordinator and heartbeats to it, rejoining
// when the connection drops. The coordinator (node 0) keeps the job's membership and
// marks a node lost at end of stream or after `dead_after` without a heartbeat.
#include <memory>
#include <optional>
#include <string>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/launch.hpp"
#include "nereus/cluster/membership.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/runtime/adopted_buffer.hpp"

namespace nereus::cluster {

class StepHost;

struct DaemonOptions {
  Launch launch;
  std::string token;
  int devices = 1;                   ///< devices on this node
  std::uint64_t device_capacity = 1ull << 30;
  /// Where they live: host memory, or GPU memory (device i on GPU i mod the GPUs present;
  /// a job's units then move by CUDA copies and, between daemons of one machine, CUDA IPC).
  MemoryKind device_kind = MemoryKind::host;
  /// With GPU devices: added to this machine's identity as CUDA IPC sees it
  /// (CudaTransportOptions::machine). Daemons whose names differ reach each other over UCX
  /// only, as on different machines: how tests emulate machines on one.
  std::string machine;
  std::optional<Endpoint> metrics;   ///< Prometheus endpoint
  std::optional<Endpoint> advertise; ///< where the others reach this daemon (default: where it listens)
  Millis heartbeat_every{250};
  Millis dead_after{1500};           ///< silence after which the coordinator declares a node lost
  Millis handshake_limit{5000};      ///< a connection must authenticate within this
  Millis join_limit{60000};          ///< how long a node keeps trying to reach the coordinator
  Millis client_idle{60000};         ///< an authenticated client silent this long is dropped
  std::uint32_t frame_cap = kDefaultFrameCap;
  int max_pending = 64;              ///< connections in the handshake at once; more are dropped
  /// The framework running this node's steps of a job (cluster/member.hpp); null: a daemon
  /// answers each step at once.
  std::shared_ptr<StepHost> step_host;
  /// The framework's memory backing buffers of the units a job loads on this node, instead
  /// of the arenas (docs/cluster.md, "The framework's own memory"): each job this node
  /// takes part in from its load adopts them again. The memory must outlive the daemon.
  std::vector<AdoptedBuffer> adopt;
};

class Daemon {
 public:
  Daemon(asio::io_context& io, DaemonOptions options);
  ~Daemon();
  /// Binds the listen (and metrics) addresses; throws nereus::Error naming an address in use.
  void bind();
  /// The bound addresses (ports chosen by the system when 0 was asked).
  Endpoint listening() const;
  /// The address the other daemons are told to reach this one at: --advertise, else listening().
  Endpoint reachable_at() const;
  std::optional<Endpoint> metrics_listening() const;
  /// Serves until stop(); throws nereus::Error when the node cannot join (wrong token, rank
  /// taken, coordinator unreachable within join_limit).
  asio::awaitable<void> run();
  void stop();
  /// stop() once the coordinator has answered every client's transition or job request in
  /// hand (their results reach the clients), waiting at most `grace`.
  void stop_after(Millis grace);
  /// Whether a transition or job part was left behind running (a transfer that would not
  /// stop): the process should then end without destroying what it still uses.
  bool stuck() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nereus::cluster
