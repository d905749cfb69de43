// The graph interpreter when a node is lost mid-run (the coordinator's case, which the
// in-process job never meets: its units are always intact). Every model-stage must keep a
// collection of intact units; when no old unit is left intact, the new units already
// built are that collection.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "nereus/core/global_plan.hpp"
#include "nereus/core/job.hpp"
#include "nereus/runtime/graph_run.hpp"
#include "run_async.hpp"

using namespace nereus;
using testing::run_on;

namespace {

/// Units as ids with GPUs; the second build's fill loses `lose` (a node's GPUs) and fails.
class LossSpace final : public UnitSpace {
 public:
  LossSpace(asio::any_io_executor ex, const JobSpec& job, const TransitionGraph& g, std::set<DeviceId> lose)
      : changed_(ex), stages_(model_stages(job)), g_(g), lose_(std::move(lose)),
        batch_(job.prompts_per_step * job.samples_per_prompt), ends_(stages_.size()) {}

  Notifier& changed() override { return changed_; }
  const std::vector<ModelStage>& stages() const override { return stages_; }
  std::int64_t batch() const override { return batch_; }
  std::optional<std::string> failure() const override {
    return lost_.empty() ? std::nullopt : std::optional<std::string>("node lost");
  }
  asio::awaitable<UnitId> allocate(const GraphRun&, std::uint32_t x) override {
    const UnitId id = next_++;
    gpus_[id] = g_.emu(g_.nodes[x].unit).gpus;
    co_return id;
  }
  asio::awaitable<std::uint64_t> fill(const GraphRun&, std::uint32_t, UnitId, const SourceGroups&) override {
    if (++fills_ == 2) {
      lost_ = lose_;
      changed_.notify();
      throw std::runtime_error("node lost");
    }
    co_return 1;
  }
  asio::awaitable<void> free(UnitId id) override {
    gpus_.erase(id);
    co_return;
  }
  bool intact(UnitId id) const override {
    for (DeviceId d : gpus_.at(id))
      if (lost_.contains(d)) return false;
    return true;
  }
  asio::awaitable<void> settle(std::size_t stage, const StageEnd& end) override {
    ends_[stage] = end;
    co_return;
  }

  /// Records the old units of the graph (ids 1, 2, ...), per model-stage.
  std::vector<std::vector<UnitId>> olds() {
    std::vector<std::vector<UnitId>> out(g_.from.size());
    for (std::size_t i = 0; i < g_.from.size(); ++i)
      for (const Emu& e : g_.from[i].units) {
        out[i].push_back(old_++);
        gpus_[out[i].back()] = e.gpus;
      }
    return out;
  }
  const std::vector<DeviceId>& gpus(UnitId id) const { return gpus_.at(id); }
  const StageEnd& end(std::size_t stage) const { return ends_.at(stage); }

 private:
  Notifier changed_;
  std::vector<ModelStage> stages_;
  const TransitionGraph& g_;
  std::set<DeviceId> lose_, lost_;
  std::int64_t batch_;
  std::vector<StageEnd> ends_;
  std::map<UnitId, std::vector<DeviceId>> gpus_;
  UnitId old_ = 1, next_ = 1000;
  int fills_ = 0;
};

}  // namespace

TEST_CASE("graph run: old units lost mid-graph, the new units built so far keep the model-stage") {
  const JobSpec job = load_job("ppo-tiny");
  const std::string from = R"({"actor/generate": "tp=1,pp=1,dp=2,devices=4:5", "actor/infer": "tp=1,pp=1,dp=1,devices=6",
    "critic/infer": "tp=1,pp=1,dp=1,devices=0", "reference/infer": "tp=1,pp=1,dp=1,devices=7",
    "reward/infer": "tp=1,pp=1,dp=1,devices=7", "actor/train": "tp=1,pp=1,dp=1,devices=4",
    "critic/train": "tp=1,pp=1,dp=1,devices=5"})";
  std::string to = from;
  const std::string old_critic = "tp=1,pp=1,dp=1,devices=0\"";
  to.replace(to.find(old_critic), old_critic.size(), "tp=1,pp=1,dp=2,devices=2:3\"");
  TransitionRequest req;
  req.job = &job;
  req.from = plan_collections(job, parse_global_plan(job, from, "from"));
  req.to = plan_collections(job, parse_global_plan(job, to, "to"));
  const TransitionGraph g = compile_transition(req);
  std::size_t critic = 0;
  while (g.stages[critic] != "critic/infer") ++critic;
  int builds = 0;
  for (const GraphNode& n : g.nodes) builds += n.is_build();
  REQUIRE(builds == 2);  // the new units on GPUs 2 and 3, from the old one on GPU 0

  asio::io_context io;
  LossSpace space(io.get_executor(), job, g, {0, 1});  // the old unit's node
  GraphRun run(space, g, space.olds());
  const TransitionReport r = run_on(io, run.run());
  CHECK_FALSE(r.completed);
  const StageEnd& end = space.end(critic);
  CHECK_FALSE(end.on_new);
  REQUIRE(end.units.size() == 1);  // the new unit built before the loss, not the lost old one
  const std::vector<DeviceId>& at = space.gpus(end.units[0]);
  CHECK((at == std::vector<DeviceId>{2} || at == std::vector<DeviceId>{3}));
  CHECK(end.units[0] >= 1000);
  CHECK(end.retire.size() == 1);  // the old unit on the lost node, freed on the survivors
  for (std::size_t i = 0; i < g.stages.size(); ++i)
    if (i != critic) CHECK(space.end(i).units.size() == g.from[i].units.size());  // untouched
}
