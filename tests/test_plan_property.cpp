// Property tests of the reshard planner against an independent brute force (reference.hpp):
// coverage exactly once, moved bytes = lower bound, sources hold what they send, bytes
// land where the packing says, determinism.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "cases.hpp"
#include "test_util.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/plan/geometry.hpp"
#include "nereus/plan/placement.hpp"
#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/fp8_moves.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/local.hpp"
#include "run_async.hpp"

namespace {

using nereus::Collection;
using nereus::Slot;
using nereus::Transfer;

ref::Layout to_ref(const nereus::Layout& l) {
  return {l.tp, l.pp, l.partition, l.packing == nereus::Packing::fused, l.ep, l.etp, l.fsdp, l.packing == nereus::Packing::megatron};
}

/// Calls f(s, g, device) for every position of a unit, devices found by sharding.md's
/// rule R[(s·ep + e)·tp + r] (reference.hpp), not by the library's Emu::device.
template <class F>
void each_position(const nereus::Emu& u, F&& f) {
  const ref::Layout l = to_ref(u.layout);
  for (int s = 0; s < l.pp; ++s)
    for (int g = 0; g < l.tp * l.ep * l.fsdp; ++g) f(s, g, u.gpus[ref::device_index(l, s, g)]);
}

/// Element width of tensor t's slot s (sharding.md: param in the config's dtype unless the
/// table marks the tensor float32; optimizer slots float32), from the reference's reading.
std::uint32_t slot_width(const nereus::ModelConfig& c, const ref::Tensor& t, Slot s) {
  if (s != Slot::param || t.f32) return 4;
  return nereus::width(c.dtype);
}

/// Destination bytes of a box: its elements at the slot's width, or in an FP8 unit, for a
/// quantized weight, one byte per element and four per block it touches.
std::uint64_t box_bytes(const nereus::ModelConfig& c, const ref::Tensor& t, Slot s, const ref::Box& b, bool fp8) {
  if (fp8 && ref::quantized(t)) return static_cast<std::uint64_t>(ref::volume(b) + 4 * ref::volume(ref::block_span(c, b)));
  return static_cast<std::uint64_t>(ref::volume(b)) * slot_width(c, t, s);
}

bool collection_has_slot(const Collection& c, Slot s) {
  for (Slot x : c.slots())
    if (x == s) return true;
  return false;
}

struct Position {
  const nereus::Emu* unit;
  int s, r;
};

/// The position a device has in a collection, if any.
std::optional<Position> find_position(const Collection& c, nereus::DeviceId d) {
  std::optional<Position> out;
  for (const auto& u : c.units)
    each_position(u, [&](int s, int g, nereus::DeviceId dev) {
      if (dev == d) out = Position{&u, s, g};
    });
  return out;
}

bool box_inside(const nereus::Box& b, const ref::Box& outer) {
  if (static_cast<std::size_t>(b.rank) != outer.size()) return false;
  for (int d = 0; d < b.rank; ++d)
    if (b.dims[d].lo < outer[d].first || b.dims[d].hi > outer[d].second || b.dims[d].lo >= b.dims[d].hi) return false;
  return true;
}

/// Calls f(i, j) for every element of a box of rank 1 or 2 (j = 0 for rank 1).
template <class F>
void for_each_element(const ref::Box& b, F&& f) {
  const std::int64_t j0 = b.size() > 1 ? b[1].first : 0, j1 = b.size() > 1 ? b[1].second : 1;
  for (std::int64_t i = b[0].first; i < b[0].second; ++i)
    for (std::int64_t j = j0; j < j1; ++j) f(i, j);
}

ref::Box as_ref(const nereus::Box& b) {
  ref::Box out;
  for (int d = 0; d < b.rank; ++d) out.push_back({b.dims[d].lo, b.dims[d].hi});
  return out;
}

/// Byte buffers of every position of a collection, keyed (device, buffer name, slot).
using BufferKey = std::tuple<nereus::DeviceId, std::string, Slot>;
struct Bytes {
  std::vector<unsigned char> data;
  ref::Buffer layout;
};

std::map<BufferKey, Bytes> make_buffers(const nereus::ModelConfig& c, const std::vector<ref::Tensor>& ts,
                                        const Collection& coll, bool fill) {
  std::map<BufferKey, Bytes> out;
  for (const auto& u : coll.units)
    each_position(u, [&](int s, int r, nereus::DeviceId dev) {
        for (auto& [name, buf] : ref::buffers(c, ts, to_ref(u.layout), s, r))
          for (Slot slot : coll.slots()) {
            const std::uint32_t w = slot_width(c, ts[buf.parts.front().first], slot);
            Bytes b;
            b.layout = buf;
            std::int64_t n = 0;
            for (const auto& [ti, box] : buf.parts) n += ref::volume(box);
            b.data.assign(static_cast<std::size_t>(n) * w, 0xEE);
            if (fill) {
              std::size_t at = 0;
              for (const auto& part : buf.parts) {
                const auto ti = part.first;  // not structured bindings: the lambda below uses them (clang 14)
                const auto& box = part.second;
                const std::uint64_t seed = nereus::fill_seed(ts[ti].name, nereus::to_string(slot));
                for_each_element(box, [&](std::int64_t i, std::int64_t j) {
                  const std::uint64_t v = nereus::fill_value(seed, ref::global_index(ts[ti], i, j));
                  std::memcpy(&b.data[at], &v, w);  // little-endian host
                  at += w;
                });
              }
            }
            out.emplace(BufferKey{dev, name, slot}, std::move(b));
          }
    });
  return out;
}

/// Copies one transfer's box between buffers through its views; false if a view points
/// outside its buffer.
bool apply(const Transfer& t, std::uint32_t w, const Bytes& src, Bytes& dst) {
  const std::int64_t rows = t.box.dims[0].size();
  const std::int64_t cols = t.box.rank > 1 ? t.box.dims[1].size() : 1;
  const auto& sv = t.src_view.view;
  const auto& dv = t.dst_view.view;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t so = sv.offset + i * sv.strides[0] + (t.box.rank > 1 ? j * sv.strides[1] : 0);
      const std::int64_t dO = dv.offset + i * dv.strides[0] + (t.box.rank > 1 ? j * dv.strides[1] : 0);
      if (so < 0 || dO < 0 || static_cast<std::size_t>((so + 1) * w) > src.data.size() ||
          static_cast<std::size_t>((dO + 1) * w) > dst.data.size())
        return false;
      std::memcpy(&dst.data[static_cast<std::size_t>(dO * w)], &src.data[static_cast<std::size_t>(so * w)], w);
    }
  return true;
}

