#include "nereus/runtime/unit_store.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <type_traits>

#include "nereus/base/error.hpp"
#include "nereus/core/fill.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/core/sharding.hpp"
#include "nereus/runtime/quantize_pass.hpp"
#include "on_threads.hpp"

namespace nereus {

std::uint64_t BufferSpec::bytes() const {
  std::int64_t n = 0;
  for (const Part& p : parts) n = std::max(n, p.base + p.shard.elements());
  return static_cast<std::uint64_t>(n) * width(dtype);
}

std::vector<BufferSpec> collection_buffers(const Collection& c, std::uint32_t side, std::span<const DeviceId> devices,
                                           bool as_fp8) {
  const std::set<DeviceId> want(devices.begin(), devices.end());
  const ModelSpec& m = *c.model;
  std::vector<BufferSpec> out;
  for (const Emu& u : c.units)
    for (int s = 0; s < u.layout.pp; ++s)
      for (int g = 0; g < u.layout.stage_size(); ++g) {
        const DeviceId d = u.device(s, g);
        if (!want.count(d)) continue;
        std::map<TensorId, std::vector<BufferSpec::Part>> parts;
        for (TensorId t = 0; t < m.tensors().size(); ++t) {
          if (!shard_box(m.config(), u.layout, s, g, m.tensor(t))) continue;
          const ShardPlace p = place_shard(m, t, u.layout, g);
          for (int j = 0; j < p.groups; ++j) parts[p.buffer].push_back({t, p.block(j), p.block_base(j)});  // Megatron: a block per query group
        }
        for (auto& [lead, ps] : parts) {
          // In buffer order (Megatron's blocks interleave the tensors), as dumps list them.
          std::stable_sort(ps.begin(), ps.end(), [](const BufferSpec::Part& a, const BufferSpec::Part& b) { return a.base < b.base; });
          // A buffer's parts are one fused group, so its first tensor says whether all are FP8.
          const bool fp8 = (u.layout.fp8 || as_fp8) && quantizable(m.tensor(lead));
          if (as_fp8 && !fp8) continue;
          for (Slot slot : c.slots()) {
            if (!fp8 || slot != Slot::param) {
              if (!as_fp8) out.push_back({{side, d, lead, slot}, slot_dtype(slot, m.tensor(lead).dtype), u.layout.packing, ps, u.layout.expert_groups()});
              continue;
            }
            out.push_back({{side, d, lead, Slot::param}, DType::e4m3, u.layout.packing, ps, u.layout.expert_groups()});
            std::vector<BufferSpec::Part> scales;
            for (const auto& p : ps) {
              const ShardPlace q = place_scale(m, p.tensor, u.layout, g);
              scales.push_back({p.tensor, q.shard, q.base});
            }
            out.push_back({{side, d, lead, Slot::scale}, DType::f32, u.layout.packing, std::move(scales), u.layout.expert_groups()});
          }
        }
      }
  return out;
}

namespace {

/// Calls f(pointer, fill value) for every element of one part of a buffer, in buffer order.
template <class F>
void for_each_fill_element(const ModelSpec& m, const BufferSpec& b, const BufferSpec::Part& part, const std::byte* base,
                           F&& f) {
  const TensorInfo& info = m.tensor(part.tensor);
  const std::uint32_t w = width(b.dtype);
  const std::uint64_t seed = fill_seed(info.name, to_string(b.key.slot));
  const std::int64_t cols = info.rank == 2 ? info.shape[1] : 1;
  const Range rows = part.shard.dims[0];
  const Range cr = info.rank == 2 ? part.shard.dims[1] : Range{0, 1};
  const std::byte* p = base + static_cast<std::size_t>(part.base) * w;
  for (std::int64_t i = rows.lo; i < rows.hi; ++i)
    for (std::int64_t j = cr.lo; j < cr.hi; ++j, p += w)
      if (!f(p, fill_value(seed, static_cast<std::uint64_t>(i * cols + j)), i, j)) return;
}

}  // namespace

void FillCheck::merge(const FillCheck& o) {
  buffers += o.buffers;
  bytes += o.bytes;
  if (!o.ok && ok) first_error = o.first_error;
  ok = ok && o.ok;
}

namespace {

/// An element's bytes as an integer (little-endian host), for fixed widths 2 and 4.
template <std::uint32_t W>
struct Element {
  using type = std::conditional_t<W == 2, std::uint16_t, std::uint32_t>;
  static void store(std::byte* p, std::uint64_t v) {
    const auto x = static_cast<type>(v);
    std::memcpy(p, &x, W);
  }
  static bool equal(const std::byte* p, std::uint64_t v) {
    type x;
    std::memcpy(&x, p, W);
    return x == static_cast<type>(v);
  }
};

template <std::uint32_t W>
void fill_part(const ModelSpec& m, const BufferSpec& b, const BufferSpec::Part& part, std::byte* base) {
  for_each_fill_element(m, b, part, base, [](const std::byte* p, std::uint64_t v, std::int64_t, std::int64_t) {
    Element<W>::store(const_cast<std::byte*>(p), v);
    return true;
  });
}

}  // namespace

namespace {

bool holds_fp8(const BufferSpec& b) { return b.dtype == DType::e4m3 || b.key.slot == Slot::scale; }

/// The bytes one part of an FP8 weight or scale buffer holds under the fill: its weight
/// box quantized block by block (a scale part's weight box spans its blocks, which the
/// block rule keeps inside the tensor's shard).
std::vector<std::byte> fp8_part_bytes(const ModelSpec& m, const BufferSpec& b, const BufferSpec::Part& part) {
  const TensorInfo& info = m.tensor(part.tensor);
  const ModelConfig& cfg = m.config();
  Box w = part.shard;
  if (b.key.slot == Slot::scale)
    for (int d = 0; d < 2; ++d) {
      const std::int64_t block = cfg.fp8_block[static_cast<std::size_t>(d)];
      w.dims[d] = {part.shard.dims[d].lo * block, std::min(part.shard.dims[d].hi * block, info.shape[d])};
    }
  std::vector<std::uint8_t> q(static_cast<std::size_t>(w.elements()));
  std::vector<float> scales(static_cast<std::size_t>(fp8_scale_box(cfg, w).elements()));
  fp8_fill(cfg, info, w, q.data(), scales.data());
  std::vector<std::byte> out(b.key.slot == Slot::scale ? scales.size() * 4 : q.size());
  std::memcpy(out.data(), b.key.slot == Slot::scale ? static_cast<const void*>(scales.data()) : q.data(), out.size());
  return out;
}

}  // namespace

void fill_buffer(const ModelSpec& m, const BufferSpec& b, std::byte* base) {
  for (const auto& part : b.parts) {
    if (holds_fp8(b)) {
      const std::vector<std::byte> want = fp8_part_bytes(m, b, part);
      std::memcpy(base + static_cast<std::size_t>(part.base) * width(b.dtype), want.data(), want.size());
    } else if (width(b.dtype) == 2) {
      fill_part<2>(m, b, part, base);
    } else {
      fill_part<4>(m, b, part, base);
    }
  }
}

FillCheck check_buffer(const ModelSpec& m, const BufferSpec& b, const std::byte* base) {
  FillCheck res;
  res.buffers = 1;
  res.bytes = b.bytes();
  auto differs = [&](const BufferSpec::Part& part, std::int64_t i0, std::int64_t j) {
    const TensorInfo& info = m.tensor(part.tensor);
    const bool scale = b.key.slot == Slot::scale;
    res.first_error = "device " + std::to_string(b.key.device) + " " + (scale ? scale_name(info) : info.name) + "@" +
                      std::string(to_string(scale ? Slot::param : b.key.slot)) + (scale ? " scale [" : " element [") +
                      std::to_string(i0) + "," + std::to_string(j) + "] differs from the fill" +
                      (b.dtype == DType::e4m3 ? " (FP8)" : "");
    res.ok = false;
  };
  const bool two = width(b.dtype) == 2;
  for (const auto& part : b.parts) {
    if (holds_fp8(b)) {
      const std::vector<std::byte> want = fp8_part_bytes(m, b, part);
      const std::byte* at = base + static_cast<std::size_t>(part.base) * width(b.dtype);
      if (std::memcmp(at, want.data(), want.size()) == 0) continue;
      std::size_t k = 0;
      while (at[k] == want[k]) ++k;
      const std::int64_t e = static_cast<std::int64_t>(k / width(b.dtype)), cols = part.shard.dims[1].size();
      differs(part, part.shard.dims[0].lo + e / cols, part.shard.dims[1].lo + e % cols);
      return res;
    }
    bool ok = true;
    for_each_fill_element(m, b, part, base, [&](const std::byte* p, std::uint64_t v, std::int64_t i0, std::int64_t j) {
      if (two ? Element<2>::equal(p, v) : Element<4>::equal(p, v)) return true;
      differs(part, i0, j);
      return ok = false;
    });
    if (!ok) break;
  }
  return res;
}

UnitStore::UnitStore(const ReshardPlan& plan, std::vector<DeviceId> devices, std::size_t capacity, PeerId self, ArenaSource* arenas,
                     MemoryKind kind, int gpus)
    : plan_(plan), mine_(std::move(devices)), capacity_(capacity), self_(self), arenas_(arenas), kind_(kind), gpus_(std::max(1, gpus)) {
  for (std::uint32_t c = 0; c < plan.sources().size(); ++c) {
    auto b = collection_buffers(plan.sources()[c], c, mine_);
    sources_.insert(sources_.end(), b.begin(), b.end());
  }
  targets_ = collection_buffers(plan.target(), kTargetSide, mine_);
  moves_ = executable_transfers(plan, mine_);
  staging_ = quantize_staging(plan, moves_.quantize, mine_);  // what our bf16 sources send to FP8 targets
}

namespace {

/// Faults in the pages of [p, p + n) for writing, without changing their bytes' meaning
/// (a target's bytes are all overwritten by its transition).
void commit_pages(std::byte* p, std::size_t n) {
  if (n == 0) return;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n + page - 1) / page * page;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (std::size_t off = 0; off < n; off += page) p[off] = std::byte{0};  // older kernels
}

}  // namespace

