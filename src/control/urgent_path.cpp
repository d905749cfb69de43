// The controller's urgent path (controller.hpp): the candidates it tries, after S* and its
// cheaper neighbours, when the current plan cannot run the next step; and the error that
// names what is short when none of them can be reached.
#include <algorithm>
#include <set>

#include "nereus/control/controller.hpp"
#include "nereus/core/bytes.hpp"

namespace nereus {

std::vector<PlanOption> Controller::urgent_options(const GlobalPlan& current, const std::vector<PlanOption>& tried,
                                                   int gpus, const Workload& w) const {
  // Every candidate costs a transition graph; bounded so an urgent decision stays quick
  // on large pools (an unreachable candidate's graph is cut short by its memory check).
  constexpr std::size_t kMost = 64;
  std::set<std::string> seen{to_string(current)};
  for (const PlanOption& o : tried) seen.insert(to_string(o.plan));
  std::vector<PlanOption> frontier, spread, steps;
  auto add = [&](std::vector<PlanOption>& to, const GlobalPlan& plan, std::string source) {
    if (outside_pool(plan, gpus) || !seen.insert(to_string(plan)).second) return;
    const PlanEstimate e = estimate_plan(model_, job_, plan, w, options_.headroom);
    if (e.fits) to.push_back({e.step_seconds, plan, std::move(source)});
  };
  // 1. The planner's frontier: slower plans that hold less per GPU, fastest first.
  const std::vector<PlanChoice> front = plan_frontier(model_, job_, gpus, w, options_.planner);
  for (std::size_t i = 0; i < front.size(); ++i) add(frontier, front[i].plan, "frontier " + std::to_string(i + 1));
  // 2. The same layouts placed to spread memory (place() packs every phase from GPU 0),
  // the current plan's first: moving a unit off the GPU that overflows may be all it takes.
  const PlanOption now{0, current, "the current layouts"};
  std::vector<const PlanOption*> layouts{&now};
  for (const PlanOption& o : tried) layouts.push_back(&o);
  for (const PlanOption& o : frontier) layouts.push_back(&o);
  for (const PlanOption* o : layouts)
    if (const auto p = place_balanced(model_, job_, o->plan, gpus, w)) add(spread, *p, o->source + ", spread");
  // 3. One model-stage moved towards a candidate, the rest kept where they are: the
  // first of two transitions through a smaller intermediate (the retry goes on from it).
  for (const PlanOption& o : spread) layouts.push_back(&o);
  for (const PlanOption* o : layouts)
    for (const auto& [name, spec] : o->plan.stages) {
      if (to_string(spec) == to_string(*current.find(name))) continue;
      GlobalPlan step = current;
      for (auto& [n, s] : step.stages)
        if (n == name) s = spec;
      add(steps, step, name + " as in " + o->source);
    }
  for (auto* v : {&spread, &steps})
    std::stable_sort(v->begin(), v->end(), [](const PlanOption& a, const PlanOption& b) { return a.seconds < b.seconds; });
  // In turn, so that a long frontier does not crowd out the smaller changes.
  std::vector<PlanOption> out;
  for (std::size_t i = 0; out.size() < kMost; ++i) {
    const std::size_t before = out.size();
    for (auto* v : {&frontier, &spread, &steps})
      if (i < v->size() && out.size() < kMost) out.push_back(std::move((*v)[i]));
    if (out.size() == before) break;
  }
  return out;
}

std::string Controller::shortfall(const GlobalPlan& current, const Signals& s, const Workload& w) const {
  const std::string at = "step " + std::to_string(s.step) + " cannot run on the current plan: ";
  if (outside_pool(current, s.gpus)) return at + "it has units on GPUs that left the pool";
  const PlanEstimate e = estimate_plan(model_, job_, current, w, options_.headroom);
  if (!e.refusal.empty()) return at + e.refusal;
  if (e.fits) return at + "it fits by the cost model, yet the memory trigger fired";
  return at + "GPU " + std::to_string(e.peak_device) + " needs " + human_bytes(e.peak_memory_bytes) + " with " +
         e.peak_stage + "'s working memory, over its budget of " + human_bytes(e.budget_bytes) + " (" +
         human_bytes(e.peak_memory_bytes - e.budget_bytes) + " short)";
}

}  // namespace nereus
