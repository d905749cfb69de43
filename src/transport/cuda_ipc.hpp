#pragma once
// CUDA IPC's bookkeeping, apart from CUDA so that it is tested where no GPU is (the cuda
// transport, transport/cuda.cpp, is its one user): the remote key of a registered region,
// and the table of peers' regions with the allocations mapped for them.
//
// A region may be part of an allocation: a framework's tensor adopted as a unit's buffer
// lives inside a block of its caching allocator. CUDA IPC shares whole allocations
// (cudaIpcGetMemHandle), so a key carries the allocation's base and handle besides the
// region's bounds; a peer maps each allocation once however many of its regions it is
// given (CUDA would count a second open of a handle and return the same pointer; one
// mapping per allocation keeps each open paired with its close here, when the last region
// of it goes), and checks every get against the bounds of the region it reads, not the
// allocation's.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "nereus/base/status.hpp"
#include "nereus/transport/transport.hpp"

namespace nereus::detail {

/// A registered region as a peer sees it (the remote key; fixed little-endian layout).
struct IpcKey {
  static constexpr std::size_t kHandleBytes = 64;  ///< sizeof(cudaIpcMemHandle_t)
  std::uint32_t pid = 0;                           ///< the owner's process
  std::uint64_t base = 0, size = 0;                ///< the region, in the owner's address space
  std::uint64_t allocation = 0;                    ///< base of the allocation holding it: the handle's
  std::array<std::byte, kHandleBytes> handle{};

  std::vector<std::byte> encode() const;
  /// Nothing for bytes that are not such a key, or one whose region lies before its allocation.
  static std::optional<IpcKey> decode(std::span<const std::byte> in);
};

/// Peers' regions, and the allocations mapped here for them.
class IpcRegions {
 public:
  /// Maps a peer's allocation here (cudaIpcOpenMemHandle); sets `mapped` or returns why not.
  using Open = std::function<Status(const IpcKey& key, std::byte*& mapped)>;
  /// Unmaps what Open mapped (cudaIpcCloseMemHandle).
  using Close = std::function<void(std::byte* mapped)>;

  IpcRegions(Open open, Close close) : open_(std::move(open)), close_(std::move(close)) {}
  ~IpcRegions();  ///< unmaps every allocation still mapped
  IpcRegions(const IpcRegions&) = delete;
  IpcRegions& operator=(const IpcRegions&) = delete;

  /// Adds region `key` of `device` of `peer`. A key from this very process (`own_pid`) is
  /// used in place: CUDA cannot open its own handles, and needs not. A key from another
  /// process than the device's regions so far (the peer restarted) replaces them all; one
  /// with the base of a region already there replaces it.
  Status add(PeerId peer, DeviceId device, const IpcKey& key, std::uint32_t own_pid);
  /// Where [src, src + bytes) of `device` of `peer` is mapped here; nothing when no region
  /// added for that device holds it whole.
  std::optional<std::uint64_t> translate(PeerId peer, DeviceId device, std::uint64_t src, std::uint64_t bytes) const;
  /// Whether any region of `device` of `peer` was added.
  bool knows(PeerId peer, DeviceId device) const { return regions_.contains({peer, device}); }
  /// Allocations mapped now (opened, not this process's own).
  std::size_t mapped() const;

 private:
  using AllocationKey = std::tuple<PeerId, std::uint32_t, std::uint64_t>;  // peer, pid, allocation base
  struct Region {
    std::uint64_t base = 0, size = 0;
    AllocationKey allocation;
  };
  struct Mapping {
    std::byte* at = nullptr;  ///< the allocation's base here
    bool opened = false;      ///< by Open (a peer's), not this process's own memory
    int regions = 0;          ///< regions using it
  };
  void release(const Region& r);

  Open open_;
  Close close_;
  // A device's regions by base: a get's segment finds the region holding it by search,
  // however many tensors a framework adopted on the device.
  std::map<std::pair<PeerId, DeviceId>, std::map<std::uint64_t, Region>> regions_;
  std::map<AllocationKey, Mapping> mappings_;
};

}  // namespace nereus::detail
