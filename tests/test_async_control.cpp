// The controller in async mode: the planner splits the pool between generation and the
// rest and agrees with a brute force over both halves and the update together; its
// estimate, the rescaled plans and the refusals keep generation and training apart; the
// simulator's two streams, timed step after step on the truth, settle at the period the
// cost model's formula gives for the same stage times.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>

#include "job_cases.hpp"
#include "nereus/control/controller.hpp"
#include "nereus/control/planner.hpp"
#include "nereus/core/presets.hpp"
#include "nereus/sim/simulator.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testcase::small_cluster;

namespace {

std::set<DeviceId> devices_of(const GlobalPlan& plan, bool generation) {
  std::set<DeviceId> out;
  for (const auto& [name, spec] : plan.stages)
    if (name.ends_with("/generate") == generation) out.insert(spec.devices.begin(), spec.devices.end());
  return out;
}

bool apart(const GlobalPlan& plan) {
  const auto g = devices_of(plan, true), r = devices_of(plan, false);
  return std::none_of(g.begin(), g.end(), [&](DeviceId d) { return r.count(d) > 0; });
}

}  // namespace

TEST_CASE("async planner: equal to a brute force over both halves and the update; generation apart, on the last GPUs") {
  JobSpec ppo = testcase::tiny_ppo_job();
  ppo.async = true;
  JobSpec grpo = ppo;
  grpo.algorithm = Algorithm::grpo;
  grpo.models.erase(grpo.models.begin() + 1);  // no critic
  std::mt19937_64 rng(11);
  int feasible = 0, close = 0, cases = 0;
  for (int k = 0; k < 100; ++k) {
    JobSpec job = k % 3 == 0 ? ppo : grpo;
    job.max_staleness = 1 + k % 2;
    const int gpus = std::uniform_int_distribution<int>(2, k % 3 == 0 ? 3 : 4)(rng);
    const double mem = std::uniform_real_distribution<double>(0.003, 0.02)(rng);
    const CostModel model(small_cluster(mem, std::uniform_int_distribution<int>(0, 1)(rng) ? 2 : 4));
    const double len = std::uniform_real_distribution<double>(16, 400)(rng);
    const Workload w = Workload::of(job, len, len * 1.3);
    const PlanChoice fast = plan_job(model, job, gpus, w);
    const PlanChoice all = plan_job_exhaustive(model, job, gpus, w);
    CAPTURE(k);
    ++cases;
    REQUIRE(fast.feasible == all.feasible);
    if (!fast.feasible) continue;
    ++feasible;
    // The halves are searched apart and the update added after: never better than the
    // brute force, and within 2% of it (the update is small beside the stages).
    CHECK(fast.step_seconds >= all.step_seconds * (1 - 1e-9));
    CHECK(fast.step_seconds <= all.step_seconds * 1.02);
    close += fast.step_seconds <= all.step_seconds * (1 + 1e-9);
    // Generation on the pool's last GPUs, apart from every other stage.
    CHECK(apart(fast.plan));
    const auto g = devices_of(fast.plan, true);
    CHECK(*g.rbegin() < gpus);
    CHECK(*g.begin() >= gpus - fast.generation_gpus);
    // The estimate of the chosen plan agrees, and it fits.
    const PlanEstimate e = estimate_plan(model, job, fast.plan, w);
    CHECK(e.refusal.empty());
    CHECK(e.fits);
    CHECK(e.step_seconds == doctest::Approx(fast.step_seconds).epsilon(1e-9));
    CHECK(e.step_seconds ==
          doctest::Approx(async_step_seconds(e.generation_seconds, e.training_seconds, e.update_seconds, job.max_staleness)));
    CHECK(e.update_seconds > 0);
  }
  MESSAGE(cases << " cases, " << feasible << " feasible, " << close << " at the brute force's optimum exactly");
  CHECK(feasible > 15);  // GRPO from 4 GPUs: 1 generating, 3 inferring side by side
  CHECK(close >= feasible * 9 / 10);
}

