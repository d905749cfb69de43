#include "nereus/runtime/unit_store.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include "nereus/base/error.hpp"
#include "nereus/core/fill.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/core/sharding.hpp"

namespace nereus {

std::uint64_t BufferSpec::bytes() const {
  std::int64_t n = 0;
  for (const Part& p : parts) n = std::max(n, p.base + p.shard.elements());
  return static_cast<std::uint64_t>(n) * width(dtype);
}

std::vector<BufferSpec> collection_buffers(const Collection& c, std::uint32_t side, std::span<const DeviceId> devices) {
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
          parts[p.buffer].push_back({t, p.shard, p.base});
        }
        for (const auto& [lead, ps] : parts)
          for (Slot slot : c.slots())
            out.push_back({{side, d, lead, slot}, slot_dtype(slot, m.tensor(lead).dtype), u.layout.packing, ps});
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

void fill_buffer(const ModelSpec& m, const BufferSpec& b, std::byte* base) {
  for (const auto& part : b.parts) {
    if (width(b.dtype) == 2) fill_part<2>(m, b, part, base);
    else fill_part<4>(m, b, part, base);
  }
}

FillCheck check_buffer(const ModelSpec& m, const BufferSpec& b, const std::byte* base) {
  FillCheck res;
  res.buffers = 1;
  res.bytes = b.bytes();
  const bool two = width(b.dtype) == 2;
  for (const auto& part : b.parts)
    for_each_fill_element(m, b, part, base, [&](const std::byte* p, std::uint64_t v, std::int64_t i0, std::int64_t j) {
      if (two ? Element<2>::equal(p, v) : Element<4>::equal(p, v)) return true;
      res.first_error = "device " + std::to_string(b.key.device) + " " + m.tensor(part.tensor).name + "@" +
                        std::string(to_string(b.key.slot)) + " element [" + std::to_string(i0) + "," + std::to_string(j) +
                        "] differs from the fill";
      res.ok = false;
      return false;
    });
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

/// Runs work(k) for k = 0 here and 1..threads-1 on threads of their own, then rethrows
/// the first exception once every thread has ended (a device without memory, a failed
/// upload): an exception must neither leave a thread joinable nor escape one.
template <class F>
void on_threads(unsigned threads, F work) {
  std::mutex m;
  std::exception_ptr first;
  auto guarded = [&](unsigned k) {
    try {
      work(k);
    } catch (...) {
      const std::lock_guard lock(m);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (unsigned k = 1; k < std::max(1u, threads); ++k) pool.emplace_back(guarded, k);
  } catch (...) {  // no thread to be had: the ones started still run to their end
    for (auto& t : pool) t.join();
    throw;
  }
  guarded(0);
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace

void UnitStore::allocate_and_fill(unsigned threads) {
  // Kept target buffers alias their source buffer: nothing to allocate or copy.
  std::map<BufferKey, BufferKey> alias;
  for (const Transfer& t : plan_.transfers_touching(mine_))
    if (t.keep) alias[{kTargetSide, t.dst, t.dst_view.buffer, t.slot}] = {t.source, t.src, t.src_view.buffer, t.slot};
  std::map<DeviceId, std::uint64_t> need;
  for (const auto& b : sources_) need[b.key.device] += (b.bytes() + 255) / 256 * 256;
  for (const auto& b : targets_)
    if (!alias.count(b.key)) need[b.key.device] += (b.bytes() + 255) / 256 * 256;
  for (DeviceId d : mine_)
    devices_[d] = make_device({kind_, d, capacity_ ? capacity_ : need[d] + (1 << 20), kind_ == MemoryKind::host ? arenas_ : nullptr,
                               static_cast<int>(d) % gpus_});
  for (const auto* list : {&sources_, &targets_})
    for (const auto& b : *list) {
      if (alias.count(b.key)) continue;
      memory_.push_back(devices_.at(b.key.device)->allocate(
          b.bytes(), std::string(b.key.side == kTargetSide ? "target " : "source ") +
                         buffer_name(*plan_.target().model, b.key.buffer, b.packing) + "@" +
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
  const std::size_t jobs = sources_.size() + targets_.size();
  auto work = [&] {
    for (std::size_t i = next++; i < jobs; i = next++) {
      if (i < sources_.size() && kind_ != MemoryKind::host) {  // filled on the host, then uploaded
        const BufferSpec& b = sources_[i];
        std::vector<std::byte> staging(b.bytes());
        fill_buffer(m, b, staging.data());
        devices_.at(b.key.device)->upload(const_cast<std::byte*>(address(b)), staging.data(), staging.size());
      } else if (i < sources_.size()) {
        fill_buffer(m, sources_[i], const_cast<std::byte*>(address(sources_[i])));
      } else if (const BufferSpec& t = targets_[i - sources_.size()]; !alias.count(t.key) && kind_ == MemoryKind::host) {
        commit_pages(const_cast<std::byte*>(address(t)), t.bytes());
      }
    }
  };
  on_threads(threads, [&](unsigned) { work(); });
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
  on_threads(static_cast<unsigned>(results.size()), [&](unsigned k) { work(results[k]); });
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
    const std::string name = buffer_name(m, b.key.buffer, b.packing);
    const std::string rel = std::to_string(b.key.device) + "/" + name + "@" + std::string(to_string(b.key.slot)) + ".bin";
    fs::create_directories(fs::path(dir) / std::to_string(b.key.device));
    std::ofstream out(fs::path(dir) / rel, std::ios::binary);
    on_host(b, [&](const std::byte* at) { out.write(reinterpret_cast<const char*>(at), static_cast<std::streamsize>(b.bytes())); });
    if (!out) throw Error("cannot write " + (fs::path(dir) / rel).string());
    nlohmann::json e = {{"file", rel},
                        {"device", b.key.device},
                        {"slot", std::string(to_string(b.key.slot))},
                        {"dtype", std::string(to_string(b.dtype))}};
    if (b.parts.size() == 1) {
      e["tensor"] = name;
      e["box"] = box_json(b.parts[0].shard);
    } else {  // a fused buffer: its parts in order instead of tensor/box
      auto parts = nlohmann::json::array();
      for (const auto& p : b.parts) parts.push_back({{"tensor", m.tensor(p.tensor).name}, {"box", box_json(p.shard)}});
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
