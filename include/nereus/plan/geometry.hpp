#pragma once
// Unit geometry: how many elements a unit position holds, and how many of them other
// positions on the same device already hold. The transition graph and the cost model ask
// these per position instead of per transfer; DP replicas share layouts, so the answers
// are memoised per (layout, position) and cost microseconds even at 1,024 GPUs.
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "nereus/core/emu.hpp"

namespace nereus {

/// One position of a unit: its layout, pipeline stage s and in-stage index r (g = e·tp +
/// tensor rank; the tensor rank itself for a dense layout).
struct Position {
  const Layout* layout;
  int s;
  int r;
};

/// Bytes one element of a tensor costs across the slots a unit holds (param, plus the
/// float32 master and Adam moments when training).
std::uint64_t bytes_per_element(const ModelConfig& m, bool train);

/// Memoised element counts of one model's unit positions.
class UnitGeometry {
 public:
  explicit UnitGeometry(std::shared_ptr<const ModelSpec> model);

  const ModelSpec& model() const { return *model_; }
  /// Elements (of one slot) held at a position.
  std::int64_t elements(const Position& p) { return elements(code(p)); }

  /// Hot paths name positions by code: an interned layout (same sharding, same id) and
  /// (s, r). Codes of different geometries do not mix.
  int intern(const Layout& l);
  static std::uint32_t code(int layout, int s, int r) {
    return (static_cast<std::uint32_t>(layout) << 24) | (static_cast<std::uint32_t>(s) << 12) | static_cast<std::uint32_t>(r);
  }
  std::uint32_t code(const Position& p) { return code(intern(*p.layout), p.s, p.r); }
  std::int64_t elements(std::uint32_t position);
  /// Elements of one slot of `target` that at least one of `holders` also holds; at most
  /// five holders are memoised, more are computed each time.
  std::int64_t overlap(std::uint32_t target, std::span<const std::uint32_t> holders);

 private:
  Position position(std::uint32_t code) const {
    return {&layouts_[code >> 24], static_cast<int>((code >> 12) & 0xfff), static_cast<int>(code & 0xfff)};
  }
  std::int64_t compute_overlap(const Position& target, std::span<const Position> holders) const;

  struct Key {
    std::array<std::uint32_t, 6> codes{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };

  std::shared_ptr<const ModelSpec> model_;
  std::deque<Layout> layouts_;  // stable addresses
  std::unordered_map<std::uint32_t, std::int64_t> elements_;
  std::array<std::vector<TensorId>, 2> layer_rep_;  // tensors of the first dense / sparse layer
  std::vector<TensorId> outside_;  // tensors outside the layers
  std::unordered_map<Key, std::int64_t, KeyHash> memo_;
};

}  // namespace nereus
