#include "nereus/plan/placement.hpp"

#include <algorithm>
#include <map>

#include "assignment.hpp"
#include "reshard_index.hpp"

namespace nereus {

namespace {

/// Interns small integer vectors (profiles, signatures) as dense ids.
class Interner {
 public:
  int id(const std::vector<int>& key) {
    auto [it, fresh] = ids_.try_emplace(key, static_cast<int>(ids_.size()));
    return it->second;
  }
  int size() const { return static_cast<int>(ids_.size()); }

 private:
  std::map<std::vector<int>, int> ids_;
};

struct PlacedRank {
  int profile;        ///< (layout, stage, rank) id
  DeviceId home;      ///< device of the given order
  std::uint32_t unit;
  int slot;           ///< index s·tp·ep + g inside the unit's GPU list
};

constexpr std::int64_t kForbidden = -(std::int64_t{1} << 52);

}  // namespace

Collection optimize_placement(std::span<const Collection> sources, const Collection& target,
                              int gpus_per_node) {
  const ReshardIndex ix(sources, target, gpus_per_node);

  // Profiles: what a source position holds depends on (collection, layout, stage, rank);
  // what a target position needs on (layout, stage, rank).
  Interner src_prof, dst_prof;
  std::vector<int> holding_prof(ix.holdings.size());
  std::vector<std::array<int, 4>> src_keys;
  for (std::size_t i = 0; i < ix.holdings.size(); ++i) {
    const Holding& h = ix.holdings[i];
    const std::vector<int> key{static_cast<int>(h.c), h.layout, h.s, h.r};
    const int before = src_prof.size();
    holding_prof[i] = src_prof.id(key);
    if (src_prof.size() > before) src_keys.push_back({key[0], key[1], key[2], key[3]});
  }
  std::vector<PlacedRank> positions;
  std::vector<std::array<int, 3>> dst_keys;
  for (std::uint32_t u = 0; u < ix.target.units.size(); ++u) {
    const Emu& e = ix.target.units[u];
    for (int s = 0; s < e.layout.pp; ++s)
      for (int r = 0; r < e.layout.stage_size(); ++r) {
        const std::vector<int> key{ix.target_layout[u], s, r};
        const int before = dst_prof.size();
        const int id = dst_prof.id(key);
        if (dst_prof.size() > before) dst_keys.push_back({key[0], key[1], key[2]});
        positions.push_back({id, e.device(s, r), u, s * e.layout.stage_size() + r});
      }
  }

  // W[src profile][dst profile]: destination bytes a source position already holds.
  std::vector<std::vector<std::int64_t>> W(src_keys.size(), std::vector<std::int64_t>(dst_keys.size(), 0));
  for (const Template& t : ix.templates)
    for (const SlotGroup& g : ix.groups) {
      const std::int64_t tensors = static_cast<std::int64_t>(t.tensors.size()) * t.slab_width;
      for (std::size_t a = 0; a < src_keys.size(); ++a) {
        const auto [c, lay, s, r] = src_keys[a];
        if (!g.eligible[c] || !t.stages[lay].has(s)) continue;
        const Range have = ix.ranges(lay, t.cls)[r];
        if (have.empty()) continue;
        for (std::size_t b = 0; b < dst_keys.size(); ++b) {
          const auto [dlay, ds, dr] = dst_keys[b];
          if (!t.stages[dlay].has(ds)) continue;
          const auto per_elem = static_cast<std::int64_t>(g.bytes_per_element(t, ix.layouts[dlay].fp8)) * tensors;
          W[a][b] += have.intersect(ix.ranges(dlay, t.cls)[dr]).size() * per_elem;
        }
      }
    }

  // Device profiles: the multiset of source profiles on a device.
  Interner dev_prof;
  std::map<DeviceId, int> device_profile;
  std::vector<std::vector<std::int64_t>> DW;  // [device profile][dst profile]
  for (const PlacedRank& p : positions) {
    std::vector<int> key;
    for (std::uint32_t hi : ix.by_device.of(p.home)) key.push_back(holding_prof[hi]);
    std::sort(key.begin(), key.end());
    const int before = dev_prof.size();
    const int id = dev_prof.id(key);
    device_profile[p.home] = id;
    if (dev_prof.size() > before) {
      std::vector<std::int64_t> row(dst_keys.size(), 0);
      for (int sp : key)
        for (std::size_t b = 0; b < dst_keys.size(); ++b) row[b] += W[sp][b];
      DW.push_back(std::move(row));
    }
  }
  auto weight = [&](DeviceId d, const PlacedRank& p) { return DW[device_profile.at(d)][p.profile]; };

  // Blocks: the positions whose given device is on one node, and that node's devices.
  std::map<int, std::vector<int>> block_of_node;
  for (int i = 0; i < static_cast<int>(positions.size()); ++i)
    block_of_node[ix.node_of(positions[i].home)].push_back(i);
  std::vector<std::vector<int>> blocks;
  std::vector<std::vector<DeviceId>> node_devices;
  for (auto& [node, block] : block_of_node) {
    std::vector<DeviceId> devs;
    for (int i : block) devs.push_back(positions[i].home);
    std::sort(devs.begin(), devs.end());
    blocks.push_back(block);
    node_devices.push_back(std::move(devs));
  }
  const int n = static_cast<int>(blocks.size());

  // Best assignment of block b onto node m's devices, memoised by signature: symmetric
  // nodes (the common case at scale) are solved once.
  Interner block_sig, node_sig;
  std::vector<int> bsig(n), nsig(n);
  for (int b = 0; b < n; ++b) {
    std::vector<int> k;
    for (int i : blocks[b]) k.push_back(positions[i].profile);
    bsig[b] = block_sig.id(k);
    std::vector<int> d;
    for (DeviceId dev : node_devices[b]) d.push_back(device_profile.at(dev));
    nsig[b] = node_sig.id(d);
  }
  std::map<std::pair<int, int>, std::int64_t> memo;
  auto solve = [&](int b, int m, bool at_home) {
    const auto& block = blocks[b];
    const auto& devs = node_devices[m];
    const std::int64_t k = static_cast<std::int64_t>(block.size()) + 1;
    std::vector<std::vector<std::int64_t>> w(block.size(), std::vector<std::int64_t>(devs.size()));
    for (std::size_t i = 0; i < block.size(); ++i)
      for (std::size_t j = 0; j < devs.size(); ++j)
        w[i][j] = weight(devs[j], positions[block[i]]) * k +
                  (at_home && devs[j] == positions[block[i]].home ? 1 : 0);
    return max_weight_assignment(w);
  };
  auto value = [&](int b, int m) -> std::int64_t {
    if (blocks[b].size() != node_devices[m].size()) return kForbidden;
    auto [it, fresh] = memo.try_emplace({bsig[b], nsig[m]}, 0);
    if (fresh) {
      const auto cols = solve(b, m, false);
      for (std::size_t i = 0; i < cols.size(); ++i)
        it->second += weight(node_devices[m][cols[i]], positions[blocks[b][i]]);
    }
    return it->second;
  };
  std::vector<int> node_for(n);
  for (int b = 0; b < n; ++b) node_for[b] = b;
  if (n > 1) {
    std::vector<std::vector<std::int64_t>> v(n, std::vector<std::int64_t>(n));
    for (int b = 0; b < n; ++b)
      for (int m = 0; m < n; ++m) {
        const std::int64_t val = value(b, m);
        v[b][m] = val == kForbidden ? kForbidden : val * (n + 1) + (m == b ? 1 : 0);
      }
    node_for = max_weight_assignment(v);
  }

  Collection out = target;
  std::int64_t before = 0, after = 0;
  for (const PlacedRank& p : positions) before += weight(p.home, p);
  for (int b = 0; b < n; ++b) {
    const int m = node_for[b];
    const auto cols = solve(b, m, m == b);
    for (std::size_t i = 0; i < cols.size(); ++i) {
      const PlacedRank& p = positions[blocks[b][i]];
      const DeviceId d = node_devices[m][cols[i]];
      out.units[p.unit].gpus[static_cast<std::size_t>(p.slot)] = d;
      after += weight(d, p);
    }
  }
  return after > before ? out : target;
}

}  // namespace nereus
