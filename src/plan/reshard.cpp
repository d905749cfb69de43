#include "nereus/plan/reshard.hpp"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/core/sharding.hpp"
#include "piece.hpp"

namespace nereus {

LinkModel LinkModel::of(const ClusterSpec& c) {
  LinkModel m;
  m.gpus_per_node = c.gpus_per_node;
  m.intra_node_gbps = c.intra_node_gbps;
  m.inter_node_gbps = c.inter_node_gbps;
  m.nics_per_node = c.nics_per_node;
  m.hbm_gbps = c.hbm_gbps;
  return m;
}

ReshardPlan::ReshardPlan() = default;
ReshardPlan::ReshardPlan(ReshardPlan&&) noexcept = default;
ReshardPlan& ReshardPlan::operator=(ReshardPlan&&) noexcept = default;
ReshardPlan::~ReshardPlan() = default;

const Collection& ReshardPlan::target() const { return index_->target; }
std::span<const Collection> ReshardPlan::sources() const { return index_->sources; }

namespace {

/// Rows of one query group of `kind` when either side interleaves it (Megatron's
/// linear_qkv), else 0: a transfer then stays inside one group.
std::int64_t interleave(const ModelConfig& c, TensorKind kind, const Layout& a, const Layout& b) {
  return std::max(interleave_rows(c, kind, a.packing), interleave_rows(c, kind, b.packing));
}

/// r cut at the multiples of `rows` (r itself when rows is 0).
std::vector<Range> split_at(Range r, std::int64_t rows) {
  if (rows <= 0) return {r};
  std::vector<Range> out;
  for (std::int64_t x = r.lo; x < r.hi;) {
    const std::int64_t end = std::min(r.hi, (x / rows + 1) * rows);
    out.push_back({x, end});
    x = end;
  }
  return out;
}

/// How many pieces split_at(r, rows) makes.
std::uint64_t segments(Range r, std::int64_t rows) {
  return rows <= 0 || r.empty() ? 1 : static_cast<std::uint64_t>((r.hi - 1) / rows - r.lo / rows + 1);
}

/// Per-device counters while planning.
struct Load {
  std::uint64_t send_intra = 0, send_inter = 0, recv_intra = 0, recv_inter = 0, local = 0;
  std::uint64_t quantize = 0;  ///< HBM bytes read and written by quantizing for FP8 destinations
  std::uint64_t transfers = 0;
  std::uint64_t send() const { return send_intra + send_inter; }
};

/// The planning loop: for each template, slot group and destination position, cover the
/// destination range with what its own device holds, then the gaps with the best sender.
class Planner {
 public:
  Planner(const ReshardIndex& ix, std::vector<Piece, HugePageAllocator<Piece>>& out)
      : ix_(ix), out_(out), load_(static_cast<std::size_t>(ix.max_device) + 1) {}

  void run(ReshardSummary& sum) {
    for (std::uint32_t t = 0; t < ix_.templates.size(); ++t)
      for (std::uint8_t g = 0; g < ix_.groups.size(); ++g) plan_template(t, g);
    sum = sum_;
  }
  const std::vector<Load>& load() const { return load_; }

 private:
  struct Local {
    Range range;
    std::uint32_t holding;
  };

  bool holds(const Holding& h, const Template& t, const SlotGroup& g) const {
    return g.eligible[h.c] && t.stages[h.layout].has(h.s);
  }

  /// Bytes of a range of one template's split axis at one destination: per element over
  /// the group's slots, or for an FP8-held tensor one per element and four per block.
  struct RangeBytes {
    std::uint64_t per_elem;
    const TensorInfo* fp8 = nullptr;  // the template's first tensor, when held as FP8
    const ModelConfig* model = nullptr;
    std::uint64_t tensors = 1;
    std::int64_t slab_width = 1;  // the template's (its band's rows for a banded one)
    Range band{};
    std::uint64_t of(Range r) const {
      if (!fp8) return static_cast<std::uint64_t>(r.size()) * per_elem;
      const std::int64_t blocks = band.empty() ? fp8_block_count(*model, *fp8, r) : fp8_block_count(*model, *fp8, r, band);
      return static_cast<std::uint64_t>(r.size() * slab_width + 4 * blocks) * tensors;
    }
  };

