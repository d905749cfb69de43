// One global transition graph executed across the daemons (job_graph_run.hpp): the
// runtime's graph interpreter (runtime/graph_run.cpp) over units that live on the nodes.
// A build allocates its unit on the nodes that hold its GPUs and commits once every one
// of them reported its bytes landed; a lost node stops the run, and the interpreter
// leaves every model-stage only units with no GPU on a lost node. Beside a step the
// frameworks compute (`--overlap`), only builds that read no training state run; the rest
// waits for the step's end.
#include <algorithm>
#include <set>

#include "job_graph_run.hpp"
#include "nereus/base/error.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/runtime/graph_run.hpp"

namespace nereus::cluster::detail {

namespace {

using json = nlohmann::json;

class DaemonUnits final : public UnitSpace {
 public:
  DaemonUnits(JobDriver& d, const TransitionGraph& g, const Pool& pool) : d_(d), g_(g), pool_(pool), lost_before_(d.lost().size()) {}

  Notifier& changed() override { return d_.changed(); }
  const std::vector<ModelStage>& stages() const override { return d_.stages(); }
  std::int64_t batch() const override { return d_.job().prompts_per_step * d_.job().samples_per_prompt; }

  std::optional<std::string> failure() const override {
    const auto lost = d_.lost();
    if (lost.size() > lost_before_) return "node " + std::to_string(lost.back()) + " lost";
    return std::nullopt;
  }

  asio::awaitable<UnitId> allocate(const GraphRun&, std::uint32_t x) override {
    const GraphNode& n = g_.nodes[x];
    const std::uint32_t id = d_.add_unit(n.unit.stage, on_devices(g_.emu(n.unit)));
    co_await d_.allocate(id, false);
    co_return id;
  }

  asio::awaitable<std::uint64_t> fill(const GraphRun&, std::uint32_t, UnitId id, const SourceGroups& sources) override {
    std::vector<std::vector<std::uint32_t>> groups;
    for (const auto& [stage, ids] : sources) {
      groups.emplace_back();
      for (UnitId u : ids) groups.back().push_back(static_cast<std::uint32_t>(u));
    }
    const std::vector<RunDone> done = co_await d_.build(static_cast<std::uint32_t>(id), groups);
    std::uint64_t bytes = 0;
    for (const RunDone& r : done) {
      bytes += r.link_bytes + r.local_bytes;
      sent_ += r.sent_bytes;
      for (const Timing& t : r.timings) links_[{d_.node_of(static_cast<DeviceId>(t.src)), d_.node_of(static_cast<DeviceId>(t.dst))}].add(t);
    }
    co_return bytes;
  }

  asio::awaitable<void> free(UnitId id) override { co_await d_.release(static_cast<std::uint32_t>(id)); }
  bool intact(UnitId id) const override { return d_.intact(static_cast<std::uint32_t>(id)); }

  /// A destroy that would leave a model's state on one node only, where it was on two or
  /// more, waits while a build of that state can still add a node: the graph keeps one
  /// live copy, and across daemons one copy per node is what survives losing a node
  /// (benches/soak.sh lost a model-stage that way). It waits only for builds that depend,
  /// directly or not, on no destroy numbered from its own on: the lowest-numbered waiting
  /// destroy waits only on builds whose edges can all finish, so no wait is circular.
  bool may_start(const GraphRun& run, std::uint32_t x) const override {
    const GraphNode& n = g_.nodes[x];
    const auto& stages = d_.stages();
    if (d_.stepping()) {  // the frameworks compute on the old units: they hold views of them
      if (!n.is_build()) return false;
      for (const UnitRef& r : n.sources)
        if (stages[r.stage].kind == StageKind::train) return false;  // the step writes it
    }
    if (n.is_build()) return true;
    const UnitId id = run.unit(n.unit);
    std::set<int> before, after;
    for (std::size_t k = 0; k < stages.size(); ++k) {
      if (!stages[k].holds_state_of(stages[n.unit.stage])) continue;
      for (std::uint32_t u = 0; u < g_.from[k].units.size(); ++u) add_holder(run.unit({static_cast<std::uint16_t>(k), false, u}), id, before, after);
      for (std::uint32_t u = 0; u < g_.to[k].units.size(); ++u) add_holder(run.unit({static_cast<std::uint16_t>(k), true, u}), id, before, after);
    }
    if (after.size() >= 2 || after.size() >= before.size()) return true;
    for (std::uint32_t b = 0; b < g_.nodes.size(); ++b) {
      const GraphNode& m = g_.nodes[b];
      if (m.is_build() && stages[m.unit.stage].holds_state_of(stages[n.unit.stage]) && run.unit(m.unit) == 0 &&
          last_destroy(b) < static_cast<long>(x))
        return false;
    }
    return true;
  }

