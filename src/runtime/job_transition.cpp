// A transition in flight: every node of the graph as a coroutine that starts when its
// edges and the running steps allow, builds or frees its unit, and on failure or
// cancellation a roll-back that leaves every model-stage a complete collection.
#include <algorithm>

#include "job_state.hpp"
#include "nereus/core/error.hpp"

namespace nereus {

TransitionRun::TransitionRun(std::shared_ptr<JobState> j, TransitionGraph g, std::int64_t effective)
    : job(std::move(j)), graph(std::move(g)), effective_step(effective), done(job->ex) {
  const std::size_t n = graph.stages.size();
  olds.resize(n);
  news.resize(n);
  destroyed.resize(n);
  builds_left.assign(n, 0);
  applied.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    olds[i] = job->slots[i].units;
    destroyed[i].assign(olds[i].size(), 0);
    news[i].resize(graph.to[i].units.size());
    for (std::size_t u = 0; u < news[i].size(); ++u)
      if (graph.kept[i][u] >= 0) news[i][u] = olds[i][static_cast<std::size_t>(graph.kept[i][u])];
  }
  for (const GraphNode& node : graph.nodes)
    if (node.is_build()) ++builds_left[node.unit.stage], ++builds_pending;
  node_done.assign(graph.nodes.size(), 0);
}

double TransitionRun::since() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TransitionRun::stop(std::string why, bool by_cancel) {
  if (stopping) return;
  stopping = true;
  cancelled = by_cancel;
  error = std::move(why);
  for (Executor* e : active) e->cancel();
  job->changed.notify();
}

bool TransitionRun::after_done(std::uint32_t x) const {
  const GraphNode& n = graph.nodes[x];
  return std::all_of(n.after.begin(), n.after.end(), [&](const Edge& e) { return node_done[e.node] != 0; });
}

bool TransitionRun::hand_over(std::uint32_t x) {
  const GraphNode& n = graph.nodes[x];
  if (n.is_build() || builds_pending > 0 || !after_done(x)) return false;
  destroyed[n.unit.stage][n.unit.unit] = 1;
  job->slots[n.unit.stage].retiring.push_back(olds[n.unit.stage][n.unit.unit]);
  runs.push_back({x, n.kind, since(), since(), 0});
  return true;
}

bool TransitionRun::ready(std::uint32_t x) const {
  const GraphNode& n = graph.nodes[x];
  if (!after_done(x)) return false;
  const JobState& s = *job;
  auto device_free = [&](DeviceId d) { return !s.options.avoid_busy || s.busy[static_cast<std::size_t>(d)] == 0; };
  if (!n.is_build()) {
    const UnitPtr& u = olds[n.unit.stage][n.unit.unit];
    return s.retired(n.unit.stage) && u->in_use == 0;
  }
  if (!std::all_of(graph.emu(n.unit).gpus.begin(), graph.emu(n.unit).gpus.end(), device_free)) return false;
  for (const UnitRef& r : n.sources) {
    const UnitPtr& u = r.target ? news[r.stage][r.unit] : olds[r.stage][r.unit];
    if (!u || u->in_use > 0) return false;
    const StageSlot& src = s.slots[r.stage];
    // A training stage still to update this step: read what it will have written.
    if (src.stage.kind == StageKind::train && effective_step > s.step && !src.ran_this_step) return false;
    if (!std::all_of(u->emu.gpus.begin(), u->emu.gpus.end(), device_free)) return false;
  }
  return true;
}

asio::awaitable<void> TransitionRun::build(std::uint32_t x) {
  const GraphNode& n = graph.nodes[x];
  const std::size_t i = n.unit.stage;
  const double start = since();
  UnitPtr unit = job->allocate_unit(i, graph.emu(n.unit));
  std::vector<std::pair<std::size_t, std::vector<UnitPtr>>> groups;
  std::vector<UnitPtr> held;
  std::int64_t version = -1;
  for (const UnitRef& r : n.sources) {
    const UnitPtr& u = r.target ? news[r.stage][r.unit] : olds[r.stage][r.unit];
    if (groups.empty() || groups.back().first != r.stage) groups.push_back({r.stage, {}});
    groups.back().second.push_back(u);
    held.push_back(u);
    version = version < 0 ? u->version : std::min(version, u->version);
  }
  for (const UnitPtr& u : held) ++u->in_use;
  ExecutionReport rep;
  std::exception_ptr failure;
  const std::vector<UnitPtr> targets{unit};  // GCC 12: no braced lists inside co_await
  try {
    rep = co_await job->copy_units(groups, i, targets, &active);
  } catch (...) {
    failure = std::current_exception();
  }
  for (const UnitPtr& u : held) --u->in_use;
  if (failure) std::rethrow_exception(failure);
  if (stopping) co_return;  // cancelled right as it finished: the unit is dropped
  unit->version = version;
  news[i][n.unit.unit] = unit;
  runs.push_back({x, n.kind, start, since(), rep.link_bytes + rep.local_bytes});
  report.copied_bytes += rep.link_bytes + rep.local_bytes;
  --builds_pending;
  if (--builds_left[i] == 0) switch_stage(i);
}