  void plan_template(std::uint32_t ti, std::uint8_t gi) {
    const Template& t = ix_.templates[ti];
    const SlotGroup& g = ix_.groups[gi];
    const std::uint64_t copies = g.slots.size() * t.tensors.size();
    for (std::uint32_t u = 0; u < ix_.target.units.size(); ++u) {
      const Emu& e = ix_.target.units[u];
      const int lay = ix_.target_layout[u];
      const bool fp8 = e.layout.fp8 && t.quantizable;
      const RangeBytes bytes{g.bytes_per_element(t, fp8) * t.tensors.size() * static_cast<std::uint64_t>(t.slab_width),
                             fp8 ? &ix_.model().tensor(t.tensors[0]) : nullptr, &ix_.model().config(), t.tensors.size(),
                             t.slab_width, t.band};
      const StageSet& ss = t.stages[lay];
      const auto& ranges = ix_.ranges(lay, t.cls);
      for (int si = 0; si < ss.n; ++si)
        for (int r : ix_.holders(lay, t.cls)) {
          Piece base{ti, u, static_cast<std::uint16_t>(ss.s[si]), static_cast<std::uint16_t>(r), gi,
                     false, false, 0, e.device(ss.s[si], r), {}};
          plan_destination(t, g, base, ranges[r], e.layout.packing, bytes, copies);
        }
    }
  }

  /// interleave() between holding h's layout and the destination unit's.
  std::int64_t interleave_of(const Template& t, const Holding& h, const Piece& dst) const {
    return interleave(ix_.model().config(), t.kind, ix_.sources[h.c].units[h.u].layout, ix_.target.units[dst.dst_unit].layout);
  }

  /// Whether source holding h and destination position `dst` hold the same rows of a
  /// banded (column-split, FSDP) template.
  bool same_rows(const Template& t, const Holding& h, const Piece& dst) const {
    const TensorInfo& info = ix_.model().tensor(t.tensors[0]);
    return fsdp_rows(info, ix_.layouts[h.layout], h.r) ==
           fsdp_rows(info, ix_.target.units[dst.dst_unit].layout, dst.dst_rank);
  }

  /// When holding h keeps the config's dtype and the destination holds FP8, h's device
  /// quantizes the range where it reads it: an HBM pass reading the source elements and
  /// writing the FP8 bytes and scales (counted for the estimate).
  void count_quantize(const Holding& h, const RangeBytes& bytes, Range r) {
    if (!bytes.fp8 || ix_.layouts[h.layout].fp8) return;
    const std::uint64_t fp8 = bytes.of(r);
    const std::uint64_t read = static_cast<std::uint64_t>(r.size() * bytes.slab_width) * bytes.tensors *
                               width(bytes.fp8->dtype);
    load_[h.dev].quantize += read + fp8;
    sum_.quantized_bytes += fp8;
  }

