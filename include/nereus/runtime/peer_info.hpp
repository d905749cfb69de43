#pragma once
// What a process tells its peers before a cross-process transition, through whatever
// control channel connects them (the bench's Unix sockets, nereusd's Cap'n Proto): its
// UCX worker address, the remote keys of its device arenas, and where its source buffers
// live, so that peers can pull from them.
#include <cstdint>
#include <string>
#include <vector>

#include "nereus/core/emu.hpp"
#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"
#include "nereus/transport/transport.hpp"

namespace nereus {

struct PeerInfo {
  PeerId rank = 0;
  std::vector<std::byte> address;
  struct Region {
    DeviceId device;
    std::vector<std::byte> key;
    std::uint64_t base = 0, size = 0;  ///< size 0: the device's whole region, else this range of it
  };
  std::vector<Region> regions;
  struct Buffer {
    std::uint32_t side;
    DeviceId device;
    TensorId buffer;
    Slot slot;
    std::uint64_t address, bytes;
    MemoryKind kind = MemoryKind::host;  ///< the memory it lives in (what can move it)
  };
  std::vector<Buffer> buffers;
  /// This process's machine as CUDA IPC sees it (boot id, plus an emulated machine's
  /// name): processes with the same one reach each other's GPU memory by IPC. Empty when
  /// the units are in host memory.
  std::string machine;
};

}  // namespace nereus
