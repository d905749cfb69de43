#include "nereus/plan/primitives.hpp"

#include <algorithm>
#include <set>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {
void check_unit(const Collection& c, std::size_t unit, const char* op) {
  if (unit >= c.units.size())
    throw Error(std::string(op) + ": model-stage '" + c.model_stage + "' has no unit " + std::to_string(unit) +
                " (it has " + std::to_string(c.units.size()) + ")");
}
}  // namespace

Collection split(const Collection& c, std::size_t unit, const Layout& smaller) {
  check_unit(c, unit, "split");
  const Emu& u = c.units[unit];
  validate_layout(c.model->config(), smaller);
  if (smaller.size() >= u.layout.size() || u.layout.size() % smaller.size() != 0)
    throw Error("split: layout " + to_string(smaller) + " (" + std::to_string(smaller.size()) +
                " GPUs) does not split a unit of " + std::to_string(u.layout.size()) + " GPUs");
  Collection out = c;
  std::vector<Emu> parts;
  for (std::size_t i = 0; i < u.gpus.size(); i += static_cast<std::size_t>(smaller.size()))
    parts.push_back({smaller, std::vector<DeviceId>(u.gpus.begin() + static_cast<std::ptrdiff_t>(i),
                                                    u.gpus.begin() + static_cast<std::ptrdiff_t>(i + smaller.size()))});
  out.units.erase(out.units.begin() + static_cast<std::ptrdiff_t>(unit));
  out.units.insert(out.units.begin() + static_cast<std::ptrdiff_t>(unit), parts.begin(), parts.end());
  out.validate();
  return out;
}

Collection merge(const Collection& c, std::span<const std::size_t> units, const Layout& larger) {
  if (units.size() < 2) throw Error("merge: needs at least two units");
  std::set<std::size_t> seen;
  Emu merged{larger, {}};
  for (std::size_t j : units) {
    check_unit(c, j, "merge");
    if (!seen.insert(j).second) throw Error("merge: unit " + std::to_string(j) + " given twice");
    merged.gpus.insert(merged.gpus.end(), c.units[j].gpus.begin(), c.units[j].gpus.end());
  }
  validate_layout(c.model->config(), larger);
  if (static_cast<int>(merged.gpus.size()) != larger.size())
    throw Error("merge: the units have " + std::to_string(merged.gpus.size()) + " GPUs but layout " +
                to_string(larger) + " needs " + std::to_string(larger.size()));
  Collection out = c;
  out.units.clear();
  for (std::size_t j = 0; j < c.units.size(); ++j) {
    if (j == units[0]) out.units.push_back(merged);
    else if (!seen.count(j)) out.units.push_back(c.units[j]);
  }
  out.validate();
  return out;
}

Collection extend(const Collection& c, std::span<const DeviceId> gpus) {
  if (c.units.empty()) throw Error("extend: model-stage '" + c.model_stage + "' has no unit to replicate");
  const Layout& lay = c.units[0].layout;
  if (gpus.empty() || gpus.size() % static_cast<std::size_t>(lay.size()) != 0)
    throw Error("extend: " + std::to_string(gpus.size()) + " GPUs is not a multiple of the unit size " +
                std::to_string(lay.size()));
  Collection out = c;
  for (std::size_t i = 0; i < gpus.size(); i += static_cast<std::size_t>(lay.size()))
    out.units.push_back({lay, std::vector<DeviceId>(gpus.begin() + static_cast<std::ptrdiff_t>(i),
                                                    gpus.begin() + static_cast<std::ptrdiff_t>(i + lay.size()))});
  out.validate();  // rejects GPUs the collection already uses
  return out;
}

Collection destroy(const Collection& c, std::size_t unit) {
  check_unit(c, unit, "destroy");
  if (c.units.size() == 1)
    throw Error("destroy: unit " + std::to_string(unit) + " is the last replica of model-stage '" +
                c.model_stage + "'; destroying it would lose its state");
  Collection out = c;
  out.units.erase(out.units.begin() + static_cast<std::ptrdiff_t>(unit));
  return out;
}

Collection sync_target(const Collection& train, const Collection& generation) {
  if (!same_model(*train.model, *generation.model))
    throw Error("sync: model-stages '" + train.model_stage + "' and '" + generation.model_stage +
                "' are different models");
  Collection out = generation;
  out.train = false;
  return out;
}

}  // namespace nereus