TEST_CASE("async step: the period of the two streams, and staleness lets the cycle spread") {
  CHECK(async_step_seconds(10, 4, 1, 1) == doctest::Approx(10));      // generation bound
  CHECK(async_step_seconds(4, 10, 1, 1) == doctest::Approx(11));      // training and its update
  CHECK(async_step_seconds(10, 9, 1, 1) == doctest::Approx(10));      // (10 + 9 + 1) / 2 = 10
  CHECK(async_step_seconds(10, 10, 2, 1) == doctest::Approx(12));     // the cycle: 22 / 2 = 11 < 12
  CHECK(async_step_seconds(10, 10, 10, 1) == doctest::Approx(20));
  CHECK(async_step_seconds(10, 10, 10, 2) == doctest::Approx(20));    // staleness cannot beat a stream
  CHECK(async_step_seconds(12, 6, 6, 1) == doctest::Approx(12));
}

TEST_CASE("async estimate: a plan that shares a GPU between generation and training is refused by name") {
  JobSpec job = testcase::tiny_ppo_job();
  const CostModel model(small_cluster(80, 4));
  const Workload w = Workload::of(job, 64, 80);
  const PlanChoice sync = plan_job(model, job, 4, w);  // every phase on GPUs 0..
  REQUIRE(sync.feasible);
  job.async = true;
  const PlanEstimate e = estimate_plan(model, job, sync.plan, w);
  CHECK_FALSE(e.fits);
  CHECK(has(e.refusal, "actor/generate and "));
  CHECK(has(e.refusal, "/train share GPU"));
  const PlanChoice a = plan_job(model, job, 6, w);  // generation apart from 4 inference stages
  REQUIRE(a.feasible);
  CHECK(apart(a.plan));
  CHECK(estimate_plan(model, job, a.plan, w).fits);
  // One GPU cannot hold both streams.
  const PlanChoice one = plan_job(model, job, 1, w);
  CHECK_FALSE(one.feasible);
  CHECK(has(one.reason, "at least 2"));
}

TEST_CASE("async controller: rescaled plans keep the halves apart inside the pool; plan changes are charged the drain") {
  JobSpec job = load_job("ppo-llama-3.1-8b");
  job.async = true;
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  Controller ctl(job, cluster);
  const GlobalPlan first = ctl.initial({0, 32, 500, 700, 1});
  CHECK(apart(first));
  for (int gpus : {24, 16, 48, 64}) {
    CAPTURE(gpus);
    const GlobalPlan scaled = ctl.rescale(first, gpus);
    CHECK(apart(scaled));
    CHECK_FALSE(outside_pool(scaled, gpus));
  }
  // A long-response drift replans; whatever it decides, a charged plan change costs at
  // least its L_tran (the drain comes on top), and a target keeps the halves apart.
  const Decision d = ctl.decide({1, 32, 4000, 6000, 1}, first);
  CHECK(d.replanned);
  if (d.admitted) {
    CHECK(apart(d.target));
    if (!d.urgent) CHECK(d.charged_seconds >= d.transition_seconds);
  }
}

TEST_CASE("async simulator: the streams settle at the cost model's period for the same stage times; updates are timed by the truth") {
  JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  std::vector<TraceStep> trace;
  for (long k = 0; k < 48; ++k) trace.push_back({k, 32, 600, 800, 1});
  SimulationOptions o;
  o.noise = 0;  // the truth's stage times repeat: the streams' steady state shows
  o.controller.policy = Policy::fixed;
  o.profile_runs = 4;
  for (std::int64_t staleness : {1, 2}) {
    CAPTURE(staleness);
    job = with_mode(job, "async", staleness);
    const SimulationResult r = simulate(cluster, job, trace, o);
    REQUIRE(r.records.size() == trace.size());
    CHECK(r.failed_steps == 0);
    const StepRecord& last = r.records.back();
    CHECK(last.update_seconds > 0);
    CHECK(last.generation_seconds > 0);
    CHECK(last.training_seconds > 0);
    // The timeline, step after step, against the closed form of the steady state: where
    // the stream times repeated for the steps before (the truth's occasional slow replica
    // breaks the repetition; the first steps fill the pipeline).
    int checked = 0;
    for (std::size_t k = 6; k < r.records.size(); ++k) {
      const StepRecord& s = r.records[k];
      bool same = true;
      for (std::size_t j = k - 4; j < k; ++j)
        same = same && r.records[j].generation_seconds == s.generation_seconds &&
               r.records[j].training_seconds == s.training_seconds && r.records[j].update_seconds == s.update_seconds;
      if (!same) continue;
      ++checked;
      CHECK(s.seconds ==
            doctest::Approx(async_step_seconds(s.generation_seconds, s.training_seconds, s.update_seconds, staleness))
                .epsilon(1e-6));
    }
    CHECK(checked >= 4);
  }
  // A sync job's records have no streams.
  job = with_mode(job, "sync", 0);
  const SimulationResult sync = simulate(cluster, job, trace, o);
  CHECK(sync.records.back().update_seconds == 0);
}