void check_case(const testcase::Case& k) {
  INFO(k.describe());
  const nereus::ModelSpec& m = *k.model;
  const nereus::ModelConfig& c = m.config();
  const auto ts = ref::tensors(c);
  std::map<std::string, std::size_t> ref_index;
  for (std::size_t i = 0; i < ts.size(); ++i) ref_index[ts[i].name] = i;

  // FP8 destinations (sharding.md): the devices of `dtype=fp8` target units, and of
  // `dtype=fp8` source units (their transfers copy bytes and scales as they are).
  std::set<nereus::DeviceId> fp8_dst;
  std::set<std::pair<std::size_t, nereus::DeviceId>> fp8_src;  // (source collection, device)
  for (const auto& u : k.target.units)
    if (u.layout.fp8) fp8_dst.insert(u.gpus.begin(), u.gpus.end());
  for (std::size_t i = 0; i < k.sources.size(); ++i)
    for (const auto& u : k.sources[i].units)
      if (u.layout.fp8)
        for (nereus::DeviceId d : u.gpus) fp8_src.insert({i, d});
  auto fp8_on = [&](nereus::DeviceId d) { return fp8_dst.count(d) > 0; };

  nereus::ReshardOptions opt;
  opt.links.gpus_per_node = k.gpus_per_node;
  const auto plan = nereus::plan_reshard(k.sources, k.target, opt);
  const auto transfers = plan.transfers();

  // Destination boxes, each element counted as it is covered.
  struct Dest {
    ref::Box box;
    std::vector<unsigned char> count;
  };
  std::map<std::tuple<nereus::DeviceId, std::size_t, Slot>, Dest> dest;
  std::uint64_t target_bytes = 0;
  for (const auto& u : k.target.units)
    each_position(u, [&](int s, int r, nereus::DeviceId dev) {
        for (std::size_t ti = 0; ti < ts.size(); ++ti)
          if (auto b = ref::shard(c, ts[ti], to_ref(u.layout), s, r))
            for (Slot slot : k.target.slots()) {
              dest[{dev, ti, slot}] = {*b, std::vector<unsigned char>(static_cast<std::size_t>(ref::volume(*b)), 0)};
              target_bytes += box_bytes(c, ts[ti], slot, *b, fp8_on(dev));
            }
    });

  std::uint64_t moved = 0, local = 0, kept = 0, link_count = 0, copy_count = 0;
  for (const Transfer& t : transfers) {
    const std::string& name = m.tensor(t.tensor).name;
    REQUIRE(ref_index.count(name));
    const std::size_t ti = ref_index[name];
    auto it = dest.find({t.dst, ti, t.slot});
    REQUIRE_MESSAGE(it != dest.end(), "transfer to a (device, tensor, slot) the target lacks: ", name);
    REQUIRE_MESSAGE(box_inside(t.box, it->second.box), "transfer box outside its destination shard: ", name);
    REQUIRE(t.source < k.sources.size());
    const Collection& src = k.sources[t.source];
    REQUIRE(collection_has_slot(src, t.slot));
    const auto pos = find_position(src, t.src);
    REQUIRE_MESSAGE(pos.has_value(), "sender holds no position of its source collection");
    const auto have = ref::shard(c, ts[ti], to_ref(pos->unit->layout), pos->s, pos->r);
    REQUIRE_MESSAGE(have.has_value(), "sender does not hold tensor ", name);
    REQUIRE_MESSAGE(box_inside(t.box, *have), "transfer reads a box its sender does not hold: ", name);
    const ref::Box& db = it->second.box;
    const std::int64_t width1 = db.size() > 1 ? db[1].second - db[1].first : 1;
    for_each_element(as_ref(t.box), [&](std::int64_t i, std::int64_t j) {
      const std::int64_t idx = (i - db[0].first) * width1 + (db.size() > 1 ? j - db[1].first : 0);
      ++it->second.count[static_cast<std::size_t>(idx)];
    });
    CHECK(t.bytes == box_bytes(c, ts[ti], t.slot, as_ref(t.box), fp8_on(t.dst)));
    const bool quantized = fp8_on(t.dst) && ref::quantized(ts[ti]);
    CHECK(t.fp8 == (!quantized ? nereus::Fp8Move::none : fp8_src.count({t.source, t.src}) ? nereus::Fp8Move::copy : nereus::Fp8Move::quantize));
    if (t.local()) {
      local += t.bytes;
      if (t.keep) kept += t.bytes;
      else ++copy_count;
    } else {
      moved += t.bytes;
      ++link_count;
      CHECK_FALSE(t.keep);
    }
  }
  for (const auto& entry : dest) {
    const auto& key = entry.first;  // not structured bindings: CHECK_MESSAGE uses them in a lambda
    const auto& d = entry.second;
    const auto bad = std::count_if(d.count.begin(), d.count.end(), [](unsigned char n) { return n != 1; });
    CHECK_MESSAGE(bad == 0, "destination elements not covered exactly once: ", ts[std::get<1>(key)].name,
                  " on device ", std::get<0>(key));
  }

  // Brute-force lower bound: destination elements that no source holds on that device.
  std::uint64_t lower = 0;
  for (const auto& entry : dest) {
    const auto& key = entry.first;  // not structured bindings: the lambdas below use them
    const auto& d = entry.second;
    const auto dev = std::get<0>(key);
    const auto ti = std::get<1>(key);
    const auto slot = std::get<2>(key);
    std::vector<unsigned char> held(d.count.size(), 0);
    const std::int64_t width1 = d.box.size() > 1 ? d.box[1].second - d.box[1].first : 1;
    for (const Collection& src : k.sources) {
      if (!collection_has_slot(src, slot)) continue;
      const auto pos = find_position(src, dev);
      if (!pos) continue;
      const auto have = ref::shard(c, ts[ti], to_ref(pos->unit->layout), pos->s, pos->r);
      if (!have) continue;
      for_each_element(d.box, [&](std::int64_t i, std::int64_t j) {
        bool in = (*have)[0].first <= i && i < (*have)[0].second;
        if (have->size() > 1) in = in && (*have)[1].first <= j && j < (*have)[1].second;
        if (in) held[static_cast<std::size_t>((i - d.box[0].first) * width1 + (d.box.size() > 1 ? j - d.box[1].first : 0))] = 1;
      });
    }
    if (!(fp8_on(dev) && ref::quantized(ts[ti]))) {
      lower += static_cast<std::uint64_t>(std::count(held.begin(), held.end(), 0)) * slot_width(c, ts[ti], slot);
      continue;
    }
    // An FP8 block is local when the device holds all of its elements (in either format);
    // otherwise its bytes (one per element) and its 4-byte scale cross a link.
    const ref::Box blocks = ref::block_span(c, d.box);
    for_each_element(blocks, [&](std::int64_t bi, std::int64_t bj) {
      const ref::Box block{{std::max(bi * c.fp8_block[0], d.box[0].first), std::min((bi + 1) * c.fp8_block[0], d.box[0].second)},
                           {std::max(bj * c.fp8_block[1], d.box[1].first), std::min((bj + 1) * c.fp8_block[1], d.box[1].second)}};
      bool all = true;
      for_each_element(block, [&](std::int64_t i, std::int64_t j) {
        all = all && held[static_cast<std::size_t>((i - d.box[0].first) * width1 + j - d.box[1].first)];
      });
      if (!all) lower += static_cast<std::uint64_t>(ref::volume(block)) + 4;
    });
  }

  const auto& sum = plan.summary();
  CHECK(moved == lower);
  CHECK(sum.moved_bytes == moved);
  CHECK(sum.lower_bound_bytes == lower);
  CHECK(sum.local_bytes == local);
  CHECK(sum.kept_bytes == kept);
  CHECK(sum.target_bytes == target_bytes);
  CHECK(sum.transfer_count == link_count);
  CHECK(sum.local_copy_count == copy_count);

  // Real bytes through the views: fill the sources, apply every transfer (kept buffers
  // are copied too: a kept buffer holds exactly these bytes), verify the targets.
  std::vector<std::map<BufferKey, Bytes>> src_bufs;
  for (const Collection& s : k.sources) src_bufs.push_back(make_buffers(c, ts, s, true));
  auto dst_bufs = make_buffers(c, ts, k.target, false);
  const auto expect = make_buffers(c, ts, Collection{k.target.model, "expect", k.target.train, k.target.units}, true);
  for (const Transfer& t : transfers) {
    if (t.fp8 != nereus::Fp8Move::none) continue;  // FP8 bytes: the planner's counts only, checked above
    const std::string src_name = nereus::buffer_name(m, t.src_view.buffer, t.src_view.packing, t.src_view.expert_groups);
    const std::string dst_name = nereus::buffer_name(m, t.dst_view.buffer, t.dst_view.packing, t.dst_view.expert_groups);
    const auto& sb = src_bufs[t.source].find({t.src, src_name, t.slot});
    auto db = dst_bufs.find({t.dst, dst_name, t.slot});
    REQUIRE_MESSAGE(sb != src_bufs[t.source].end(), "no reference buffer ", src_name, " on device ", t.src);
    REQUIRE_MESSAGE(db != dst_bufs.end(), "no reference buffer ", dst_name, " on device ", t.dst);
    REQUIRE_MESSAGE(apply(t, slot_width(c, ts[ref_index.at(m.tensor(t.tensor).name)], t.slot), sb->second, db->second),
                    "view outside its buffer: ",
                    m.tensor(t.tensor).name, " box ", t.box.to_string(), " src off ", t.src_view.view.offset,
                    " dst off ", t.dst_view.view.offset, " sizes ", sb->second.data.size(), " ", db->second.data.size());
  }
  for (const auto& entry : dst_bufs) {
    const auto& key = entry.first;  // not structured bindings: CHECK_MESSAGE uses them in a lambda
    const auto& b = entry.second;
    const auto& want = expect.at(key);
    if (fp8_on(std::get<0>(key)) && ref::quantized(ts[b.layout.parts.front().first])) continue;
    CHECK_MESSAGE(b.data == want.data, "wrong bytes in ", std::get<1>(key), " on device ", std::get<0>(key));
  }

  // Same inputs, same plan.
  const auto again = nereus::plan_reshard(k.sources, k.target, opt).transfers();
  REQUIRE(again.size() == transfers.size());
  bool same = true;
  for (std::size_t i = 0; i < again.size(); ++i) {
    const Transfer &a = again[i], &b = transfers[i];
    same = same && a.src == b.src && a.dst == b.dst && a.source == b.source && a.tensor == b.tensor &&
           a.slot == b.slot && a.box == b.box && a.bytes == b.bytes && a.keep == b.keep &&
           a.src_view.view.offset == b.src_view.view.offset && a.dst_view.view.offset == b.dst_view.view.offset &&
           a.src_view.view.strides == b.src_view.view.strides && a.dst_view.view.strides == b.dst_view.view.strides;
  }
  CHECK_MESSAGE(same, "planning twice gave different transfers");
}

