#include "cuda_ipc.hpp"

#include <algorithm>
#include <cstring>

namespace nereus::detail {

namespace {

constexpr std::uint32_t kMagic = 0x3243504e;  // "NPC2": a region within an allocation
constexpr std::size_t kKeyBytes = 4 + 4 + 8 + 8 + 8 + IpcKey::kHandleBytes;

}  // namespace

std::vector<std::byte> IpcKey::encode() const {
  std::vector<std::byte> out(kKeyBytes);
  std::byte* at = out.data();
  auto put = [&](const auto& v) {
    std::memcpy(at, &v, sizeof v);
    at += sizeof v;
  };
  put(kMagic);
  put(pid);
  put(base);
  put(size);
  put(allocation);
  std::memcpy(at, handle.data(), handle.size());
  return out;
}

std::optional<IpcKey> IpcKey::decode(std::span<const std::byte> in) {
  if (in.size() != kKeyBytes) return std::nullopt;
  const std::byte* at = in.data();
  auto get = [&](auto& v) {
    std::memcpy(&v, at, sizeof v);
    at += sizeof v;
  };
  std::uint32_t magic = 0;
  IpcKey k;
  get(magic);
  if (magic != kMagic) return std::nullopt;
  get(k.pid);
  get(k.base);
  get(k.size);
  get(k.allocation);
  std::memcpy(k.handle.data(), at, k.handle.size());
  if (k.base < k.allocation || k.base + k.size < k.base) return std::nullopt;
  return k;
}

IpcRegions::~IpcRegions() {
  for (auto& [key, m] : mappings_)
    if (m.opened) close_(m.at);
}

void IpcRegions::release(const Region& r) {
  auto it = mappings_.find(r.allocation);
  if (it == mappings_.end() || --it->second.regions > 0) return;
  if (it->second.opened) close_(it->second.at);
  mappings_.erase(it);
}

Status IpcRegions::add(PeerId peer, DeviceId device, const IpcKey& key, std::uint32_t own_pid) {
  std::map<std::uint64_t, Region>& regions = regions_[{peer, device}];
  // The peer restarted: the regions of its earlier process are gone with it.
  if (!regions.empty() && std::get<1>(regions.begin()->second.allocation) != key.pid) {
    for (const auto& [base, r] : regions) release(r);
    regions.clear();
  }
  const AllocationKey allocation{peer, key.pid, key.allocation};
  auto m = mappings_.find(allocation);
  if (m == mappings_.end()) {
    Mapping fresh{reinterpret_cast<std::byte*>(key.allocation), false, 0};
    if (key.pid != own_pid) {
      if (Status st = open_(key, fresh.at); !st) {
        if (regions.empty()) regions_.erase({peer, device});
        return st;
      }
      fresh.opened = true;
    }
    m = mappings_.emplace(allocation, fresh).first;
  }
  ++m->second.regions;  // before releasing a region it replaces, which may share the mapping
  if (auto same = regions.find(key.base); same != regions.end()) {
    release(same->second);
    regions.erase(same);
  }
  regions.emplace(key.base, Region{key.base, key.size, allocation});
  return Status::ok();
}

std::optional<std::uint64_t> IpcRegions::translate(PeerId peer, DeviceId device, std::uint64_t src,
                                                   std::uint64_t bytes) const {
  auto it = regions_.find({peer, device});
  if (it == regions_.end()) return std::nullopt;
  // The regions starting at or before src, nearest first: with disjoint regions (tensors)
  // the first holds the span or none does. Overlapping ones (views of one tensor) are tried
  // in turn; any that holds it translates it alike, as they share an allocation.
  const std::map<std::uint64_t, Region>& regions = it->second;
  for (auto r = regions.upper_bound(src); r != regions.begin();) {
    const Region& g = (--r)->second;
    if (src - g.base > g.size || bytes > g.size - (src - g.base)) continue;
    const Mapping& m = mappings_.at(g.allocation);
    return reinterpret_cast<std::uint64_t>(m.at) + (src - std::get<2>(g.allocation));
  }
  return std::nullopt;
}

std::size_t IpcRegions::mapped() const {
  return static_cast<std::size_t>(std::count_if(mappings_.begin(), mappings_.end(), [](const auto& kv) { return kv.second.opened; }));
}

}  // namespace nereus::detail