void UnitStore::allocate_and_fill(unsigned threads) {
  // Kept target buffers alias their source buffer: nothing to allocate or copy.
  std::map<BufferKey, BufferKey> alias;
  for (const Transfer& t : moves_.transfers)
    if (t.keep) alias[{kTargetSide, t.dst, t.dst_view.buffer, t.slot}] = {t.source, t.src, t.src_view.buffer, t.slot};
  std::map<DeviceId, std::uint64_t> need;
  for (const auto* list : {&sources_, &staging_})
    for (const auto& b : *list) need[b.key.device] += (b.bytes() + 255) / 256 * 256;
  for (const auto& b : targets_)
    if (!alias.count(b.key)) need[b.key.device] += (b.bytes() + 255) / 256 * 256;
  for (DeviceId d : mine_)
    devices_[d] = make_device({kind_, d, capacity_ ? capacity_ : need[d] + (1 << 20), kind_ == MemoryKind::host ? arenas_ : nullptr,
                               static_cast<int>(d) % gpus_});
  for (const auto* list : {&sources_, &staging_, &targets_})
    for (const auto& b : *list) {
      if (alias.count(b.key)) continue;
      memory_.push_back(devices_.at(b.key.device)->allocate(
          b.bytes(), std::string(b.key.side == kTargetSide ? "target " : is_quantized_side(b.key.side) ? "FP8 staging " : "source ") +
                         buffer_name(*plan_.target().model, b.key.buffer, b.packing, b.expert_groups) + "@" +
                         std::string(to_string(b.key.slot))));
      table_.bind(b.key, {reinterpret_cast<std::uint64_t>(memory_.back().data()), b.bytes(), self_, devices_.at(b.key.device)->kind()});
    }
  for (const auto& [t, s] : alias) table_.bind(t, *table_.find(s));

  // The fill: each part's elements in shard order, row-major in the buffer. Target
  // buffers are committed here too (pages faulted in, off any event loop): a transport
  // that copies inside its progress call (UCX gets from shared memory) would otherwise
  // take the page faults of first touch on its event loop, at several µs a page.
  const ModelSpec& m = *plan_.target().model;
  std::atomic<std::size_t> next{0};
  // Staging is committed like a target: the quantize pass writes all of it, timed.
  std::vector<const BufferSpec*> commit;
  for (const auto* list : {&staging_, &targets_})
    for (const auto& b : *list)
      if (!alias.count(b.key)) commit.push_back(&b);
  const std::size_t jobs = sources_.size() + commit.size();
  auto work = [&] {
    for (std::size_t i = next++; i < jobs; i = next++) {
      if (i < sources_.size() && kind_ != MemoryKind::host) {  // filled on the host, then uploaded
        const BufferSpec& b = sources_[i];
        std::vector<std::byte> staging(b.bytes());
        fill_buffer(m, b, staging.data());
        devices_.at(b.key.device)->upload(const_cast<std::byte*>(address(b)), staging.data(), staging.size());
      } else if (i < sources_.size()) {
        fill_buffer(m, sources_[i], const_cast<std::byte*>(address(sources_[i])));
      } else if (const BufferSpec& t = *commit[i - sources_.size()]; kind_ == MemoryKind::host) {
        commit_pages(const_cast<std::byte*>(address(t)), t.bytes());
      }
    }
  };
  detail::on_threads(threads, [&](unsigned) { work(); });
}