const std::vector<std::string> kModels{"tiny-llama", "tiny-qwen2-tied", "tiny-qwen3", "tiny-llama-bias"};
const std::vector<std::string> kMoeModels{"tiny-qwen3-moe", "tiny-moe-odd", "tiny-deepseek-v3", "tiny-mla-odd"};

/// Random cases whose target GPUs the placement optimiser reorders first.
void check_with_placement(std::uint64_t seed, const std::vector<std::string>& models, int n, int max_fsdp = 1) {
  testcase::Generator gen(seed);
  gen.max_fsdp = max_fsdp;
  for (int i = 0; i < n; ++i) {
    auto k = gen.next(models);
    CAPTURE(i);
    nereus::ReshardOptions opt;
    opt.links.gpus_per_node = k.gpus_per_node;
    const auto before = nereus::plan_reshard(k.sources, k.target, opt).summary().moved_bytes;
    k.target = nereus::optimize_placement(k.sources, k.target, k.gpus_per_node);
    check_case(k);
    CHECK(nereus::plan_reshard(k.sources, k.target, opt).summary().moved_bytes <= before);
  }
}

}  // namespace

// Under the sanitizers (scripts/test.sh runs this test there only) half the dense cases,
// the first half of the same sequence; the full 240 in a tree without them.
constexpr int kDenseCases = testing::cases(240, 120);

