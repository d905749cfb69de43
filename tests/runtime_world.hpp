#pragma once
// Host devices with bound buffers for a reshard plan in one process: what the executor
// tests bind and run against.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nereus/core/model.hpp"
#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/buffers.hpp"

namespace testing {

using namespace nereus;

/// Host devices and bound buffers of a single-process transition.
struct World {
  std::map<DeviceId, std::unique_ptr<Device>> devices;
  std::vector<DeviceBuffer> buffers;
  BufferTable table;

  Device& device(DeviceId d) {
    auto& p = devices[d];
    if (!p) p = make_device({MemoryKind::host, d, 64 << 20});
    return *p;
  }
  void bind_all(const ReshardPlan& plan) {
    const auto sizes = buffer_extents(plan.transfers());
    for (const auto& [key, bytes] : sizes) {
      buffers.push_back(device(key.device).allocate(bytes, "test"));
      std::memset(buffers.back().data(), key.side == kTargetSide ? 0 : 0x5a, bytes);
      table.bind(key, {reinterpret_cast<std::uint64_t>(buffers.back().data()), bytes, 0});
    }
  }
  /// Every source byte gets a per-buffer pattern, so misplaced bytes show.
  void pattern_sources() {
    for (const auto& [key, b] : table.all())
      if (key.side != kTargetSide) {
        auto* p = reinterpret_cast<unsigned char*>(b.address);
        for (std::uint64_t i = 0; i < b.bytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + key.buffer * 7 + key.device) & 0xff);
      }
  }
};


inline Collection coll(const std::string& spec, bool train = false) {
  return Collection::from_spec(load_model("tiny-llama"), "s", parse_collection_spec(spec), train);
}

/// A reshard between two tiny-llama layouts with every buffer bound in a World and every
/// source patterned: the start of each executor test that moves real bytes.
struct Patterned {
  ReshardPlan plan;
  std::vector<Transfer> transfers;
  World w;
  Patterned(const std::string& from, const std::string& to) : plan(plan_reshard(coll(from, true), coll(to, true))), transfers(plan.transfers()) {
    w.bind_all(plan);
    w.pattern_sources();
  }
  /// Labels every bound buffer GPU memory (host memory standing in for it).
  void as_gpu_memory() {
    for (auto [key, b] : w.table.all()) {
      b.kind = MemoryKind::cuda;
      w.table.bind(key, b);
    }
  }
};

/// Whether every destination element of `transfers` equals its source element.
inline bool landed_as_planned(std::span<const Transfer> transfers, const BufferTable& table) {
  for (const Transfer& t : transfers) {
    const auto* s = reinterpret_cast<const unsigned char*>(table.find({t.source, t.src, t.src_view.buffer, t.slot})->address);
    const auto* d = reinterpret_cast<const unsigned char*>(table.find({kTargetSide, t.dst, t.dst_view.buffer, t.slot})->address);
    const std::uint64_t el = t.bytes / static_cast<std::uint64_t>(t.box.elements());
    const std::int64_t rows = t.box.dims[0].size(), cols = t.box.rank > 1 ? t.box.dims[1].size() : 1;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const auto so = t.src_view.view.offset + i * t.src_view.view.strides[0] + (t.box.rank > 1 ? j : 0);
        const auto dof = t.dst_view.view.offset + i * t.dst_view.view.strides[0] + (t.box.rank > 1 ? j : 0);
        if (std::memcmp(s + so * el, d + dof * el, el) != 0) return false;
      }
  }
  return true;
}

}  // namespace testing
