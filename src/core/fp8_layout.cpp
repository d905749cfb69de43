#include "nereus/core/fp8_layout.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "nereus/base/error.hpp"
#include "nereus/core/fill.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/core/sharding.hpp"

namespace nereus {

bool quantizable(const TensorInfo& t) {
  using K = TensorKind;
  if (t.rank != 2 || t.layer < 0) return false;
  switch (t.kind) {
    case K::q: case K::k: case K::v: case K::o: case K::gate: case K::up: case K::down:
    case K::q_a: case K::kv_a: case K::kv_b: case K::shared_gate: case K::shared_up: case K::shared_down:
    case K::expert_gate: case K::expert_up: case K::expert_down:
      return true;
    default:
      return false;
  }
}

fp8::Source fp8_source(DType dtype) {
  if (dtype == DType::e4m3) throw Error("internal: FP8 bytes are not a quantizer's source");
  return dtype == DType::f32 ? fp8::Source::f32 : dtype == DType::f16 ? fp8::Source::f16 : fp8::Source::bf16;
}

std::string scale_name(const TensorInfo& t) {
  constexpr std::string_view suffix = ".weight";
  std::string n = t.name;
  if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
    n.resize(n.size() - suffix.size());
  return n + ".weight_scale_inv";
}

Fp8Blocks fp8_blocks(const ModelConfig& m, const TensorInfo& t) {
  const bool columns = split_axis(t.kind) == 1;
  return columns ? Fp8Blocks{m.fp8_block[1], m.fp8_block[0]} : Fp8Blocks{m.fp8_block[0], m.fp8_block[1]};
}

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::int64_t fp8_block_count(const ModelConfig& m, const TensorInfo& t, Range range) {
  if (range.empty()) return 0;
  const Fp8Blocks b = fp8_blocks(m, t);
  const std::int64_t across = slab_width(t);
  return (ceil_div(range.hi, b.along) - range.lo / b.along) * ceil_div(across, b.across);
}

std::int64_t fp8_block_count(const ModelConfig& m, const TensorInfo& t, Range range, Range across) {
  if (range.empty() || across.empty()) return 0;
  const Fp8Blocks b = fp8_blocks(m, t);
  return (ceil_div(range.hi, b.along) - range.lo / b.along) * (ceil_div(across.hi, b.across) - across.lo / b.across);
}

std::uint64_t fp8_slab_bytes(const ModelConfig& m, const TensorInfo& t, Range range) {
  return static_cast<std::uint64_t>(range.size() * slab_width(t) + 4 * fp8_block_count(m, t, range));
}

Box fp8_scale_box(const ModelConfig& m, const Box& w) {
  Box s = w;
  for (int d = 0; d < 2; ++d) {
    const std::int64_t b = m.fp8_block[d];
    s.dims[d] = {w.dims[d].lo / b, ceil_div(w.dims[d].hi, b)};
  }
  return s;
}

void fp8_fill(const ModelConfig& m, const TensorInfo& t, const Box& w, std::uint8_t* out, float* scales) {
  const Box s = fp8_scale_box(m, w);
  const std::int64_t bo = m.fp8_block[0], bi = m.fp8_block[1];
  const std::uint32_t wid = width(t.dtype);
  const fp8::Source type = fp8_source(t.dtype);
  const std::uint64_t seed = fill_seed(t.name, "param");
  const std::int64_t cols = w.dims[1].size();
  std::vector<std::byte> block;
  std::vector<std::uint8_t> q;
  for (std::int64_t br = s.dims[0].lo; br < s.dims[0].hi; ++br)
    for (std::int64_t bc = s.dims[1].lo; bc < s.dims[1].hi; ++bc) {
      const Range r{br * bo, std::min((br + 1) * bo, t.shape[0])}, c{bc * bi, std::min((bc + 1) * bi, t.shape[1])};
      block.resize(static_cast<std::size_t>(r.size() * c.size() * wid));
      q.resize(static_cast<std::size_t>(r.size() * c.size()));
      std::size_t at = 0;
      for (std::int64_t i = r.lo; i < r.hi; ++i)
        for (std::int64_t j = c.lo; j < c.hi; ++j, at += wid) {
          const std::uint64_t v = fill_value(seed, static_cast<std::uint64_t>(i * t.shape[1] + j));
          std::memcpy(&block[at], &v, wid);  // the low bytes, little-endian (x86, aarch64)
        }
      float scale = 0;
      fp8::quantize({block.data(), type, r.size(), c.size(), c.size()}, bo, bi, q.data(), c.size(), &scale, 1);
      scales[(br - s.dims[0].lo) * s.dims[1].size() + (bc - s.dims[1].lo)] = scale;
      const Range rr = r.intersect(w.dims[0]), cc = c.intersect(w.dims[1]);
      for (std::int64_t i = rr.lo; i < rr.hi; ++i)
        std::memcpy(out + (i - w.dims[0].lo) * cols + (cc.lo - w.dims[1].lo), &q[static_cast<std::size_t>((i - r.lo) * c.size() + (cc.lo - c.lo))],
                    static_cast<std::size_t>(cc.size()));
    }
}

namespace {

/// The first split of a quantizable tensor in `layout` inside a block, as the error's
/// words; empty when every split falls on a block boundary.
std::string first_block_cut(const ModelSpec& model, const Layout& layout) {
  const ModelConfig& m = model.config();
  bool seen[kTensorKinds] = {};
  for (const TensorInfo& t : model.tensors()) {
    if (!quantizable(t) || seen[static_cast<int>(t.kind)]) continue;
    seen[static_cast<int>(t.kind)] = true;
    const int ranks = is_expert(t.kind) ? layout.expert_tp() : layout.tp;
    const int axis = split_axis(t.kind) == 1 ? 1 : 0;
    const std::int64_t extent = t.shape[static_cast<std::size_t>(axis)];
    const std::int64_t b = fp8_blocks(m, t).along;
    auto cut_at = [&](int d, std::int64_t cut) {
      return t.name + " is split at " + (d == 0 ? "row " : "column ") + std::to_string(cut) + ", inside an FP8 block of " +
             std::to_string(m.fp8_block[static_cast<std::size_t>(d)]) + (d == 0 ? " rows" : " columns") +
             " (quantization_config.weight_block_size [" + std::to_string(m.fp8_block[0]) + ", " +
             std::to_string(m.fp8_block[1]) + "]); every split of a quantized weight must fall on a block boundary";
    };
    for (int r = 0; r < ranks; ++r) {
      const Range part = tp_range(m, t, ranks, r);
      for (const std::int64_t cut : {part.lo, part.hi})
        if (cut % b != 0 && cut != extent) return cut_at(axis, cut);
    }
    // FSDP's dim-0 chunks of each TP box cut rows (dense layouts; sharding.md).
    for (int g = 0; layout.fsdp > 1 && g < layout.stage_size(); ++g) {
      const Box box = held_box(m, t, layout, g);
      if (box.empty()) continue;
      for (const std::int64_t cut : {box.dims[0].lo, box.dims[0].hi})
        if (cut % m.fp8_block[0] != 0 && cut != t.shape[0]) return cut_at(0, cut);
    }
  }
  return {};
}

}  // namespace

void check_fp8_blocks(const ModelSpec& model, const Layout& layout, const std::string& role) {
  if (const std::string cut = first_block_cut(model, layout); !cut.empty())
    throw Error("layout " + to_string(layout) + " (" + role + "): " + cut);
}

bool cuts_fp8_block(const ModelSpec& model, const Layout& layout) { return !first_block_cut(model, layout).empty(); }

}  // namespace nereus