TEST_CASE("random transitions: coverage, lower bound, sources, bytes, determinism") {
  testcase::Generator gen(0x5eed);
  for (int i = 0; i < kDenseCases; ++i) {
    const auto k = gen.next(kModels);
    CAPTURE(i);
    check_case(k);
  }
}

TEST_CASE("random transitions with optimised placement keep every property and never move more") {
  check_with_placement(0xb1ac, kModels, 60);
}

TEST_CASE("random MoE transitions (ep, etp, uneven experts and Ie): coverage, lower bound, sources, bytes") {
  testcase::Generator gen(0x30e);
  int with_ep = 0, expert_tp_differs = 0, straddling = 0;
  for (int i = 0; i < 160; ++i) {
    const auto k = gen.next(kMoeModels);
    CAPTURE(i);
    check_case(k);
    for (const auto* c : {&k.target, &k.sources[0]})
      for (const auto& u : c->units) {
        const auto l = to_ref(u.layout);
        with_ep += l.ep > 1;
        expert_tp_differs += l.expert_tp() != l.tp;
        straddling += l.tp % l.expert_tp() != 0;  // groups that straddle two ep ranks
      }
  }
  // The generator reaches the cases the rules single out.
  CHECK(with_ep > 50);
  CHECK(expert_tp_differs > 50);
  CHECK(straddling > 5);
}

