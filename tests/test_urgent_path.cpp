// The controller's urgent path: when the current plan cannot run the next step, a
// decision is a switch to a plan that is both runnable and reachable, or `blocked` with
// the step, the GPU, the model-stage and the shortfall; never "stay".
//
// The first case replays what examples/rlhf/ppo.py reported to its live controller in
// the run that crashed at step 18 (seed 1, the default capacity; stage seconds rounded to
// 0.1 ms, peaks as measured): at step 17 the memory trigger fires, and S* — what the
// controller used to stay behind — is out of reach.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "nereus/control/controller.hpp"
#include "nereus/control/planner.hpp"
#include "nereus/core/bytes.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::has;

namespace {

struct Observed {
  int length;
  std::uint64_t peak;
  double seconds[6];  // in kStages order
};

const char* const kStages[6] = {"actor/generate", "actor/infer", "reference/infer", "critic/infer", "actor/train",
                                "critic/train"};

// Steps 0-16 of `ppo.py --seed 1` (the step reported, its response length, its peak).
const Observed kRun[] = {
    {8, 11782656, {0.1717, 0.1139, 0.1145, 0.1039, 0.7062, 0.6180}},
    {8, 11782656, {0.1427, 0.1127, 0.1129, 0.1067, 0.6447, 0.6059}},
    {8, 11782656, {0.1459, 0.1134, 0.1136, 0.1067, 0.6714, 0.6160}},
    {8, 11782656, {0.1498, 0.1156, 0.1180, 0.1098, 0.6823, 0.6220}},
    {8, 11782656, {0.1504, 0.1177, 0.1170, 0.1099, 0.6560, 0.6134}},
    {8, 11782656, {0.1471, 0.1158, 0.1165, 0.1081, 0.6665, 0.6283}},
    {8, 11782656, {0.1505, 0.1170, 0.1168, 0.1105, 0.6629, 0.6196}},
    {8, 11782656, {0.1455, 0.1154, 0.1161, 0.1102, 0.6553, 0.6121}},
    {8, 11782656, {0.1485, 0.1171, 0.1168, 0.1095, 0.6589, 0.6183}},
    {8, 11782656, {0.1494, 0.1164, 0.1149, 0.1085, 0.6697, 0.6303}},
    {8, 11782656, {0.1488, 0.1173, 0.1159, 0.1077, 0.6277, 0.6060}},
    {8, 11782656, {0.1504, 0.1135, 0.1136, 0.1052, 0.6423, 0.6191}},
    {8, 11782656, {0.1497, 0.1130, 0.1131, 0.1057, 0.6607, 0.6279}},
    {8, 11782656, {0.1498, 0.1176, 0.1161, 0.1095, 0.6705, 0.6320}},
    {8, 11782656, {0.1507, 0.1178, 0.1183, 0.1104, 0.6645, 0.6765}},
    {16, 11831808, {0.2437, 0.1831, 0.1873, 0.1667, 1.0519, 0.8977}},
    {16, 11831808, {0.2414, 0.1858, 0.1809, 0.1673, 1.0312, 0.9416}},
};

/// The example's job, first plan and controller (ppo.py: 8 host devices of 12.6 MiB, γ = 1e-4).
struct PpoExample {
  JobSpec job;
  GlobalPlan plan;
  ClusterSpec cluster;
  ControllerOptions options;

  explicit PpoExample(std::size_t capacity = parse_capacity("12.6MiB")) {
    const char* root = std::getenv("NEREUS_SOURCE");
    REQUIRE_MESSAGE(root, "NEREUS_SOURCE names the source tree");
    job = load_job(std::string(root) + "/examples/rlhf/ppo-tiny-rule.json");
    plan = parse_global_plan(job, R"({"actor/generate": "tp=1,pp=1,dp=2,devices=4-5",
      "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
      "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "actor/train": "tp=2,pp=1,dp=1,devices=4-5",
      "critic/train": "tp=2,pp=1,dp=1,devices=6-7"})", "ppo.py's plan");
    cluster = host_cluster(8, capacity);
    options.gamma = 1e-4;
  }

  /// Reports steps 0..n-1 as ppo.py does: step k's times and peak once step k + 1 has
  /// generated, with the length step k + 2 will have; steps 0-16 had the lengths of kRun,
  /// step 17 had 24 and step 18 has `last_length`. Returns the decision for step n + 1.
  Decision replay(Controller& ctl, int n, int last_length, bool* switched = nullptr) const {
    auto length = [&](int k) { return k < 17 ? kRun[k].length : k == 17 ? 24 : last_length; };
    Decision d;
    for (int k = 0; k < n; ++k) {
      StepObservation o;
      const Observed& r = kRun[k];
      for (int i = 0; i < 6; ++i) o.stage_seconds.emplace_back(kStages[i], r.seconds[i]);
      o.response_len_mean = o.response_len_p95 = r.length;
      o.peak_bytes = r.peak;
      const double next = length(k + 2);
      o.next = {k + 1, 8, next, next, 1};
      d = ctl.step(plan, o);
      if (k + 1 < n && d.admitted && switched) *switched = true;
    }
    return d;
  }
};

}  // namespace

