// The one interpreter of a global transition graph (graph_run.hpp).
#include "nereus/runtime/graph_run.hpp"

#include <algorithm>

#include "nereus/base/error.hpp"
#include "nereus/runtime/async_scope.hpp"

namespace nereus {

std::string UnitSpace::describe(const GraphRun& run, const UnitRef& r) const { return run.graph().describe(r); }

GraphRun::GraphRun(UnitSpace& space, const TransitionGraph& g, std::vector<std::vector<UnitId>> olds)
    : space_(space), graph_(g), olds_(std::move(olds)) {
  const std::size_t n = g.stages.size();
  if (olds_.size() != n) throw Error("the graph's model-stages are not the job's");
  news_.resize(n);
  destroyed_.resize(n);
  builds_left_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (olds_[i].size() != g.from[i].units.size()) throw Error("the graph does not start from the current units of " + g.stages[i]);
    destroyed_[i].assign(olds_[i].size(), 0);
    news_[i].assign(g.to[i].units.size(), 0);
    for (std::size_t u = 0; u < news_[i].size(); ++u)
      if (g.kept[i][u] >= 0) news_[i][u] = olds_[i][static_cast<std::size_t>(g.kept[i][u])];
  }
  for (const GraphNode& node : g.nodes)
    if (node.is_build()) ++builds_left_[node.unit.stage], ++builds_pending_;
  node_done_.assign(g.nodes.size(), 0);
  allocated_.assign(g.nodes.size(), 0);
}

double GraphRun::since() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

void GraphRun::stop(std::string why, bool cancelled) {
  if (stopping_) return;
  stopping_ = true;
  report_.cancelled = cancelled;
  report_.error = std::move(why);
  space_.changed().notify();
}

bool GraphRun::after_done(std::uint32_t x) const {
  const GraphNode& n = graph_.nodes[x];
  return std::all_of(n.after.begin(), n.after.end(), [&](const Edge& e) { return node_done_[e.node] != 0; });
}

// Once every new unit is committed, an old unit its stage still needs this step may be
// handed to the stage, which frees it when the step no longer needs it.
bool GraphRun::try_hand_over(std::uint32_t x) {
  const GraphNode& n = graph_.nodes[x];
  if (n.is_build() || builds_pending_ > 0 || !after_done(x) || !space_.hand_over(*this, x)) return false;
  destroyed_[n.unit.stage][n.unit.unit] = 1;
  record(x, since(), 0);
  return true;
}

void GraphRun::record(std::uint32_t x, double start, std::uint64_t bytes) {
  const GraphNode& n = graph_.nodes[x];
  report_.nodes.push_back({x, n.kind, start, since(), bytes, space_.describe(*this, n.unit), graph_.emu(n.unit).gpus});
}

asio::awaitable<void> GraphRun::run_node(std::uint32_t x) {
  try {
    bool handed = false;
    for (;;) {
      if (stopping_) break;
      if (auto why = space_.failure()) {
        stop(*why, false);
        break;
      }
      if (after_done(x) && space_.may_start(*this, x)) break;
      if ((handed = try_hand_over(x))) break;
      co_await space_.changed().wait();
    }
    if (!stopping_) {
      if (handed) {
        // freed by its stage once the step no longer needs it
      } else if (graph_.nodes[x].is_build()) {
        co_await build(x);
      } else {
        co_await destroy(x);
      }
      if (!stopping_) node_done_[x] = 1;
    }
  } catch (const std::exception& e) {
    stop(space_.describe(*this, graph_.nodes[x].unit) + ": " + e.what(), false);
  }
  ++finished_;
  space_.node_finished();
  space_.changed().notify();
}

asio::awaitable<void> GraphRun::build(std::uint32_t x) {
  const GraphNode& n = graph_.nodes[x];
  SourceGroups groups;
  for (const UnitRef& r : n.sources) {
    if (groups.empty() || groups.back().first != r.stage) groups.push_back({r.stage, {}});
    const UnitId id = unit(r);
    if (id == 0) throw Error("its source " + space_.describe(*this, r) + " was never built");
    groups.back().second.push_back(id);
  }
  const double start = since();
  const UnitId id = co_await space_.allocate(*this, x);
  allocated_[x] = id;
  if (stopping_) co_return;  // stopped while allocating: nothing to fill; freed when the run settles
  const std::uint64_t bytes = co_await space_.fill(*this, x, id, groups);
  if (stopping_) co_return;  // stopped as it finished: the unit is freed when the run settles
  news_[n.unit.stage][n.unit.unit] = id;  // committed: every byte landed
  report_.copied_bytes += bytes;
  record(x, start, bytes);
  --builds_pending_;
  if (--builds_left_[n.unit.stage] == 0) space_.stage_built(n.unit.stage, news_[n.unit.stage]);
}