TEST_CASE("random MoE transitions with optimised placement keep every property and never move more") {
  check_with_placement(0x30f, kMoeModels, 40);
}

namespace {

/// The case on a copy of its model whose FP8 block grid is [bo, bi].
testcase::Case with_blocks(testcase::Case k, std::int64_t bo, std::int64_t bi) {
  nereus::ModelConfig cfg = k.model->config();
  cfg.fp8_block = {bo, bi};
  auto m = std::make_shared<const nereus::ModelSpec>(k.model->name(), cfg);
  k.model = m;
  for (auto& s : k.sources) s.model = m;
  k.target.model = m;
  return k;
}

/// Whether a split of a quantized weight in `coll` cuts an FP8 block (the reference's reading).
bool cuts_a_block(const nereus::ModelConfig& c, const std::vector<ref::Tensor>& ts, const Collection& coll) {
  bool cut = false;
  for (const auto& u : coll.units)
    each_position(u, [&](int s, int g, nereus::DeviceId) {
      for (const ref::Tensor& t : ts)
        if (ref::quantized(t))
          if (auto b = ref::shard(c, t, to_ref(u.layout), s, g)) cut = cut || !ref::block_aligned(c, t, *b);
    });
  return cut;
}

/// Whether a split in the case's FP8 target, or in a source feeding it, cuts a block (the
/// reference's reading); then the planner must refuse it with the block error.
bool refused_for_a_cut(const testcase::Case& k) {
  const nereus::ModelConfig& c = k.model->config();
  const auto ts = ref::tensors(c);
  bool cut = cuts_a_block(c, ts, k.target);
  for (const Collection& src : k.sources) cut = cut || cuts_a_block(c, ts, src);
  if (!cut) return false;
  const std::string e = testing::error_of([&] { (void)nereus::plan_reshard(k.sources, k.target); });
  CHECK_MESSAGE(testing::has(e, "inside an FP8 block"), e);
  return true;
}

/// The plan's FP8 transfers as the executor moves them: weight bytes and scales that add up
/// to what was planned, each bf16 box quantized once; then real bytes, quantized by the
/// sender, moved by the local transport and checked against sharding.md's fill.
void moves_fp8_bytes(const nereus::ReshardPlan& plan) {
  const auto planned = plan.transfers();
  std::vector<nereus::DeviceId> all;
  for (const auto& s : plan.sources()) for (auto d : s.devices()) all.push_back(d);
  for (auto d : plan.target().devices()) all.push_back(d);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const nereus::ExecutableTransfers moves = nereus::executable_transfers(plan, all);
  std::uint64_t want = 0, got = 0;
  std::size_t quantized = 0;
  std::set<std::tuple<std::uint32_t, nereus::DeviceId, nereus::TensorId, std::int64_t, std::int64_t, std::int64_t, std::int64_t>> boxes;
  for (const auto& t : planned) {
    want += t.bytes;
    if (t.fp8 != nereus::Fp8Move::quantize) continue;
    ++quantized;
    boxes.insert({t.source, t.src, t.tensor, t.box.dims[0].lo, t.box.dims[0].hi, t.box.dims[1].lo, t.box.dims[1].hi});
  }
  std::size_t scales = 0;
  for (const auto& t : moves.transfers) {
    got += t.bytes;
    CHECK(t.fp8 == nereus::Fp8Move::none);
    if (t.slot != nereus::Slot::scale) continue;
    ++scales;
    const auto& b = t.box.dims;
    CHECK(t.bytes == static_cast<std::uint64_t>(4 * (b[0].size() * b[1].size())));
  }
  CHECK(got == want);  // the planner's FP8 bytes: one per element, four per block
  CHECK(moves.quantize.size() == boxes.size());
  CHECK(scales >= quantized);
  nereus::UnitStore store(plan, all, 0, 0);
  store.allocate_and_fill(1);
  if (store.quantizes()) store.quantize(2);
  boost::asio::io_context io;
  nereus::LocalTransport local({1, 1 << 16});
  nereus::Executor ex(local, nullptr, [](nereus::DeviceId) { return nereus::PeerId{0}; });
  (void)testing::run_on(io, ex.run(ex.bind(store.transfers(), plan.target(), store.table())));
  const nereus::FillCheck targets = store.verify_targets(1), sources = store.verify_sources(1);
  CHECK_MESSAGE(targets.ok, targets.first_error);
  CHECK_MESSAGE(sources.ok, sources.first_error);
}

}  // namespace

