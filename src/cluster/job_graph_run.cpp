// One global transition graph executed across the daemons (job_graph_run.hpp). The
// schedule follows the in-process job runtime (runtime/job_transition.cpp) without the
// framework's stage work: a node of the graph starts once its edges are done.
#include <algorithm>

#include "job_graph_run.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/core/error.hpp"
#include "nereus/core/stage_state.hpp"

namespace nereus::cluster::detail {

namespace {

using json = nlohmann::json;

class GraphRun {
 public:
  GraphRun(JobDriver& d, const TransitionGraph& g, const Pool& pool) : d_(d), g_(g), pool_(pool) {
    const std::size_t n = g.stages.size();
    olds_ = d.current();
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
      if (node.is_build()) ++builds_left_[node.unit.stage];
    node_done_.assign(g.nodes.size(), 0);
    allocated_.assign(g.nodes.size(), 0);
    lost_before_ = d.lost().size();
  }

  asio::awaitable<json> run() {
    t0_ = clock::now();
    {
      AsyncScope scope(d_.executor());
      for (std::uint32_t x = 0; x < g_.nodes.size(); ++x) scope.spawn(run_node(x));
      scope.spawn(watch());
      co_await scope.join();
    }
    co_await settle();
    json links = json::array();
    for (const auto& [k, s] : links_)
      links.push_back({{"src_node", k.first}, {"dst_node", k.second}, {"bytes", s.bytes}, {"transfers", s.transfers}, {"gbps", s.gbps()}});
    json out{{"completed", !stopping_},
             {"seconds", since()},
             {"planned_seconds", g_.summary.l_tran_seconds},
             {"plan_ms", g_.summary.plan_ms},
             {"moved_bytes", g_.summary.moved_bytes},
             {"copied_bytes", copied_},
             {"builds", g_.summary.builds},
             {"destroys", g_.summary.destroys},
             {"kept_units", g_.summary.kept_units},
             {"graph_nodes", runs_},
             {"links", links}};
    if (stopping_) out["error"] = error_;
    co_return out;
  }

 private:
  double since() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }

  void stop(const std::string& why) {
    if (stopping_) return;
    stopping_ = true;
    error_ = why;
    d_.changed().notify();
  }

  bool after_done(std::uint32_t x) const {
    const GraphNode& n = g_.nodes[x];
    return std::all_of(n.after.begin(), n.after.end(), [&](const Edge& e) { return node_done_[e.node] != 0; });
  }

  Emu on_devices(const Emu& e) const {
    Emu out = e;
    for (DeviceId& gpu : out.gpus) gpu = pool_.device(gpu);
    return out;
  }

  /// "actor/train new unit 2 (GPUs 4:5)", with global device ids.
  std::string describe(const UnitRef& r) const {
    return g_.stages[r.stage] + (r.target ? " new unit " : " old unit ") + std::to_string(r.unit) + " (GPUs " +
           device_list_string(on_devices(g_.emu(r)).gpus) + ")";
  }

  std::uint32_t unit_id(const UnitRef& r) const { return (r.target ? news_ : olds_)[r.stage][r.unit]; }

  asio::awaitable<void> run_node(std::uint32_t x) {
    try {
      while (!stopping_ && !after_done(x)) {
        if (const auto lost = d_.lost(); lost.size() > lost_before_) stop("node " + std::to_string(lost.back()) + " lost");
        else co_await d_.changed().wait();
      }
      if (!stopping_) {
        if (g_.nodes[x].is_build()) co_await build(x);
        else co_await destroy(x);
        node_done_[x] = 1;
      }
    } catch (const std::exception& e) {
      stop(describe(g_.nodes[x].unit) + ": " + e.what());
    }
    ++finished_;
    d_.changed().notify();
  }

  asio::awaitable<void> build(std::uint32_t x) {
    const GraphNode& n = g_.nodes[x];
    std::vector<std::vector<std::uint32_t>> groups;
    std::vector<std::uint16_t> group_stage;
    for (const UnitRef& r : n.sources) {
      if (group_stage.empty() || group_stage.back() != r.stage) {
        group_stage.push_back(r.stage);
        groups.emplace_back();
      }
      const std::uint32_t id = unit_id(r);
      if (id == 0) throw Error("its source " + describe(r) + " was never built");
      groups.back().push_back(id);
    }
    const double start = since();
    const std::uint32_t id = d_.add_unit(n.unit.stage, on_devices(g_.emu(n.unit)));
    allocated_[x] = id;
    co_await d_.allocate(id, false);
    const std::vector<RunDone> done = co_await d_.build(id, groups);
    if (stopping_) co_return;  // stopped as it finished: the unit is dropped in settle()
    news_[n.unit.stage][n.unit.unit] = id;  // committed: every node reported its bytes landed
    std::uint64_t bytes = 0;
    for (const RunDone& r : done) {
      bytes += r.link_bytes + r.local_bytes;
      for (const Timing& t : r.timings) links_[{d_.node_of(static_cast<DeviceId>(t.src)), d_.node_of(static_cast<DeviceId>(t.dst))}].add(t);
    }
    copied_ += bytes;
    record(x, start, bytes);
    --builds_left_[n.unit.stage];
  }