asio::awaitable<void> GraphRun::destroy(std::uint32_t x) {
  const GraphNode& n = graph_.nodes[x];
  const std::size_t m = n.unit.stage;
  const UnitId id = olds_[m][n.unit.unit];
  // Nothing lost: another live unit of the model must hold this one's state (its
  // optimizer state too, for a training unit).
  const std::vector<ModelStage>& stages = space_.stages();
  bool held = false;
  for (std::size_t k = 0; k < stages.size() && !held; ++k) {
    if (!stages[k].holds_state_of(stages[m])) continue;
    for (std::size_t j = 0; j < olds_[k].size() && !held; ++j)
      held = olds_[k][j] != id && !destroyed_[k][j] && space_.live(olds_[k][j]);
    for (UnitId v : news_[k]) held = held || (v != 0 && v != id && space_.live(v));
  }
  if (!held) throw Error("refused to destroy it: no other unit holds its state");
  const double start = since();
  destroyed_[m][n.unit.unit] = 1;
  co_await space_.free(id);
  record(x, start, 0);
}

asio::awaitable<void> GraphRun::watch() {
  while (!stopping_ && finished_ < graph_.nodes.size()) co_await space_.changed().wait();
  if (stopping_) co_await space_.stopping();
}

// The new units when every one was built; else the old units left (or, when none of them
// is left intact — a memory-first graph freed them, or they had a GPU on a lost node — the
// new ones built so far); never a unit with a GPU lost; a DP degree that divides the
// global batch.
StageEnd GraphRun::end_of(std::size_t i, std::vector<UnitId>& discard) const {
  StageEnd end;
  std::vector<UnitId> keep;
  auto committed = [&](UnitId id) { return std::find(news_[i].begin(), news_[i].end(), id) != news_[i].end(); };
  if (builds_left_[i] == 0) {
    end.on_new = true;
    keep = news_[i];
    for (std::size_t j = 0; j < olds_[i].size(); ++j)
      if (!destroyed_[i][j] && !committed(olds_[i][j])) end.retire.push_back(olds_[i][j]);
  } else {
    std::vector<UnitId> olds_left, news_built;
    for (std::size_t j = 0; j < olds_[i].size(); ++j)
      if (!destroyed_[i][j]) olds_left.push_back(olds_[i][j]);
    for (std::size_t u = 0; u < news_[i].size(); ++u)
      if (news_[i][u] != 0 && graph_.kept[i][u] < 0) news_built.push_back(news_[i][u]);
    // Each unit is a whole replica, so either set is a valid collection. The new ones serve
    // when no old one is left intact: freed by a memory-first graph, or on a lost node.
    const bool keep_new = std::none_of(olds_left.begin(), olds_left.end(), [&](UnitId id) { return space_.intact(id); });
    keep = keep_new ? news_built : olds_left;
    for (UnitId id : keep_new ? olds_left : news_built) (keep_new ? end.retire : discard).push_back(id);
  }
  for (UnitId id : keep) (space_.intact(id) ? end.units : end.retire).push_back(id);
  while (end.units.size() > 1 && !dp_allowed(space_.batch(), static_cast<int>(end.units.size()))) {
    end.retire.push_back(end.units.back());
    end.units.pop_back();
  }
  return end;
}

asio::awaitable<TransitionReport> GraphRun::run() {
  t0_ = std::chrono::steady_clock::now();
  report_.moved_bytes = graph_.summary.moved_bytes;
  report_.planned_seconds = graph_.summary.l_tran_seconds;
  report_.plan_ms = graph_.summary.plan_ms;
  for (std::size_t i = 0; i < builds_left_.size(); ++i)
    if (builds_left_[i] == 0) space_.stage_built(i, news_[i]);  // nothing to build: the kept units are the new collection
  {
    AsyncScope scope(space_.changed().executor());
    for (std::uint32_t x = 0; x < graph_.nodes.size(); ++x) scope.spawn(run_node(x));
    scope.spawn(watch());
    try {
      co_await scope.join();
    } catch (const std::exception& e) {
      stop(e.what(), false);
    }
  }
  for (const NodeRun& r : report_.nodes) report_.seconds = std::max(report_.seconds, r.end);
  std::vector<UnitId> discard;
  for (std::size_t i = 0; i < olds_.size(); ++i) {
    const StageEnd end = end_of(i, discard);
    co_await space_.settle(i, end);
  }
  for (std::uint32_t x = 0; x < allocated_.size(); ++x) {  // allocated but never committed
    const GraphNode& n = graph_.nodes[x];
    if (allocated_[x] != 0 && news_[n.unit.stage][n.unit.unit] != allocated_[x]) discard.push_back(allocated_[x]);
  }
  for (UnitId id : discard) {
    try {
      co_await space_.free(id);
    } catch (const std::exception&) {  // one that cannot be freed now is freed with the job
    }
  }
  report_.completed = !stopping_;
  co_return report_;
}

}  // namespace nereus