TEST_CASE("random FP8 targets (dtype=fp8, from the config's dtype and from FP8): bytes and lower bound per block, refusals") {
  testcase::Generator gen(0xf8);
  std::vector<std::string> models = kModels;
  models.insert(models.end(), kMoeModels.begin(), kMoeModels.end());
  const std::int64_t sizes[] = {1, 2, 4, 8, 16};
  int planned = 0, refused = 0, from_fp8 = 0;
  for (int i = 0; i < testing::cases(200, 100); ++i) {
    auto k = with_blocks(gen.next(models), sizes[gen.uniform(0, 4)], sizes[gen.uniform(0, 4)]);
    k.target.train = false;
    for (auto& u : k.target.units) u.layout.fp8 = true;
    bool any_fp8_source = false;
    for (auto& src : k.sources)
      if (!src.train && gen.coin(0.4)) {
        for (auto& u : src.units) u.layout.fp8 = true;
        any_fp8_source = true;
      }
    CAPTURE(i);
    INFO(k.describe());
    if (refused_for_a_cut(k)) {
      ++refused;
      continue;
    }
    check_case(k);
    ++planned;
    from_fp8 += any_fp8_source;
    // What the transition graph and the cost model count a position as holding agrees
    // with the planner's destination bytes.
    nereus::UnitGeometry geometry(k.model);
    std::uint64_t held = 0;
    for (const auto& u : k.target.units)
      for (int s = 0; s < u.layout.pp; ++s)
        for (int r = 0; r < u.layout.stage_size(); ++r) held += geometry.held(nereus::Position{&u.layout, s, r}).bytes(false);
    const auto plan = nereus::plan_reshard(k.sources, k.target);
    CHECK(held == plan.summary().target_bytes);
    moves_fp8_bytes(plan);
  }
  // The generator reaches both sides of the rule, and FP8 → FP8 moves.
  CHECK(planned > testing::cases(40, 20));
  CHECK(refused > testing::cases(20, 10));
  CHECK(from_fp8 > testing::cases(10, 5));
}

