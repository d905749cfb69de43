// place_balanced (planner.hpp): the same layouts, placed to spread memory over the pool
// rather than packed from GPU 0 as place() does. A GPU keeps one model-stage of every
// phase, so packing every phase from GPU 0 stacks their resident bytes on the first GPUs
// while the last ones hold little whenever a phase does not fill the pool.
#include <algorithm>
#include <limits>
#include <map>

#include "nereus/control/planner.hpp"

namespace nereus {

std::optional<GlobalPlan> place_balanced(const CostModel& model, const JobSpec& job, const GlobalPlan& plan, int gpus,
                                         const Workload& w) {
  const int per_node = std::max(1, model.cluster().gpus_per_node);
  std::vector<double> resident(static_cast<std::size_t>(gpus), 0), transient(static_cast<std::size_t>(gpus), 0);
  std::map<std::string, CollectionSpec> placed;
  for (const auto& phase : job.phases()) {
    std::vector<const ModelStage*> stages;
    for (const ModelStage& s : phase) stages.push_back(&s);
    std::stable_sort(stages.begin(), stages.end(), [&](const ModelStage* a, const ModelStage* b) {
      return plan.find(a->name())->layout.size() > plan.find(b->name())->layout.size();
    });
    std::vector<bool> taken(static_cast<std::size_t>(gpus), false);  // by a unit of this phase
    for (const ModelStage* s : stages) {
      const CollectionSpec* spec = plan.find(s->name());
      const StageMemory m = model.memory(*s, candidate_of(*spec), w);
      const int unit = spec->layout.size();
      CollectionSpec out = *spec;
      out.devices.clear();
      for (int replica = 0; replica < spec->dp; ++replica) {
        // Aligned blocks keep a TP group inside a node (unit sizes are powers of two).
        int best = -1;
        double best_peak = std::numeric_limits<double>::infinity();
        for (int a = 0; a + unit <= gpus; a += unit) {
          if (unit <= per_node && a / per_node != (a + unit - 1) / per_node) continue;
          double peak = 0;
          bool free = true;
          for (int d = a; d < a + unit && free; ++d) {
            const auto i = static_cast<std::size_t>(d);
            free = !taken[i];
            peak = std::max(peak, resident[i] + static_cast<double>(m.resident) +
                                      std::max(transient[i], static_cast<double>(m.transient)));
          }
          if (free && peak < best_peak) best = a, best_peak = peak;
        }
        if (best < 0) return std::nullopt;
        for (int d = best; d < best + unit; ++d) {
          const auto i = static_cast<std::size_t>(d);
          taken[i] = true;
          resident[i] += static_cast<double>(m.resident);
          transient[i] = std::max(transient[i], static_cast<double>(m.transient));
          out.devices.push_back(d);
        }
      }
      placed[s->name()] = out;
    }
  }
  GlobalPlan p;
  for (const auto& [name, spec] : plan.stages) p.stages.emplace_back(name, placed.at(name));
  return p;
}

}  // namespace nereus
