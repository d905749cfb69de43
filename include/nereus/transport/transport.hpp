#pragma once
// How bytes move: one small interface (style.md, after NIXL): capabilities, memory
// registration, peers, and descriptor lists posted as one awaitable operation.
// Optional operations default to "not supported", so a backend stays small.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/base/asio.hpp"
#include "nereus/base/device.hpp"
#include "nereus/base/status.hpp"
#include "nereus/transport/segment.hpp"

namespace nereus {

/// A peer process (one per node in production, one per worker in benches).
using PeerId = std::uint32_t;

/// Memory a transport may move bytes in or out of.
struct MemoryRegion {
  std::byte* base = nullptr;
  std::size_t size = 0;
  DeviceId device = 0;
  MemoryKind kind = MemoryKind::host;
};

/// A registered region and the key a peer needs to reach it (empty for local-only).
struct Registration {
  MemoryRegion region;
  std::vector<std::byte> remote_key;
  std::uint64_t handle = 0;  ///< backend's own handle
};

/// What to do with a descriptor list.
enum class Op : std::uint8_t {
  copy,  ///< both sides in this process
  get,   ///< src on `peer`, dst here
  put,   ///< src here, dst on `peer`
  /// Two-sided (NCCL-style, UCX tagged messages): one message of `tag`, sent from src
  /// here to `peer`, which posts the matching recv. One contiguous segment per message.
  send,
  recv,  ///< the message of `tag` from `peer` lands at dst here
};

/// Segments of one memory kind between one local device and one remote device.
struct DescriptorList {
  Op op = Op::copy;
  PeerId peer = 0;
  DeviceId local_device = 0;
  DeviceId remote_device = 0;
  MemoryKind kind = MemoryKind::host;
  std::uint64_t tag = 0;  ///< send and recv: the message both ends name
  std::vector<Segment> segments;
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const auto& s : segments) n += s.total();
    return n;
  }
};

/// What a backend can do.
struct Capabilities {
  bool local_copy = false;
  bool remote_get = false;
  bool remote_put = false;
  bool strided = false;  ///< handles count > 1 natively (else the caller expands)
  std::vector<MemoryKind> memory;
  bool two_sided = false;  ///< send and recv of tagged messages
  /// Messages must be posted in rounds, every process posting a round's sends and
  /// receives together through post_group() (NCCL: one ncclGroupStart/End, whose sends
  /// and receives between two ranks match in the order they were issued).
  bool grouped = false;
  /// A message's runs may be strided on its side: the transport packs before sending and
  /// unpacks after receiving (in its own stream order), so the caller stages nothing.
  bool strided_messages = false;
};

/// A transport backend. post() never blocks the calling executor's thread.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  /// What it can do with one peer: capabilities() unless the transport reaches peers by
  /// different means (MixedTransport: CUDA IPC inside a machine, NCCL or UCX across).
  virtual Capabilities capabilities_for(PeerId peer) const {
    (void)peer;
    return capabilities();
  }

  /// Makes a region movable; the result's remote_key goes to peers. Throws Error.
  virtual Registration register_memory(const MemoryRegion& region) = 0;
  virtual void deregister_memory(const Registration& registration) { (void)registration; }

  /// This process's address for peers to connect to (empty when not remote-capable).
  virtual std::vector<std::byte> address() const { return {}; }
  virtual Status connect(PeerId peer, std::span<const std::byte> address) {
    (void)peer, (void)address;
    return {StatusCode::not_supported, std::string(name()) + " has no remote peers"};
  }
  /// Makes `remote_device`'s region of `peer` (registered there with `key`) reachable:
  /// the device's whole region when `size` is 0, else [base, base + size) of it (memory
  /// registered on its own, as a framework's buffer is), which addresses inside it use
  /// rather than the device's key. Overrides repeat these defaults.
  virtual Status add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key,
                                   std::uint64_t base = 0, std::uint64_t size = 0) {
    (void)peer, (void)remote_device, (void)key, (void)base, (void)size;
    return {StatusCode::not_supported, std::string(name()) + " has no remote regions"};
  }

  /// Moves every byte of `list`; completes (on the caller's executor) when all landed,
  /// on the first error, or when cancelled through the awaiting coroutine.
  virtual asio::awaitable<Status> post(DescriptorList list) = 0;

  /// Moves the lists (sends and receives) as one group and completes when every byte of
  /// them moved. Transports that say `grouped` implement it; others need not.
  virtual asio::awaitable<Status> post_group(std::vector<DescriptorList> lists) {
    (void)lists;
    co_return Status{StatusCode::not_supported, std::string(name()) + " has no grouped posts"};
  }

  /// Host memory for staging that this transport copies to and from without blocking the
  /// caller (page-locked for CUDA, whose copies from ordinary memory are synchronous);
  /// plain memory by default. Release it with free_host(); throws Error when it cannot.
  virtual std::byte* alloc_host(std::size_t bytes) { return new std::byte[bytes]; }
  virtual void free_host(std::byte* memory) { delete[] memory; }
};

}  // namespace nereus