TEST_CASE("FP8 refusals: a training collection, FP8 into the config's dtype") {
  auto m = testcase::model("tiny-qwen3");
  auto spec = nereus::parse_collection_spec("tp=1,pp=1,dp=1,dtype=fp8");
  CHECK(testing::has(testing::error_of([&] { (void)Collection::from_spec(m, "actor/train", spec, true); }),
                     "dtype=fp8 on a training collection"));
  const Collection fp8 = Collection::from_spec(m, "actor/generate", spec, false);
  const Collection plain = Collection::from_spec(m, "actor/infer", nereus::parse_collection_spec("tp=2,pp=1,dp=1,devices=4-5"), false);
  CHECK(testing::has(testing::error_of([&] { (void)nereus::plan_reshard(fp8, plain); }), "dequantizing FP8 units is not supported"));
  // tiny-qwen3's gate_proj has 96 rows: tp=2 cuts at 48, inside a 128-row block.
  const std::string e = testing::error_of(
      [&] { (void)Collection::from_spec(m, "actor/generate", nereus::parse_collection_spec("tp=2,pp=1,dp=1,dtype=fp8"), false); });
  CHECK_MESSAGE(testing::has(e, "inside an FP8 block of 128 rows"), e);
  CHECK_MESSAGE(testing::has(e, "weight_block_size [128, 128]"), e);
  CHECK(testing::has(testing::error_of([] { (void)nereus::parse_collection_spec("tp=1,pp=1,dp=1,dtype=bf16"); }), "dtype=bf16 is not fp8"));
}