void UnitStore::quantize(unsigned threads) {
  run_quantize(*plan_.target().model, moves_.quantize, table_, kind_, gpus_, threads);
}

const std::byte* UnitStore::address(const BufferSpec& b) const {
  const BoundBuffer* x = table_.find(b.key);
  if (!x) throw Error("buffer not bound on device " + std::to_string(b.key.device));
  return reinterpret_cast<const std::byte*>(x->address);
}

template <class F>
auto UnitStore::on_host(const BufferSpec& b, F&& use) const {
  if (kind_ == MemoryKind::host) return use(address(b));
  std::vector<std::byte> copy(b.bytes());
  devices_.at(b.key.device)->download(copy.data(), address(b), copy.size());
  return use(static_cast<const std::byte*>(copy.data()));
}

FillCheck UnitStore::verify(const std::vector<BufferSpec>& bufs, unsigned threads) const {
  const ModelSpec& m = *plan_.target().model;
  std::atomic<std::size_t> next{0};
  std::vector<FillCheck> results(std::max(1u, threads));
  auto work = [&](FillCheck& res) {
    for (std::size_t i = next++; i < bufs.size(); i = next++)
      res.merge(on_host(bufs[i], [&](const std::byte* at) { return check_buffer(m, bufs[i], at); }));
  };
  detail::on_threads(static_cast<unsigned>(results.size()), [&](unsigned k) { work(results[k]); });
  FillCheck all;
  for (const auto& r : results) all.merge(r);
  return all;
}

