#pragma once
// The `ucx` backend (UCP): RMA get/put with rkeys between processes, and two-sided tagged
// send/recv of one contiguous message (Op::send/recv, matched on the whole tag), over
// whatever UCX picks (shared memory, CMA, TCP on loopback). One UCP worker per transport, progressed
// from its io_context: busy progress while operations are in flight, an armed wait on
// the worker's event fd when idle, and a fallback timer tick.
//
// Lifetimes — who holds what, and the order things end:
// - The memory a transport registers (device arenas) is its owner's and must outlive the
//   transport: owners declare their devices before their transport. Arenas the transport
//   allocated itself (ArenaSource) are the exception: the transport outlives those
//   devices, and unmaps the memory at its end.
// - The context holds the registrations (memh); the worker holds the endpoints (ours,
//   and those UCX makes itself, e.g. to answer a peer's emulated gets); an endpoint holds
//   the requests pending on it and the rkeys unpacked for it. A request whose local
//   buffer lies in a registered region passes that region's memh, so UCX registers
//   nothing for it.
// - deregister_memory() only stops new requests from using a region; it stays mapped
//   until the worker is gone, since requests already posted may still use it.
// - shutdown() (on the event loop): our requests are cancelled and progressed until they
//   complete (bounded), then the progress loops stop. The destructor then destroys rkeys,
//   closes our endpoints (forced, bounded), destroys the worker, unmaps every region and
//   cleans up the context, in that order. Destroyed without shutdown() (its owner's
//   coroutine cancelled mid-close, as when a daemon stops), the loops may still be
//   suspended: they hold the transport's state, see it stopping when they resume, and
//   exit without touching UCX (a use after free under ASan before, in benches/soak.sh).
// - Quarantine: when a peer may have died or frozen with work in flight (a request ended
//   with an error or was cut short, an endpoint failed, a close or a request did not
//   finish in time, or the owner called quarantine() after aborting work), requests may
//   stay pending forever, also on endpoints we never see. Destroying the worker would
//   purge them, and the purge touches requests and handles already gone (SIGSEGV in
//   ucp_worker_destroy → ucp_ep_purge_lanes, UCX 1.13). The destructor then closes
//   nothing and destroys nothing: the context, worker and registrations stay alive,
//   unprogressed, until the process ends (a few MB per quarantined transport).
// - Abandoned sends (abandon_sends()): their posts have completed, their requests and
//   batches stay with the quarantined worker, so a late callback finds them.
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "nereus/transport/transport.hpp"

namespace nereus {

struct UcxOptions {
  /// UCX_NET_DEVICES unless the environment sets it: loopback keeps benches on this host.
  std::string net_devices = "lo";
  /// UCX peer error handling: detects failed peers inside UCX, but rules out the shared
  /// memory transports (sysv/posix/cma lack it), and its TCP get emulation aborts a
  /// process serving a get to a peer that dies. Off by default: an error handler is set on
  /// every endpoint either way, and the control plane detects dead peers.
  bool peer_error_handling = false;
};

/// Also an ArenaSource: arenas it allocates (ucp_mem_map with ALLOCATE) live in memory
/// UCX's shared-memory transports can hand to peers on the node, whose gets then read them
/// directly (one memcpy, as `ucx_perftest -t ucp_get` does with its own buffers). Memory
/// merely registered cannot be: without CMA (often barred in containers) UCX emulates
/// such a get with active messages, two copies and the serving process's progress loop.
/// Allocated arenas stay mapped until the transport is destroyed, after its worker.
class UcxTransport final : public Transport, public ArenaSource {
 public:
  /// Creates the UCP context and worker; `io` must be run by exactly one thread.
  UcxTransport(asio::io_context& io, UcxOptions options = {});
  ~UcxTransport() override;

  std::string_view name() const override { return "ucx"; }
  Capabilities capabilities() const override;
  Registration register_memory(const MemoryRegion& region) override;
  /// The memory stays mapped until the transport is destroyed (after its worker).
  void deregister_memory(const Registration& registration) override;
  std::vector<std::byte> address() const override;
  Status connect(PeerId peer, std::span<const std::byte> address) override;
  Status add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key, std::uint64_t base = 0,
                           std::uint64_t size = 0) override;
  asio::awaitable<Status> post(DescriptorList list) override;
  /// Where [address, address + bytes) of a peer's device is mapped in this process, when
  /// UCX reads it directly from shared memory (an arena the peer's transport allocated);
  /// null otherwise. Touching those pages ahead (off the event loop) keeps the first get's
  /// page faults out of the progress call that copies.
  const std::byte* mapped(PeerId peer, DeviceId device, std::uint64_t address) const;
  std::byte* allocate_arena(DeviceId id, std::size_t bytes) override;
  void release_arena(std::byte* arena, std::size_t bytes) override;

  /// Ends our requests and stops the progress loops; call before the io_context stops
  /// (see "Lifetimes" above).
  asio::awaitable<void> shutdown();
  /// The owner aborted work that may involve a dead or frozen peer: never destroy the
  /// worker (see "Lifetimes" above).
  void quarantine();
  /// The owner aborted work, and some of its tagged sends did not end when cancelled (UCX
  /// cannot cancel a send; one whose peer died, or no longer receives it, stays pending for
  /// good): their posts complete now as `abandoned`, while UCX keeps the requests, and the
  /// transport is quarantined. Returns how many posts it ended. Only sends: with UCX's
  /// shared-memory rendezvous the receiver reads the source, so a send left pending never
  /// touches its buffer, which the owner may then free; over TCP, a peer that resumes
  /// could still ask for it, so memory that is the caller's own (staging) is never reused
  /// or freed (StatusCode::abandoned). Gets and receives write their destination and stay
  /// waited for (see "Lifetimes" above).
  std::size_t abandon_sends();

  struct Impl;

 private:
  void close_endpoints(std::chrono::milliseconds limit);
  // Shared with the progress and tick loops: a transport destroyed without shutdown() (its
  // owner's coroutine cancelled mid-close) must not free what a suspended loop resumes into.
  std::shared_ptr<Impl> impl_;
};

}  // namespace nereus