TEST_CASE("urgent path: ppo.py's step 17 — S* out of reach, another runnable plan that is reachable is admitted") {
  const PpoExample ex;
  Controller ctl(ex.job, ex.cluster, ex.options);
  bool switched = false;
  const Decision d = ex.replay(ctl, 17, 32, &switched);
  REQUIRE_MESSAGE(!switched, "the example kept its first plan until step 17");
  const Signals next{17, 8, 32, 32, 1};
  const Workload w = ctl.workload(next);
  // The case as it was: the current plan cannot run step 17, and S* cannot be reached.
  REQUIRE_FALSE(estimate_plan(ctl.model(), ex.job, ex.plan, w).fits);
  const PlanChoice best = plan_job(ctl.model(), ex.job, 8, w);
  REQUIRE(best.feasible);
  REQUIRE_FALSE(ctl.transition(ex.plan, best.plan, next).feasibility.ok);
  CHECK(has(d.trigger, "memory"));
  CHECK(d.urgent);
  REQUIRE(d.admitted);
  CHECK_FALSE(d.blocked);
  // What it admitted runs step 17 and can be reached from where the job is.
  CHECK(estimate_plan(ctl.model(), ex.job, d.target, w).fits);
  const TransitionGraph g = ctl.transition(ex.plan, d.target, next);
  CHECK(g.feasibility.ok);
  CHECK(d.moved_bytes == g.summary.moved_bytes);
  // Each refusal is logged with where the candidate came from; S* is the first.
  REQUIRE_FALSE(d.refused.empty());
  CHECK(has(d.refused.front(), "S*: unreachable"));
  CHECK(has(d.why, "urgent"));
}

TEST_CASE("urgent path: when no plan that runs the next step can be reached, the decision is blocked and says why") {
  // 12 MiB devices and responses of 960 tokens: some plans fit by the cost model, but
  // none can be reached from the example's plan.
  const PpoExample ex(parse_capacity("12MiB"));
  Controller ctl(ex.job, ex.cluster, ex.options);
  const Decision d = ex.replay(ctl, 17, 960);
  CHECK(d.urgent);
  CHECK_FALSE(d.admitted);
  REQUIRE(d.blocked);
  CHECK_FALSE(d.refused.empty());
  for (const std::string& r : d.refused) CHECK(has(r, "unreachable"));
  // One sentence with the step, the GPU, the model-stage and the shortfall.
  CHECK(has(d.why, "step 17 cannot run on the current plan: GPU 4 needs"));
  CHECK(has(d.why, "actor/train's working memory, over its budget of 11.32 MB"));
  CHECK(has(d.why, "short), and none of the " + std::to_string(d.refused.size()) + " plans tried can be reached"));
  CHECK(d.moved_bytes == 0);

  // Longer still, nothing fits at all: blocked, with the planner's reason.
  Controller again(ex.job, ex.cluster, ex.options);
  const Decision none = ex.replay(again, 17, 1280);
  REQUIRE(none.blocked);
  CHECK(none.refused.empty());
  CHECK(has(none.why, "step 17 cannot run on the current plan: GPU 4 needs"));
  CHECK(has(none.why, "no plan fits"));
}

TEST_CASE("urgent path: over capacities and lengths, an urgent decision is a reachable switch or blocked, never stay") {
  int switched = 0, blocked = 0, urgent = 0;
  for (const char* capacity : {"11MiB", "12MiB", "12.6MiB", "13MiB", "14MiB"})
    for (int length : {32, 48, 64, 128, 320, 960}) {
      CAPTURE(capacity);
      CAPTURE(length);
      const PpoExample ex(parse_capacity(capacity));
      Controller ctl(ex.job, ex.cluster, ex.options);
      const Decision d = ex.replay(ctl, 17, length);
      const Signals next{17, 8, double(length), double(length), 1};
      const Workload w = ctl.workload(next);
      const bool runs = estimate_plan(ctl.model(), ex.job, ex.plan, w).fits;
      CHECK(d.urgent == !runs);
      if (!d.urgent) {
        CHECK_FALSE(d.blocked);
        continue;
      }
      ++urgent;
      CHECK(d.admitted != d.blocked);
      if (d.admitted) {
        ++switched;
        CHECK(estimate_plan(ctl.model(), ex.job, d.target, w).fits);
        CHECK(ctl.transition(ex.plan, d.target, next).feasibility.ok);
      } else {
        ++blocked;
      }
    }
  // The grid covers all three outcomes.
  CHECK(urgent < 30);
  CHECK(switched > 0);
  CHECK(blocked > 0);
  MESSAGE("urgent " << urgent << ": " << switched << " switched, " << blocked << " blocked");
}