FillCheck UnitStore::verify_targets(unsigned threads) const { return verify(targets_, threads); }
FillCheck UnitStore::verify_sources(unsigned threads) const { return verify(sources_, threads); }

nlohmann::json UnitStore::dump(const std::string& dir) const {
  namespace fs = std::filesystem;
  const ModelSpec& m = *plan_.target().model;
  auto files = nlohmann::json::array();
  auto box_json = [](const Box& b) {
    auto a = nlohmann::json::array();
    for (int d = 0; d < b.rank; ++d) a.push_back({b.dims[d].lo, b.dims[d].hi});
    return a;
  };
  for (const BufferSpec& b : targets_) {
    // A scale buffer is written as the checkpoint's own tensor: `…weight_scale_inv`, slot param.
    const bool scale = b.key.slot == Slot::scale;
    const std::string name = scale ? scale_buffer_name(m, b.key.buffer, b.packing) : buffer_name(m, b.key.buffer, b.packing, b.expert_groups);
    const std::string slot(to_string(scale ? Slot::param : b.key.slot));
    const std::string rel = std::to_string(b.key.device) + "/" + name + "@" + slot + ".bin";
    fs::create_directories(fs::path(dir) / std::to_string(b.key.device));
    std::ofstream out(fs::path(dir) / rel, std::ios::binary);
    on_host(b, [&](const std::byte* at) { out.write(reinterpret_cast<const char*>(at), static_cast<std::streamsize>(b.bytes())); });
    if (!out) throw Error("cannot write " + (fs::path(dir) / rel).string());
    nlohmann::json e = {{"file", rel},
                        {"device", b.key.device},
                        {"slot", slot},
                        {"dtype", std::string(to_string(b.dtype))}};
    if (b.parts.size() == 1) {
      const TensorInfo& t = m.tensor(b.parts[0].tensor);
      e["tensor"] = scale ? scale_name(t) : t.name;
      if (e["tensor"] != name) e["buffer"] = name;  // Megatron's names for one tensor's buffer
      e["box"] = box_json(b.parts[0].shard);
    } else {  // a fused buffer: its parts in order instead of tensor/box
      auto parts = nlohmann::json::array();
      for (const auto& p : b.parts)
        parts.push_back({{"tensor", scale ? scale_name(m.tensor(p.tensor)) : m.tensor(p.tensor).name}, {"box", box_json(p.shard)}});
      e["buffer"] = name;
      e["parts"] = std::move(parts);
    }
    files.push_back(std::move(e));
  }
  return files;
}

std::size_t UnitStore::peak_bytes() const {
  std::size_t p = 0;
  for (const auto& [d, dev] : devices_) p = std::max(p, dev->peak());
  return p;
}

}  // namespace nereus
