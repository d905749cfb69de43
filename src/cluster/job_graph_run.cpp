// One global transition graph executed across the daemons (job_graph_run.hpp): the
// runtime's graph interpreter (runtime/graph_run.cpp) over units that live on the nodes.
// A build allocates its unit on the nodes that hold its GPUs and commits once every one
// of them reported its bytes landed; a lost node stops the run, and the interpreter
// leaves every model-stage only units with no GPU on a lost node.
#include <algorithm>

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
      for (const Timing& t : r.timings) links_[{d_.node_of(static_cast<DeviceId>(t.src)), d_.node_of(static_cast<DeviceId>(t.dst))}].add(t);
    }
    co_return bytes;
  }

  asio::awaitable<void> free(UnitId id) override { co_await d_.release(static_cast<std::uint32_t>(id)); }
  bool intact(UnitId id) const override { return d_.intact(static_cast<std::uint32_t>(id)); }

  /// Aborts the nodes' builds, then gives up on builds that would not stop.
  asio::awaitable<void> stopping() override {
    co_await d_.abort_builds();
    d_.give_up();
  }

  asio::awaitable<void> settle(std::size_t stage, const StageEnd& end) override {
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

  json links() const {
    json out = json::array();
    for (const auto& [k, s] : links_)
      out.push_back({{"src_node", k.first}, {"dst_node", k.second}, {"bytes", s.bytes}, {"transfers", s.transfers}, {"gbps", s.gbps()}});
    return out;
  }

 private:
  Emu on_devices(const Emu& e) const {
    Emu out = e;
    for (DeviceId& gpu : out.gpus) gpu = pool_.device(gpu);
    return out;
  }

  JobDriver& d_;
  const TransitionGraph& g_;
  const Pool& pool_;
  std::size_t lost_before_;  // nodes lost before this run
  std::map<std::pair<int, int>, LinkSpan> links_;
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
           {"links", space.links()}};
  if (!r.completed) out["error"] = r.error;
  co_return out;
}

}  // namespace nereus::cluster::detail
