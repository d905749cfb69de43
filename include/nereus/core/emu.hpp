#pragma once
// Elastic Model Units and their collections (architecture.md, "EMU").
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/core/layout.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// State slot of a tensor shard (sharding.md, "State slots"). `scale`: the float32 block
/// scales (`weight_scale_inv`) of a weight a `dtype=fp8` unit holds as FP8, in block
/// coordinates (sharding.md, "FP8"); never one of a collection's slots().
enum class Slot : std::uint8_t { param, master, exp_avg, exp_avg_sq, scale };

inline constexpr std::array<Slot, 4> kTrainSlots{Slot::param, Slot::master, Slot::exp_avg,
                                                 Slot::exp_avg_sq};
inline constexpr std::array<Slot, 1> kParamSlots{Slot::param};

std::string_view to_string(Slot s);
/// Element type of a slot: the model dtype for param, float32 for optimizer state and scales.
DType slot_dtype(Slot s, DType param_dtype);

/// One replica of one model-stage: a layout and its ordered GPU list R (|R| = tp·pp·ep).
struct Emu {
  Layout layout;
  std::vector<DeviceId> gpus;
  /// Device of position (pipeline stage s, in-stage index g = e·tp + r): R[s·tp·ep + g].
  /// A dense layout has ep = 1, so g is the tensor rank r.
  DeviceId device(int s, int g) const { return gpus[static_cast<std::size_t>(s * layout.stage_size() + g)]; }
};

/// All replicas (dp units) of one model-stage of one model, on disjoint GPUs.
struct Collection {
  std::shared_ptr<const ModelSpec> model;
  std::string model_stage;  ///< e.g. "actor/train"
  bool train = false;       ///< units carry master/exp_avg/exp_avg_sq besides param
  std::vector<Emu> units;

  /// Builds the collection a layout spec describes; validates it (see validate()).
  static Collection from_spec(std::shared_ptr<const ModelSpec> model, std::string model_stage,
                              const CollectionSpec& spec, bool train);
  /// Slots each unit holds.
  std::span<const Slot> slots() const {
    return train ? std::span<const Slot>(kTrainSlots) : std::span<const Slot>(kParamSlots);
  }
  int dp() const { return static_cast<int>(units.size()); }
  /// All devices, unit after unit.
  std::vector<DeviceId> devices() const;
  /// Throws Error on an invalid layout, a GPU list of the wrong length, a repeated or
  /// negative device id, or (with device_count > 0) an id >= device_count.
  void validate(std::int64_t device_count = 0) const;
};

}  // namespace nereus
