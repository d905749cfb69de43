#include "nereus/runtime/fp8_moves.hpp"

#include <map>
#include <tuple>
#include <unordered_map>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/packing.hpp"

namespace nereus {

namespace {

/// Where a device sits in a collection: its unit's layout and its in-stage index.
struct Position {
  const Layout* layout = nullptr;
  int g = 0;
};

std::unordered_map<DeviceId, Position> positions(const Collection& c) {
  std::unordered_map<DeviceId, Position> out;
  for (const Emu& u : c.units)
    for (int s = 0; s < u.layout.pp; ++s)
      for (int g = 0; g < u.layout.stage_size(); ++g) out[u.device(s, g)] = {&u.layout, g};
  return out;
}

}  // namespace

ExecutableTransfers executable_transfers(const ReshardPlan& plan, std::span<const DeviceId> devices) {
  ExecutableTransfers out;
  std::vector<Transfer> all = plan.transfers_touching(devices);
  out.transfers.reserve(all.size());
  const ModelSpec& m = *plan.target().model;
  std::vector<std::unordered_map<DeviceId, Position>> src_pos;  // built on the first FP8 transfer
  std::unordered_map<DeviceId, Position> dst_pos;
  std::vector<char> mine;
  for (DeviceId d : devices)
    if (d >= 0) {
      if (mine.size() <= static_cast<std::size_t>(d)) mine.resize(static_cast<std::size_t>(d) + 1, 0);
      mine[static_cast<std::size_t>(d)] = 1;
    }
  auto is_mine = [&](DeviceId d) { return d >= 0 && static_cast<std::size_t>(d) < mine.size() && mine[static_cast<std::size_t>(d)]; };
  // (source, device, tensor, box) already quantized
  std::map<std::tuple<std::uint32_t, DeviceId, TensorId, std::int64_t, std::int64_t, std::int64_t, std::int64_t>, char> seen;
  for (const Transfer& t : all) {
    if (t.fp8 == Fp8Move::none) {
      out.transfers.push_back(t);
      continue;
    }
    if (src_pos.empty()) {
      for (const Collection& c : plan.sources()) src_pos.push_back(positions(c));
      dst_pos = positions(plan.target());
    }
    const Position& sp = src_pos.at(t.source).at(t.src);
    const Position& dp = dst_pos.at(t.dst);
    const ShardPlace ss = place_scale(m, t.tensor, *sp.layout, sp.g);
    const ShardPlace ds = place_scale(m, t.tensor, *dp.layout, dp.g);
    const Box scales = fp8_scale_box(m.config(), t.box);
    Transfer w = t;
    w.fp8 = Fp8Move::none;
    w.bytes = static_cast<std::uint64_t>(t.box.elements());
    Transfer s = w;
    s.slot = Slot::scale;
    s.box = scales;
    s.src_view = {ss.buffer, t.src_view.packing, ss.view(scales), t.src_view.expert_groups};
    s.dst_view = {ds.buffer, t.dst_view.packing, ds.view(scales), t.dst_view.expert_groups};
    s.bytes = static_cast<std::uint64_t>(scales.elements()) * 4;
    if (t.fp8 == Fp8Move::quantize) {
      w.source = s.source = quantized_side(t.source);
      w.keep = s.keep = false;
      const auto& b = t.box.dims;
      if (is_mine(t.src) && seen.emplace(std::tuple{t.source, t.src, t.tensor, b[0].lo, b[0].hi, b[1].lo, b[1].hi}, 0).second)
        out.quantize.push_back({{t.source, t.src, t.src_view.buffer, Slot::param}, t.tensor, t.box, t.src_view.view, s.src_view.view});
    }
    out.transfers.push_back(w);
    out.transfers.push_back(s);
  }
  return out;
}

}  // namespace nereus