  /// Aborts the nodes' builds, then gives up on builds that would not stop.
  asio::awaitable<void> stopping() override {
    co_await d_.abort_builds();
    d_.give_up();
  }

  asio::awaitable<void> settle(std::size_t stage, const StageEnd& end) override {
    while (d_.stepping()) co_await d_.changed().wait();  // old units it retires are the step's
    if (stage == 0) d_.resume();  // requests to free what the run leaves behind must be answered
    std::vector<std::uint32_t>& current = d_.current()[stage];
    current.clear();
    for (UnitId id : end.units) current.push_back(static_cast<std::uint32_t>(id));
    for (UnitId id : end.retire) {
      try {
        co_await d_.release(static_cast<std::uint32_t>(id));
      } catch (const std::exception&) {  // a node that cannot free it frees it with the job
      }
    }
  }

  /// "actor/train new unit 2 (GPUs 4:5)", with global device ids.
  std::string describe(const GraphRun&, const UnitRef& r) const override {
    return g_.stages[r.stage] + (r.target ? " new unit " : " old unit ") + std::to_string(r.unit) + " (GPUs " +
           device_list_string(on_devices(g_.emu(r)).gpus) + ")";
  }

  /// Two-sided builds: the bytes the sending nodes sent (0 for gets).
  std::uint64_t sent_bytes() const { return sent_; }

  json links() const {
    json out = json::array();
    for (const auto& [k, s] : links_)
      out.push_back({{"src_node", k.first}, {"dst_node", k.second}, {"bytes", s.bytes}, {"transfers", s.transfers}, {"gbps", s.gbps()}});
    return out;
  }

 private:
  /// Adds the nodes of a live unit to `before`, and to `after` unless it is `leaving`. A
  /// unit not built (0) or already freed (the driver forgets it on release) adds none.
  void add_holder(UnitId unit, UnitId leaving, std::set<int>& before, std::set<int>& after) const {
    if (unit == 0) return;
    const std::vector<int> nodes = d_.nodes_of_unit(static_cast<std::uint32_t>(unit));
    if (nodes.empty() || !d_.intact(static_cast<std::uint32_t>(unit))) return;
    for (int node : nodes) {
      before.insert(node);
      if (unit != leaving) after.insert(node);
    }
  }

  /// The highest-numbered destroy node x waits on, directly or not; -1: none.
  long last_destroy(std::uint32_t x) const {
    if (auto it = last_destroy_.find(x); it != last_destroy_.end()) return it->second;
    long last = -1;
    for (const Edge& e : g_.nodes[x].after)
      last = std::max({last, g_.nodes[e.node].is_build() ? -1L : static_cast<long>(e.node), last_destroy(e.node)});
    return last_destroy_[x] = last;
  }

  Emu on_devices(const Emu& e) const {
    Emu out = e;
    for (DeviceId& gpu : out.gpus) gpu = pool_.device(gpu);
    return out;
  }

  JobDriver& d_;
  const TransitionGraph& g_;
  const Pool& pool_;
  std::size_t lost_before_;  // nodes lost before this run
  mutable std::map<std::uint32_t, long> last_destroy_;
  std::map<std::pair<int, int>, LinkSpan> links_;
  std::uint64_t sent_ = 0;  // two-sided builds: bytes the sending nodes sent
};

}  // namespace

asio::awaitable<nlohmann::json> run_graph(JobDriver& d, const TransitionGraph& g, const Pool& pool) {
  std::vector<std::vector<UnitId>> olds;
  for (const auto& ids : d.current()) olds.emplace_back(ids.begin(), ids.end());
  DaemonUnits space(d, g, pool);
  GraphRun run(space, g, std::move(olds));
  const double base = d.timeline() ? d.timeline()->now() : 0;
  const TransitionReport r = co_await run.run();
  json nodes = json::array();
  for (const NodeRun& n : r.nodes) {
    nodes.push_back({{"node", n.node}, {"kind", to_string(n.kind)}, {"unit", n.unit}, {"start", n.start}, {"end", n.end}, {"bytes", n.bytes}});
    if (d.timeline())
      d.timeline()->graph_node(std::string(to_string(n.kind)) + " " + n.unit, base + n.start, base + n.end,
                               {{"graph_node", n.node}, {"bytes", n.bytes}});
  }
  json out{{"completed", r.completed},
           {"seconds", r.seconds},
           {"planned_seconds", r.planned_seconds},
           {"plan_ms", r.plan_ms},
           {"moved_bytes", r.moved_bytes},
           {"copied_bytes", r.copied_bytes},
           {"builds", g.summary.builds},
           {"destroys", g.summary.destroys},
           {"kept_units", g.summary.kept_units},
           {"graph_nodes", nodes},
           {"links", space.links()},
           {"sent_bytes", space.sent_bytes()}};
  if (!r.completed) out["error"] = r.error;
  co_return out;
}

}  // namespace nereus::cluster::detail
