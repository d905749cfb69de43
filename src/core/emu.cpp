#include "nereus/core/emu.hpp"

#include <unordered_set>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8_layout.hpp"

namespace nereus {

std::string_view to_string(Slot s) {
  switch (s) {
    case Slot::param: return "param";
    case Slot::master: return "master";
    case Slot::exp_avg: return "exp_avg";
    case Slot::exp_avg_sq: return "exp_avg_sq";
    case Slot::scale: return "scale";
  }
  return "?";
}

DType slot_dtype(Slot s, DType param_dtype) { return s == Slot::param ? param_dtype : DType::f32; }

Collection Collection::from_spec(std::shared_ptr<const ModelSpec> model, std::string model_stage,
                                 const CollectionSpec& spec, bool train) {
  Collection c{std::move(model), std::move(model_stage), train, {}};
  const std::size_t n = static_cast<std::size_t>(spec.layout.size());
  Layout layout = spec.layout;
  // One sharding, one layout: etp = tp is the default, and dense models ignore etp.
  if (layout.etp == layout.tp || (c.model && !c.model->config().moe())) layout.etp = 0;
  for (int j = 0; j < spec.dp; ++j) {
    Emu u{layout, {}};
    u.gpus.assign(spec.devices.begin() + static_cast<std::ptrdiff_t>(j * n),
                  spec.devices.begin() + static_cast<std::ptrdiff_t>((j + 1) * n));
    c.units.push_back(std::move(u));
  }
  c.validate();
  return c;
}

std::vector<DeviceId> Collection::devices() const {
  std::vector<DeviceId> out;
  for (const auto& u : units) out.insert(out.end(), u.gpus.begin(), u.gpus.end());
  return out;
}

void Collection::validate(std::int64_t device_count) const {
  if (!model) throw Error("model-stage '" + model_stage + "' has no model");
  if (units.empty()) throw Error("model-stage '" + model_stage + "' has no units");
  std::unordered_set<DeviceId> seen;
  for (std::size_t j = 0; j < units.size(); ++j) {
    const Emu& u = units[j];
    validate_layout(model->config(), u.layout);
    if (u.layout.fp8) {
      if (train)
        throw Error("model-stage '" + model_stage + "': dtype=fp8 on a training collection (FP8 units are for generation "
                    "and inference; training keeps the config's dtype and float32 optimizer state)");
      if (j == 0 || !(u.layout == units[j - 1].layout)) check_fp8_blocks(*model, u.layout, "model-stage '" + model_stage + "'");
    }
    if (static_cast<int>(u.gpus.size()) != u.layout.size())
      throw Error("model-stage '" + model_stage + "' unit " + std::to_string(j) + " has " +
                  std::to_string(u.gpus.size()) + " GPUs but " + (u.layout.ep == 1 ? "tp·pp" : "tp·pp·ep") + (u.layout.fsdp == 1 ? "" : "·fsdp") + " = " +
                  std::to_string(u.layout.size()));
    for (DeviceId d : u.gpus) {
      if (d < 0) throw Error("model-stage '" + model_stage + "': device id " + std::to_string(d) + " is negative");
      if (device_count > 0 && d >= device_count)
        throw Error("model-stage '" + model_stage + "': device id " + std::to_string(d) +
                    " is out of range (the cluster has " + std::to_string(device_count) + " GPUs)");
      if (!seen.insert(d).second)
        throw Error("model-stage '" + model_stage + "': device " + std::to_string(d) +
                    " is used twice (units must be on disjoint GPUs)");
    }
  }
}

}  // namespace nereus
