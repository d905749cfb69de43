// A job's unit build as a reshard (unit_build.hpp).
#include "unit_build.hpp"

#include "nereus/base/error.hpp"

namespace nereus::cluster::detail {

Collection unit_collection(const std::vector<ModelStage>& stages, const UnitDesc& u) {
  for (const ModelStage& st : stages)
    if (st.name() == u.model_stage) {
      Collection c = Collection::from_spec(st.model, st.name(), parse_collection_spec(u.spec), st.kind == StageKind::train);
      if (c.dp() != 1) throw Error("unit " + std::to_string(u.id) + ": '" + u.spec + "' is not one unit");
      return c;
    }
  throw Error("'" + u.model_stage + "' is not a model-stage of the job");
}

ReshardPlan plan_build(const std::vector<ModelStage>& stages, const UnitBuild& b) {
  // Checked first: a node that only sends holds nothing of the target but this description.
  if (b.unit.id != b.target || b.unit.model_stage.empty()) throw Error("unit-build: the target's description is missing");
  std::vector<Collection> from;
  for (const SourceUnit& s : b.sources) {
    if (s.group > from.size()) throw Error("unit-build: source groups must come in order");
    Collection c = unit_collection(stages, s.unit);
    if (s.group == from.size()) {
      from.push_back(std::move(c));
      continue;
    }
    if (c.model_stage != from[s.group].model_stage) throw Error("unit-build: a source group mixes model-stages");
    from[s.group].units.push_back(std::move(c.units[0]));
  }
  return plan_reshard(from, unit_collection(stages, b.unit));
}

}  // namespace nereus::cluster::detail