TEST_CASE("async simulator: pool changes, failures and transitions drain the streams, and every second is accounted for") {
  const JobSpec job = with_mode(load_job("ppo-llama-3.1-8b"), "async", 0);
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(source, "NEREUS_SOURCE names the source tree");
  auto spot = load_trace(std::string(source) + "/examples/traces/spot-16-64gpu.jsonl");
  spot.resize(200);
  std::vector<TraceStep> jump;  // responses 17x longer at step 6: the plan runs out of memory
  for (long k = 0; k < 12; ++k) jump.push_back({k, 32, k < 6 ? 400.0 : 7000.0, k < 6 ? 460.0 : 8050.0, 1});
  SimulationOptions o;
  o.profile_runs = 8;
  int failed = 0, transitions = 0;
  for (const auto* trace : {&spot, &jump})
    for (const std::string policy : {"static", "nereus"}) {
      CAPTURE(policy);
      o.controller.policy = parse_policy(policy, o.controller.every);
      const SimulationResult r = simulate(cluster, job, *trace, o);
      failed += r.failed_steps;
      transitions += r.transitions;
      double sum = 0, exposed = 0, lost = 0;
      for (const StepRecord& s : r.records) {
        sum += s.seconds;
        exposed += s.exposed_seconds;
        lost += s.failure_seconds;
        // A plan change drains the streams and runs in the open: all of it exposed, and the
        // step lasts at least that and the failure it had.
        CHECK(s.exposed_seconds == doctest::Approx(s.transition_seconds));
        CHECK(s.seconds + 1e-9 >= s.exposed_seconds + s.failure_seconds);
        if (!s.failed) CHECK(s.update_seconds > 0);  // every step that ran made a version and copied it
      }
      CHECK(r.total_seconds == doctest::Approx(sum));
      CHECK(r.exposed_transition_seconds == doctest::Approx(exposed));
      CHECK(r.failure_seconds == doctest::Approx(lost));
      CHECK(r.mean_compute_seconds <= r.mean_step_seconds + 1e-9);
      for (const Decision& d : r.decisions) CHECK((!d.urgent || d.admitted || d.blocked));
    }
  CHECK(transitions > 0);  // the pool changes, the lengths
  CHECK(failed > 0);       // the jump: the failure path ran too
}

TEST_CASE("with_mode: the command line's --mode and --max-staleness over the job file's, bad ones refused by name") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  CHECK_FALSE(job.async);
  const JobSpec a = with_mode(job, "async", 3);
  CHECK(a.async);
  CHECK(a.max_staleness == 3);
  CHECK(with_mode(a, "", 0).max_staleness == 3);
  CHECK_FALSE(with_mode(a, "sync", 0).async);
  CHECK(has(error_of([&] { with_mode(job, "lockstep", 0); }), "--mode 'lockstep' is not one of sync, async"));
  CHECK(has(error_of([&] { with_mode(job, "", 2); }), "--max-staleness is for async jobs"));
  CHECK(has(error_of([&] { with_mode(job, "async", -1); }), "at least 1"));
}
