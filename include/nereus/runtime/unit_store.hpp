#pragma once
// The local buffers of the units a process holds: allocated in its devices' arenas,
// bound for the executor, filled and checked with the verification fill of sharding.md,
// and written out as shard files.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/buffers.hpp"
#include "nereus/runtime/fp8_moves.hpp"
#include "nereus/base/device.hpp"

namespace nereus {

/// One local buffer: its key, element type, packing and the (tensor, shard) parts it
/// stacks by rows, each starting at `base` elements. In a `dtype=fp8` unit a quantizable
/// weight's buffer is `e4m3` and a `scale` buffer beside it stacks the parts' scale boxes
/// (their `shard` in block coordinates, `base` in scales).
struct BufferSpec {
  BufferKey key;
  DType dtype;
  Packing packing;
  struct Part {
    TensorId tensor;
    Box shard;
    std::int64_t base;
  };
  std::vector<Part> parts;
  int expert_groups = 1;  ///< its unit's (buffer_name: Megatron's local expert index)
  std::uint64_t bytes() const;
};

/// Buffers of collection `c` (side = source index or kTargetSide) on `devices`; with
/// `as_fp8`, only the FP8 weight and scale buffers `c` would hold were its layouts
/// `dtype=fp8` (a source's quantized staging).
std::vector<BufferSpec> collection_buffers(const Collection& c, std::uint32_t side, std::span<const DeviceId> devices,
                                           bool as_fp8 = false);

/// The outcome of checking buffers against the fill.
struct FillCheck {
  bool ok = true;
  std::uint64_t buffers = 0;
  std::uint64_t bytes = 0;
  std::string first_error;
  /// Adds another check's counts; keeps the first error.
  void merge(const FillCheck& o);
};

/// Writes the verification fill of sharding.md into one buffer at `base` (FP8 weight and
/// scale buffers: the fill quantized, fp8_fill).
void fill_buffer(const ModelSpec& m, const BufferSpec& b, std::byte* base);
/// Checks one buffer at `base` against the fill.
FillCheck check_buffer(const ModelSpec& m, const BufferSpec& b, const std::byte* base);

class UnitStore {
 public:
  /// Devices this process owns; capacity 0 sizes each arena to what it will hold.
  /// `arenas`, when given, provides the devices' arenas (and must outlive the store).
  /// `kind` cuda: each device is a cudaMalloc arena on GPU (device id mod `gpus`), filled,
  /// checked and dumped through host copies (Device::upload, download).
  UnitStore(const ReshardPlan& plan, std::vector<DeviceId> devices, std::size_t capacity, PeerId self,
            ArenaSource* arenas = nullptr, MemoryKind kind = MemoryKind::host, int gpus = 1);

  /// Allocates source, staging and target buffers (throws Error when a device's cap is too
  /// small) and fills the sources. Kept target buffers are bound to their source memory.
  void allocate_and_fill(unsigned threads);
  /// The transfers touching this process's devices as the executor binds them (FP8 ones
  /// split into weight bytes and scales: fp8_moves.hpp).
  const std::vector<Transfer>& transfers() const { return moves_.transfers; }
  /// Whether a run must first quantize (a bf16 source of ours feeds an FP8 target).
  bool quantizes() const { return !moves_.quantize.empty(); }
  /// The quantize pass: every bf16 block of ours an FP8 target reads, quantized into the
  /// staging buffers it is read from (sharding.md's quantizer, fp8.hpp), on `threads`
  /// threads (GPU memory: by the GPU quantizer, quantize_fp8_on_gpu, the same bytes). Run
  /// before each run whose transfers read the staging.
  void quantize(unsigned threads);
  BufferTable& table() { return table_; }
  std::map<DeviceId, std::unique_ptr<Device>>& devices() { return devices_; }
  const std::vector<BufferSpec>& source_buffers() const { return sources_; }
  const std::vector<BufferSpec>& target_buffers() const { return targets_; }

  FillCheck verify_targets(unsigned threads) const;
  FillCheck verify_sources(unsigned threads) const;
  /// Writes DIR/<device>/<buffer>@<slot>.bin for every target buffer; returns the
  /// manifest entries (interfaces.md).
  nlohmann::json dump(const std::string& dir) const;
  /// Largest peak use of any device arena.
  std::size_t peak_bytes() const;

 private:
  const std::byte* address(const BufferSpec& b) const;
  /// Runs `use` on the buffer's bytes as host memory: in place on a host device, else on
  /// a downloaded copy.
  template <class F>
  auto on_host(const BufferSpec& b, F&& use) const;
  FillCheck verify(const std::vector<BufferSpec>& bufs, unsigned threads) const;

  const ReshardPlan& plan_;
  std::vector<DeviceId> mine_;
  std::size_t capacity_;
  PeerId self_;
  std::map<DeviceId, std::unique_ptr<Device>> devices_;
  ArenaSource* arenas_ = nullptr;
  MemoryKind kind_ = MemoryKind::host;
  int gpus_ = 1;
  ExecutableTransfers moves_;
  std::vector<BufferSpec> sources_, staging_, targets_;
  std::vector<DeviceBuffer> memory_;
  BufferTable table_;
};

}  // namespace nereus
