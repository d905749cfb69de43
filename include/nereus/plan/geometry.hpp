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

/// What a unit position holds: the elements of one slot, and the bytes of its `param`
/// slot, each tensor at its own width (sharding.md: the config's dtype, float32 where the
/// tensor table says so).
struct Held {
  std::int64_t elements = 0;
  std::int64_t param_bytes = 0;
  /// Bytes over the slots a unit holds: param, plus the float32 master and Adam moments
  /// when it trains.
  std::uint64_t bytes(bool train) const { return static_cast<std::uint64_t>(param_bytes + (train ? 12 * elements : 0)); }
  Held operator-(const Held& o) const { return {elements - o.elements, param_bytes - o.param_bytes}; }
  Held& operator+=(const Held& o) {
    elements += o.elements;
    param_bytes += o.param_bytes;
    return *this;
  }
};

/// Memoised counts of what one model's unit positions hold.
class UnitGeometry {
 public:
  explicit UnitGeometry(std::shared_ptr<const ModelSpec> model);

  const ModelSpec& model() const { return *model_; }
  /// What a position holds.
  Held held(const Position& p) { return held(code(p)); }

  /// Hot paths name positions by code: an interned layout (same sharding, same id) and
  /// (s, r). Codes of different geometries do not mix.
  int intern(const Layout& l);
  static std::uint32_t code(int layout, int s, int r) {
    return (static_cast<std::uint32_t>(layout) << 24) | (static_cast<std::uint32_t>(s) << 12) | static_cast<std::uint32_t>(r);
  }
  std::uint32_t code(const Position& p) { return code(intern(*p.layout), p.s, p.r); }
  Held held(std::uint32_t position);
  /// What `target` holds that at least one of `holders` also holds; at most five holders
  /// are memoised, more are computed each time.
  Held overlap(std::uint32_t target, std::span<const std::uint32_t> holders);

 private:
  Position position(std::uint32_t code) const {
    return {&layouts_[code >> 24], static_cast<int>((code >> 12) & 0xfff), static_cast<int>(code & 0xfff)};
  }
  Held compute_overlap(const Position& target, std::span<const Position> holders) const;

  struct Key {
    std::array<std::uint32_t, 6> codes{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };

  std::shared_ptr<const ModelSpec> model_;
  std::deque<Layout> layouts_;  // stable addresses
  std::unordered_map<std::uint32_t, Held> held_;
  std::array<std::vector<TensorId>, 2> layer_rep_;  // tensors of the first dense / sparse layer
  std::vector<TensorId> outside_;  // tensors outside the layers
  std::unordered_map<Key, Held, KeyHash> memo_;
};

}  // namespace nereus