TEST_CASE("random FSDP transitions (fsdp on either side, uneven chunks, training slots): coverage, lower bound, real bytes") {
  testcase::Generator gen(0xf5d9);
  gen.max_fsdp = 5;  // 5 chunks of 48 or 64 rows: uneven and, with tp, sometimes empty
  int src_fsdp = 0, dst_fsdp = 0, both = 0, empty_chunks = 0, train = 0;
  for (int i = 0; i < testing::cases(160, 80); ++i) {
    const auto k = gen.next(kModels);
    CAPTURE(i);
    check_case(k);
    bool s = false, d = false;
    for (const auto& src : k.sources)
      for (const auto& u : src.units) s = s || u.layout.fsdp > 1;
    for (const auto& u : k.target.units) {
      d = d || u.layout.fsdp > 1;
      const auto l = to_ref(u.layout);
      for (int g = 0; g < l.tp * l.fsdp; ++g)
        for (const auto& t : ref::tensors(k.model->config()))
          if (t.layer == 0 && !ref::shard(k.model->config(), t, l, 0, g)) ++empty_chunks;
    }
    src_fsdp += s, dst_fsdp += d, both += s && d, train += k.target.train && d;
    // The transition graph and the cost model count what a position holds as the planner does.
    nereus::UnitGeometry geometry(k.model);
    std::uint64_t held = 0;
    for (const auto& u : k.target.units)
      for (int st = 0; st < u.layout.pp; ++st)
        for (int r = 0; r < u.layout.stage_size(); ++r) held += geometry.held(nereus::Position{&u.layout, st, r}).bytes(k.target.train);
    const auto plan = nereus::plan_reshard(k.sources, k.target);
    CHECK(held == plan.summary().target_bytes);
    if (i % 4 == 0) moves_fp8_bytes(plan);  // the executor over the fill, verified on both sides
  }
  CHECK(src_fsdp > testing::cases(60, 30));
  CHECK(dst_fsdp > testing::cases(60, 30));
  CHECK(both > testing::cases(20, 10));
  CHECK(train > testing::cases(20, 10));
  CHECK(empty_chunks > 0);
}

TEST_CASE("random FSDP transitions with optimised placement keep every property and never move more") {
  check_with_placement(0xf5da, kModels, 40, 4);
}

TEST_CASE("FSDP sources into FP8 targets: block-aligned chunks planned at the lower bound, others refused") {
  testcase::Generator gen(0xf5f8);
  gen.max_fsdp = 4;
  gen.fsdp_target = false;
  const std::int64_t sizes[] = {1, 2, 4, 8, 16};
  int planned = 0, refused = 0;
  for (int i = 0; i < testing::cases(120, 60); ++i) {
    auto k = with_blocks(gen.next(kModels), sizes[gen.uniform(0, 4)], sizes[gen.uniform(0, 4)]);
    k.target.train = false;
    for (auto& u : k.target.units) u.layout.fp8 = true;
    CAPTURE(i);
    INFO(k.describe());
    if (refused_for_a_cut(k)) {
      ++refused;
      continue;
    }
    check_case(k);
    moves_fp8_bytes(nereus::plan_reshard(k.sources, k.target));
    ++planned;
  }
  CHECK(planned > testing::cases(20, 10));
  CHECK(refused > testing::cases(20, 10));
}

TEST_CASE("random Megatron-packed transitions (interleaved linear_qkv, [gate; up] linear_fc1, local experts; FSDP and fused sides)") {
  testcase::Generator gen(0x3e6a);
  gen.megatron = true;
  gen.max_fsdp = 3;
  const std::vector<std::string> models{"tiny-llama", "tiny-qwen2-tied", "tiny-qwen3", "tiny-llama-bias", "tiny-qwen3-moe", "tiny-moe-odd"};
  int megatron_src = 0, megatron_dst = 0, groups_split = 0, moe = 0;
  for (int i = 0; i < testing::cases(200, 100); ++i) {
    const auto k = gen.next(models);
    CAPTURE(i);
    check_case(k);
    if (i % 4 == 0) moves_fp8_bytes(nereus::plan_reshard(k.sources, k.target));  // UnitStore's blocks through the executor
    for (const auto& src : k.sources)
      for (const auto& u : src.units) {
        megatron_src += u.layout.packing == nereus::Packing::megatron;
        moe += u.layout.packing == nereus::Packing::megatron && k.model->config().experts > 0;
      }
    for (const auto& u : k.target.units) megatron_dst += u.layout.packing == nereus::Packing::megatron;
    const auto& c = k.model->config();
    for (const auto& u : k.target.units) {
      groups_split += u.layout.packing == nereus::Packing::megatron && c.kv_heads / u.layout.tp > 1;
      moe += u.layout.packing == nereus::Packing::megatron && c.experts > 0;
    }
  }
  CHECK(moe > testing::cases(20, 10));
  CHECK(megatron_src > testing::cases(40, 20));
  CHECK(megatron_dst > testing::cases(40, 20));
  CHECK(groups_split > testing::cases(20, 10));  // ranks with several query groups: boxes split per group
}
