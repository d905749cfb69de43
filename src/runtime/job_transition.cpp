// A transition in flight in this process: the graph interpreter (graph_run.cpp) over the
// job's units, gated by the framework's running steps. A build waits until its GPUs and
// its sources are free of stage work; a destroy waits until its stage no longer needs the
// unit this step, or hands the unit to the stage; a stage's new units take effect at the
// transition's effective step.
#include <algorithm>

#include "job_state.hpp"
#include "nereus/base/error.hpp"

namespace nereus {

TransitionRun::TransitionRun(std::shared_ptr<JobState> j, TransitionGraph g, std::int64_t effective)
    : job(std::move(j)), graph(std::move(g)), effective_step(effective), done(job->ex),
      run_(*this, graph, [&] {
        std::vector<std::vector<UnitId>> olds(graph.stages.size());
        for (std::size_t i = 0; i < olds.size(); ++i)
          for (const UnitPtr& u : job->slots[i].units) olds[i].push_back(add(u));
        return olds;
      }()) {
  applied_.assign(graph.stages.size(), 0);
}

UnitId TransitionRun::add(UnitPtr u) {
  const UnitId id = next_id_++;
  units_.emplace(id, std::move(u));
  return id;
}

std::vector<UnitPtr> TransitionRun::units_of(const std::vector<UnitId>& ids) const {
  std::vector<UnitPtr> out;
  for (UnitId id : ids) out.push_back(unit(id));
  return out;
}

bool TransitionRun::may_start(const GraphRun& run, std::uint32_t x) const {
  const GraphNode& n = graph.nodes[x];
  const JobState& s = *job;
  auto device_free = [&](DeviceId d) { return !s.options.avoid_busy || s.busy[static_cast<std::size_t>(d)] == 0; };
  if (!n.is_build()) return s.retired(n.unit.stage) && unit(run.unit(n.unit))->in_use == 0;
  if (!std::all_of(graph.emu(n.unit).gpus.begin(), graph.emu(n.unit).gpus.end(), device_free)) return false;
  for (const UnitRef& r : n.sources) {
    const UnitId id = run.unit(r);
    if (id == 0) return true;  // never built: the interpreter names it
    const UnitPtr& u = unit(id);
    if (u->in_use > 0) return false;
    const StageSlot& src = s.slots[r.stage];
    // A training stage still to update this step: read what it will have written.
    if (src.stage.kind == StageKind::train && effective_step > s.step && !src.ran_this_step) return false;
    if (!std::all_of(u->emu.gpus.begin(), u->emu.gpus.end(), device_free)) return false;
  }
  return true;
}

bool TransitionRun::hand_over(const GraphRun& run, std::uint32_t x) {
  const UnitRef& r = graph.nodes[x].unit;
  job->slots[r.stage].retiring.push_back(unit(run.unit(r)));
  return true;
}

asio::awaitable<UnitId> TransitionRun::allocate(const GraphRun&, std::uint32_t x) {
  const GraphNode& n = graph.nodes[x];
  co_return add(job->allocate_unit(n.unit.stage, graph.emu(n.unit)));
}

asio::awaitable<std::uint64_t> TransitionRun::fill(const GraphRun&, std::uint32_t x, UnitId id, const SourceGroups& sources) {
  std::vector<std::pair<std::size_t, std::vector<UnitPtr>>> groups;
  std::vector<UnitPtr> held;
  std::int64_t version = -1;
  for (const auto& [stage, ids] : sources) {
    groups.push_back({stage, units_of(ids)});
    for (const UnitPtr& u : groups.back().second) {
      held.push_back(u);
      version = version < 0 ? u->version : std::min(version, u->version);
    }
  }
  for (const UnitPtr& u : held) ++u->in_use;
  ExecutionReport rep;
  std::exception_ptr failure;
  const std::vector<UnitPtr> targets{unit(id)};  // GCC 12: no braced lists inside co_await
  try {
    rep = co_await job->copy_units(groups, graph.nodes[x].unit.stage, targets, &active_);
  } catch (...) {
    failure = std::current_exception();
  }
  for (const UnitPtr& u : held) --u->in_use;
  if (failure) std::rethrow_exception(failure);
  unit(id)->version = version;
  co_return rep.link_bytes + rep.local_bytes;
}

asio::awaitable<void> TransitionRun::free(UnitId id) {
  job->free_unit(*unit(id));
  co_return;
}

asio::awaitable<void> TransitionRun::stopping() {
  for (Executor* e : active_) e->cancel();
  co_return;
}

void TransitionRun::stage_built(std::size_t i, const std::vector<UnitId>& units) {
  StageSlot& slot = job->slots[i];
  slot.next = units_of(units);
  slot.switched = true;
  take_effect();
  job->changed.notify();
}

void TransitionRun::take_effect() {
  if (effective_step > job->step) return;
  for (std::size_t i = 0; i < applied_.size(); ++i) {
    StageSlot& slot = job->slots[i];
    if (applied_[i] || !slot.switched) continue;
    applied_[i] = 1;
    slot.units = slot.next;
    slot.next.clear();
    slot.switched = false;
    slot.state = rebatch(slot.state, slot.stage.name(), static_cast<int>(slot.units.size()), job->options.max_micro_batch);
  }
}

// A stage that switched keeps its new units (in effect now or at the effective step);
// one that did not is put back on what is left. Old units it no longer keeps go once
// this step no longer needs them.
asio::awaitable<void> TransitionRun::settle(std::size_t i, const StageEnd& end) {
  StageSlot& slot = job->slots[i];
  for (UnitId id : end.retire) slot.retiring.push_back(unit(id));
  if (!end.on_new) {
    std::vector<UnitPtr> left = units_of(end.units);
    if (left.size() != slot.units.size())
      slot.state = rebatch(slot.state, slot.stage.name(), static_cast<int>(left.size()), job->options.max_micro_batch);
    slot.units = std::move(left);
  }
  co_return;
}

asio::awaitable<void> TransitionRun::run() {
  auto self = shared_from_this();
  co_await until_ready(job->ex, std::move(after));  // the framework's writes before it began
  report = co_await run_.run();
  for (std::size_t i = 0; i < graph.stages.size(); ++i) {
    const StageSlot& slot = job->slots[i];
    const bool on_new = applied_[i] || slot.switched;
    const auto& units = slot.switched ? slot.next : slot.units;
    const Collection c = job->collection(i, units);
    report.stages.push_back({graph.stages[i], on_new, to_string(CollectionSpec{c.units[0].layout, c.dp(), c.devices()})});
  }
  finished = true;
  job->free_retired();
  job->changed.notify();
  done.notify();
}

}  // namespace nereus