  void plan_destination(const Template& t, const SlotGroup& g, Piece base, Range want,
                        Packing dst_packing, const RangeBytes& bytes, std::uint64_t copies) {
    if (want.empty()) return;
    sum_.target_bytes += bytes.of(want);
    locals_.clear();
    for (std::uint32_t hi : ix_.by_device.of(base.dst)) {
      const Holding& h = ix_.holdings[hi];
      if (!holds(h, t, g)) continue;
      const Range have = ix_.ranges(h.layout, t.cls)[h.r];
      if (!have.intersect(want).empty()) locals_.push_back({have, hi});
    }
    std::stable_sort(locals_.begin(), locals_.end(),
                     [](const Local& a, const Local& b) { return a.range.lo < b.range.lo; });
    std::int64_t cur = want.lo;
    for (const Local& l : locals_) {
      const Range part = l.range.intersect(want);
      if (part.hi <= cur) continue;
      if (part.lo > cur) plan_gap(t, g, base, {cur, part.lo}, bytes, copies);
      const Holding& h = ix_.holdings[l.holding];
      Piece p = base;
      p.local = true;
      p.holding = l.holding;
      p.range = {std::max(cur, part.lo), part.hi};
      // A kept buffer is the source's own: same elements (all bands' rows too), same
      // element type, no shared buffer.
      p.keep = l.range == want && p.range == want && ix_.layouts[h.layout].fp8 == (bytes.fp8 != nullptr) &&
               (t.band.empty() || same_rows(t, h, base)) &&
               !shares_buffer(ix_.model().config(), t.kind, ix_.sources[h.c].units[h.u].layout.packing) &&
               !shares_buffer(ix_.model().config(), t.kind, dst_packing);
      const std::uint64_t n = bytes.of(p.range);
      sum_.local_bytes += n;
      if (p.keep) sum_.kept_bytes += n;
      else sum_.local_copy_count += copies * segments(p.range, interleave_of(t, h, base));
      load_[base.dst].local += p.keep ? 0 : n;
      count_quantize(h, bytes, p.range);
      out_.push_back(p);
      cur = part.hi;
    }
    if (cur < want.hi) plan_gap(t, g, base, {cur, want.hi}, bytes, copies);
  }

  /// Covers a range the destination device lacks: same node first, then the sender
  /// with the least send load so far; each piece as long as its sender's range allows.
  void plan_gap(const Template& t, const SlotGroup& g, const Piece& base, Range gap,
                const RangeBytes& bytes, std::uint64_t copies) {
    sum_.lower_bound_bytes += bytes.of(gap);
    const int node = ix_.node_of(base.dst);
    std::int64_t x = gap.lo;
    while (x < gap.hi) {
      std::uint32_t best = UINT32_MAX;
      std::uint64_t best_load = UINT64_MAX;
      Range best_range{};
      auto consider = [&](std::uint32_t hi) {
        const Holding& h = ix_.holdings[hi];
        const std::uint64_t l = load_[h.dev].send();
        if (l < best_load) {
          best = hi;
          best_load = l;
          best_range = ix_.ranges(h.layout, t.cls)[h.r];
        }
      };
      for (std::uint32_t hi : ix_.by_node.of(node)) {
        const Holding& h = ix_.holdings[hi];
        if (holds(h, t, g) && ix_.ranges(h.layout, t.cls)[h.r].contains(x)) consider(hi);
      }
      if (best == UINT32_MAX) scan_all_sources(t, g, x, consider);
      if (best == UINT32_MAX)
        throw Error("no source model-stage holds element " + std::to_string(x) + " of " +
                    ix_.model().tensor(t.tensors[0]).name);
      Piece p = base;
      p.holding = best;
      p.range = {x, std::min(best_range.hi, gap.hi)};
      const std::uint64_t n = bytes.of(p.range);
      const Holding& h = ix_.holdings[best];
      const bool inter = ix_.node_of(h.dev) != node;
      const std::uint64_t transfers = copies * segments(p.range, interleave_of(t, h, base));
      sum_.moved_bytes += n;
      sum_.transfer_count += transfers;
      if (inter) {
        sum_.inter_node_bytes += n;
        load_[h.dev].send_inter += n;
        load_[base.dst].recv_inter += n;
      } else {
        load_[h.dev].send_intra += n;
        load_[base.dst].recv_intra += n;
      }
      load_[h.dev].transfers += transfers;
      load_[base.dst].transfers += transfers;
      count_quantize(h, bytes, p.range);
      out_.push_back(p);
      x = p.range.hi;
    }
  }