void TransitionRun::destroy(std::uint32_t x) {
  const GraphNode& n = graph.nodes[x];
  const std::size_t m = n.unit.stage;
  const UnitPtr& u = olds[m][n.unit.unit];
  // Nothing lost: another live unit of the model must hold this one's state (its
  // optimizer state too, for a training unit).
  const ModelStage& st = job->stages[m];
  bool held = false;
  for (std::size_t k = 0; k < graph.stages.size() && !held; ++k) {
    const ModelStage& other = job->stages[k];
    if (!other.holds_state_of(st)) continue;
    for (std::size_t j = 0; j < olds[k].size() && !held; ++j)
      held = !(k == m && j == n.unit.unit) && !destroyed[k][j] && !olds[k][j]->freed;
    for (const UnitPtr& v : news[k]) held = held || (v && v != u && !v->freed);
  }
  if (!held) throw Error("refused to destroy " + graph.describe(n.unit) + ": no other unit holds its state");
  destroyed[m][n.unit.unit] = 1;
  job->free_unit(*u);
  runs.push_back({x, n.kind, since(), since(), 0});
}

void TransitionRun::switch_stage(std::size_t i) {
  StageSlot& slot = job->slots[i];
  slot.next = news[i];
  slot.switched = true;
  take_effect();
  job->changed.notify();
}

void TransitionRun::take_effect() {
  if (effective_step > job->step) return;
  for (std::size_t i = 0; i < applied.size(); ++i) {
    StageSlot& slot = job->slots[i];
    if (applied[i] || !slot.switched) continue;
    applied[i] = 1;
    slot.units = slot.next;
    slot.next.clear();
    slot.switched = false;
    slot.state = rebatch(slot.state, slot.stage.name(), static_cast<int>(slot.units.size()), job->options.max_micro_batch);
  }
}

asio::awaitable<void> TransitionRun::run_node(std::uint32_t x) {
  try {
    bool handed = false;
    while (!stopping && !ready(x) && !(handed = hand_over(x))) co_await job->changed.wait();
    if (stopping) co_return;
    if (handed) {
      // freed by the stage once this step no longer needs it
    } else if (graph.nodes[x].is_build()) {
      co_await build(x);
    } else {
      destroy(x);
    }
    node_done[x] = 1;
    job->free_retired();
    job->changed.notify();
  } catch (const std::exception& e) {
    stop(graph.describe(graph.nodes[x].unit) + ": " + e.what(), false);
  }
}

void TransitionRun::roll_back() {
  const std::int64_t batch = job->spec.prompts_per_step * job->spec.samples_per_prompt;
  for (std::size_t i = 0; i < graph.stages.size(); ++i) {
    StageSlot& slot = job->slots[i];
    const bool on_new = applied[i] || slot.switched;
    if (on_new) {
      // Old units not yet destroyed go once this step no longer needs them.
      for (std::size_t j = 0; j < olds[i].size(); ++j) {
        const bool kept = std::find(news[i].begin(), news[i].end(), olds[i][j]) != news[i].end();
        if (!destroyed[i][j] && !kept) slot.retiring.push_back(olds[i][j]);
      }
      continue;
    }
    // Not switched: new units go; the old units left form the collection, trimmed to a
    // DP degree that divides the global batch. A memory-first graph may have freed every
    // old unit already: then the new units built so far are the collection.
    std::vector<UnitPtr> left;
    for (std::size_t j = 0; j < olds[i].size(); ++j)
      if (!destroyed[i][j]) left.push_back(olds[i][j]);
    const bool keep_new = left.empty();
    for (std::size_t u = 0; u < news[i].size(); ++u) {
      if (!news[i][u] || graph.kept[i][u] >= 0) continue;
      if (keep_new) left.push_back(news[i][u]);
      else job->free_unit(*news[i][u]);
    }
    while (left.size() > 1 && !dp_allowed(batch, static_cast<int>(left.size()))) {
      slot.retiring.push_back(left.back());
      left.pop_back();
    }
    if (left.size() != slot.units.size())
      slot.state = rebatch(slot.state, slot.stage.name(), static_cast<int>(left.size()), job->options.max_micro_batch);
    slot.units = std::move(left);
  }
}

asio::awaitable<void> TransitionRun::run() {
  auto self = shared_from_this();
  t0 = std::chrono::steady_clock::now();
  report.moved_bytes = graph.summary.moved_bytes;
  report.planned_seconds = graph.summary.l_tran_seconds;
  report.plan_ms = graph.summary.plan_ms;
  for (std::size_t i = 0; i < builds_left.size(); ++i)
    if (builds_left[i] == 0) switch_stage(i);  // nothing to build: the kept units are the new collection
  {
    AsyncScope scope(job->ex);
    for (std::uint32_t x = 0; x < graph.nodes.size(); ++x) scope.spawn(run_node(x));
    try {
      co_await scope.join();
    } catch (const std::exception& e) {
      stop(e.what(), false);
    }
  }
  if (stopping) roll_back();
  report.completed = !stopping;
  report.cancelled = cancelled;
  report.error = error;
  for (std::size_t i = 0; i < graph.stages.size(); ++i) {
    const StageSlot& slot = job->slots[i];
    const bool on_new = applied[i] || slot.switched;
    const auto& units = slot.switched ? slot.next : slot.units;
    const Collection c = job->collection(i, units);
    report.stages.push_back({graph.stages[i], on_new, to_string(CollectionSpec{c.units[0].layout, c.dp(), c.devices()})});
  }
  report.nodes = runs;
  for (const NodeRun& r : runs) report.seconds = std::max(report.seconds, r.end);
  finished = true;
  job->free_retired();
  job->changed.notify();
  done.notify();
}

}  // namespace nereus