  asio::awaitable<void> destroy(std::uint32_t x) {
    const GraphNode& n = g_.nodes[x];
    const std::size_t m = n.unit.stage;
    const std::uint32_t id = olds_[m][n.unit.unit];
    // Nothing lost: another live unit of the model must hold this one's state (its
    // optimizer state too, for a training unit).
    const std::vector<ModelStage>& stages = d_.stages();
    bool held = false;
    for (std::size_t k = 0; k < stages.size() && !held; ++k) {
      if (!stages[k].holds_state_of(stages[m])) continue;
      for (std::size_t j = 0; j < olds_[k].size() && !held; ++j) held = olds_[k][j] != id && !destroyed_[k][j];
      for (std::uint32_t v : news_[k]) held = held || (v != 0 && v != id);
    }
    if (!held) throw Error("refused to destroy it: no other unit holds its state");
    const double start = since();
    destroyed_[m][n.unit.unit] = 1;
    co_await d_.release(id);
    record(x, start, 0);
  }

  void record(std::uint32_t x, double start, std::uint64_t bytes) {
    const GraphNode& n = g_.nodes[x];
    runs_.push_back({{"node", x}, {"kind", to_string(n.kind)}, {"unit", describe(n.unit)}, {"start", start}, {"end", since()}, {"bytes", bytes}});
  }

  /// Aborts the nodes' builds once the run stops, and gives up on builds that would not stop.
  asio::awaitable<void> watch() {
    while (!stopping_ && finished_ < g_.nodes.size()) co_await d_.changed().wait();
    if (!stopping_) co_return;
    co_await d_.abort_builds();
    d_.give_up();
  }

  /// Leaves every model-stage a valid collection: the new units when all were built, else
  /// the old units left (or, when a memory-first graph freed them all, the new ones built);
  /// never a unit with a GPU on a lost node; a DP degree that divides the global batch.
  asio::awaitable<void> settle() {
    const std::int64_t batch = d_.job().prompts_per_step * d_.job().samples_per_prompt;
    std::vector<std::uint32_t> drop;
    for (std::size_t i = 0; i < olds_.size(); ++i) {
      std::vector<std::uint32_t> keep;
      auto committed = [&](std::uint32_t id) { return std::find(news_[i].begin(), news_[i].end(), id) != news_[i].end(); };
      if (builds_left_[i] == 0) {
        keep = news_[i];
        for (std::size_t j = 0; j < olds_[i].size(); ++j)
          if (!destroyed_[i][j] && !committed(olds_[i][j])) drop.push_back(olds_[i][j]);
      } else {
        for (std::size_t j = 0; j < olds_[i].size(); ++j)
          if (!destroyed_[i][j]) keep.push_back(olds_[i][j]);
        const bool keep_new = keep.empty();
        for (std::size_t u = 0; u < news_[i].size(); ++u) {
          if (news_[i][u] == 0 || g_.kept[i][u] >= 0) continue;
          (keep_new ? keep : drop).push_back(news_[i][u]);
        }
      }
      std::vector<std::uint32_t> whole;
      for (std::uint32_t id : keep) (d_.intact(id) ? whole : drop).push_back(id);
      while (whole.size() > 1 && !dp_allowed(batch, static_cast<int>(whole.size()))) {
        drop.push_back(whole.back());
        whole.pop_back();
      }
      d_.current()[i] = whole;
    }
    for (std::uint32_t x = 0; x < allocated_.size(); ++x) {  // built but never committed
      const std::uint32_t id = allocated_[x];
      const GraphNode& n = g_.nodes[x];
      if (id != 0 && news_[n.unit.stage][n.unit.unit] != id) drop.push_back(id);
    }
    d_.resume();
    for (std::uint32_t id : drop) {
      try {
        co_await d_.release(id);
      } catch (const std::exception&) {  // a node that cannot free it frees it with the job
      }
    }
  }

  JobDriver& d_;
  const TransitionGraph& g_;
  const Pool& pool_;
  std::vector<std::vector<std::uint32_t>> olds_, news_;  // unit ids; 0: not built
  std::vector<std::vector<char>> destroyed_;
  std::vector<std::size_t> builds_left_;
  std::vector<char> node_done_;
  std::vector<std::uint32_t> allocated_;  // per build: the unit it allocated
  std::size_t finished_ = 0;
  std::size_t lost_before_ = 0;  // nodes lost before this run
  bool stopping_ = false;
  std::string error_;
  clock::time_point t0_;
  json runs_ = json::array();
  std::map<std::pair<int, int>, LinkSpan> links_;
  std::uint64_t copied_ = 0;
};

}  // namespace

asio::awaitable<nlohmann::json> run_graph(JobDriver& d, const TransitionGraph& g, const Pool& pool) {
  GraphRun run(d, g, pool);
  json out = co_await run.run();
  co_return out;
}

}  // namespace nereus::cluster::detail