  /// Every source position holding element x, in collection/unit/stage/range order.
  template <class F>
  void scan_all_sources(const Template& t, const SlotGroup& g, std::int64_t x, F&& consider) const {
    std::uint32_t hi = 0;  // holdings are laid out c, u, s, r in order
    for (std::uint32_t c = 0; c < ix_.sources.size(); ++c)
      for (std::uint32_t u = 0; u < ix_.sources[c].units.size(); ++u) {
        const Layout& lay = ix_.sources[c].units[u].layout;
        const int li = ix_.source_layout[c][u];
        if (g.eligible[c]) {
          const StageSet& ss = t.stages[li];
          for (int si = 0; si < ss.n; ++si)
            ix_.positions_containing(li, t.cls, x, [&](int r) {
              consider(hi + static_cast<std::uint32_t>(ss.s[si] * lay.stage_size() + r));
            });
        }
        hi += static_cast<std::uint32_t>(lay.size());
      }
  }

  const ReshardIndex& ix_;
  std::vector<Piece, HugePageAllocator<Piece>>& out_;
  std::vector<Load> load_;
  std::vector<Local> locals_;
  ReshardSummary sum_;
};

double estimate_seconds(const LinkModel& m, const std::vector<Load>& load, int gpus_per_node) {
  double worst = 0;
  std::uint64_t most_transfers = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> node_inter((load.size() + gpus_per_node - 1) / gpus_per_node);
  for (std::size_t d = 0; d < load.size(); ++d) {
    const Load& l = load[d];
    const double intra = static_cast<double>(std::max(l.send_intra, l.recv_intra)) / (m.intra_node_gbps * 1e9);
    // A local copy reads and writes each byte; quantizing reads the source and writes FP8.
    const double local = (2.0 * static_cast<double>(l.local) + static_cast<double>(l.quantize)) / (m.hbm_gbps * 1e9);
    worst = std::max({worst, intra, local});
    most_transfers = std::max(most_transfers, l.transfers);
    node_inter[d / gpus_per_node].first += l.send_inter;
    node_inter[d / gpus_per_node].second += l.recv_inter;
  }
  for (auto [s, r] : node_inter)
    worst = std::max(worst, static_cast<double>(std::max(s, r)) / (m.inter_node_gbps * m.nics_per_node * 1e9));
  return worst + m.setup_seconds * static_cast<double>(most_transfers);
}

/// sharding.md's FP8 rules for a transition: no FP8 source into a unit of the config's
/// dtype (dequantizing is not built), and when the target holds FP8 no split of a
/// quantized weight on the source side may cut a block either (the target's own were
/// checked when its collection was built).
void check_fp8_sides(const ReshardIndex& ix) {
  bool target_fp8 = false, target_plain = false;
  for (const Emu& u : ix.target.units) (u.layout.fp8 ? target_fp8 : target_plain) = true;
  for (const Collection& c : ix.sources)
    for (std::size_t u = 0; u < c.units.size(); ++u) {
      const Layout& l = c.units[u].layout;
      if (l.fp8 && target_plain)
        throw Error("source model-stage '" + c.model_stage + "' holds FP8 (dtype=fp8) but target '" + ix.target.model_stage +
                    "' holds " + std::string(to_string(ix.model().config().dtype)) +
                    ": dequantizing FP8 units is not supported");
      if (target_fp8 && !l.fp8 && (u == 0 || !(l == c.units[u - 1].layout)))
        check_fp8_blocks(ix.model(), l, "source '" + c.model_stage + "' of an FP8 target");
    }
}

}  // namespace

ReshardPlan plan_reshard(std::span<const Collection> sources, const Collection& target,
                         const ReshardOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ReshardPlan plan;
  auto index = std::make_unique<ReshardIndex>(sources, target, options.links.gpus_per_node);
  check_fp8_sides(*index);
  // About a piece per template and target unit or more (a routed expert lives in one
  // group of each unit): reserving spares the growth copies, a fifth of a cold plan of
  // Kimi-K2's 178k pieces.
  plan.pieces_.reserve(index->templates.size() * target.units.size() + 1024);
  Planner planner(*index, plan.pieces_);
  planner.run(plan.summary_);
  const auto& load = planner.load();
  for (std::size_t d = 0; d < load.size(); ++d) {
    const Load& l = load[d];
    const std::uint64_t recv = l.recv_intra + l.recv_inter;
    plan.summary_.max_device_send_bytes = std::max(plan.summary_.max_device_send_bytes, l.send());
    plan.summary_.max_device_recv_bytes = std::max(plan.summary_.max_device_recv_bytes, recv);
    if (l.send() || recv || l.local)
      plan.traffic_.push_back({static_cast<DeviceId>(d), l.send(), recv, l.local});
  }
  plan.summary_.estimated_seconds = estimate_seconds(options.links, load, index->gpus_per_node);
  plan.index_ = std::move(index);
  plan.summary_.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

std::vector<DeviceTraffic> ReshardPlan::traffic() const { return traffic_; }

template <class Keep>
std::vector<Transfer> ReshardPlan::materialise(Keep&& keep) const {
  const ReshardIndex& ix = *index_;
  const ModelSpec& m = ix.model();
  std::vector<Transfer> out;
  for (const Piece& p : pieces_) {
    const Holding& h = ix.holdings[p.holding];
    if (!keep(h.dev) && !keep(p.dst)) continue;
    const Template& t = ix.templates[p.tmpl];
    const Layout& src_layout = ix.sources[h.c].units[h.u].layout;
    const Layout& dst_layout = ix.target.units[p.dst_unit].layout;
    const std::int64_t group_rows = interleave(m.config(), t.kind, src_layout, dst_layout);
    for (TensorId tensor : t.tensors) {
      const TensorInfo& info = m.tensor(tensor);
      const ShardPlace sp = place_shard(m, tensor, src_layout, h.r);
      const ShardPlace dp = place_shard(m, tensor, dst_layout, p.dst_rank);
      // Megatron's interleaved linear_qkv holds a query group's rows in one block: a box
      // crossing groups is one transfer per group.
      for (const Range r : split_at(p.range, group_rows))
      for (Slot s : ix.groups[p.group].slots) {
        Box box = slab_box(info, r);
        if (!t.band.empty()) box.dims[0] = t.band;
        Transfer x;
        x.src = h.dev;
        x.dst = p.dst;
        x.source = h.c;
        x.tensor = tensor;
        x.slot = s;
        x.box = box;
        x.src_view = {sp.buffer, src_layout.packing, sp.view(box), src_layout.expert_groups()};
        x.dst_view = {dp.buffer, dst_layout.packing, dp.view(box), dst_layout.expert_groups()};
        if (dst_layout.fp8 && t.quantizable) {
          x.fp8 = src_layout.fp8 ? Fp8Move::copy : Fp8Move::quantize;
          x.bytes = static_cast<std::uint64_t>(box.elements() + 4 * fp8_scale_box(m.config(), box).elements());
        } else {
          x.bytes = static_cast<std::uint64_t>(box.elements()) * width(slot_dtype(s, info.dtype));
        }
        x.keep = p.keep;
        out.push_back(x);
      }
    }
  }
  return out;
}

std::vector<Transfer> ReshardPlan::transfers() const {
  return materialise([](DeviceId) { return true; });
}

std::vector<Transfer> ReshardPlan::transfers_touching(std::span<const DeviceId> devices) const {
  std::vector<char> mark(static_cast<std::size_t>(index_->max_device) + 1, 0);
  for (DeviceId d : devices)
    if (d >= 0 && d <= index_->max_device) mark[d] = 1;
  return materialise([&](DeviceId d) { return mark[d] != 0; });
}

}  // namespace nereus
