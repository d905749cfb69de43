// The cost model and the planner: the planner's optimum equals an exhaustive search on
// every case small enough to enumerate (tight memory, so both paths of the planner run),
// its plans fit by the per-GPU estimate, and the cost model behaves as physics says.
#include <doctest/doctest.h>

#include <random>
#include <set>

#include "job_cases.hpp"
#include "nereus/control/controller.hpp"
#include "nereus/control/planner.hpp"
#include "nereus/plan/overlap.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testcase::small_cluster;

TEST_CASE("planner: equal to exhaustive search on small cases, memory binding or not") {
  JobSpec ppo = testcase::tiny_ppo_job();
  JobSpec grpo = ppo;
  grpo.algorithm = Algorithm::grpo;
  grpo.models.erase(grpo.models.begin() + 1);  // no critic
  std::mt19937_64 rng(7);
  int cases = 0, feasible = 0, slow = 0;
  for (int k = 0; k < 300; ++k) {
    const JobSpec& job = k % 3 == 0 ? ppo : grpo;
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
    CHECK(fast.step_seconds == doctest::Approx(all.step_seconds).epsilon(1e-9));
    // The chosen plan is what it claims: its estimate agrees and it fits.
    const PlanEstimate e = estimate_plan(model, job, fast.plan, w);
    CHECK(e.step_seconds == doctest::Approx(fast.step_seconds).epsilon(1e-9));
    CHECK(e.peak_memory_bytes <= fast.peak_memory_bytes + 1);
    CHECK(e.fits);
    slow += !fast.fast_path;
  }
  MESSAGE(cases << " cases, " << feasible << " feasible, " << slow << " through the Pareto search");
  CHECK(slow > 5);
  CHECK(feasible > 60);
  CHECK(feasible < cases);  // some too tight for any plan
}

TEST_CASE("cost model: more GPUs, longer responses, slower links") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const CostModel model(load_cluster("paper-cluster-3-h200"));
  const auto stages = model_stages(job);
  const ModelStage& gen = stages[0];
  const ModelStage& train = stages[5];
  REQUIRE(gen.kind == StageKind::generate);
  REQUIRE(train.kind == StageKind::train);
  const Workload short_w = Workload::of(job, 500, 600), long_w = Workload::of(job, 8000, 9000);
  // DP halves the per-replica batch (inside a node); across cluster-3's one NIC per
  // node the gradient all-reduce can cost more than it saves.
  CHECK(model.seconds(train, {2, 1, 4}, short_w) < model.seconds(train, {2, 1, 2}, short_w));
  // Longer responses cost more time and KV cache.
  CHECK(model.seconds(gen, {2, 1, 4}, long_w) > 4 * model.seconds(gen, {2, 1, 4}, short_w));
  CHECK(model.memory(gen, {2, 1, 4}, long_w).transient > 8 * model.memory(gen, {2, 1, 4}, short_w).transient);
  // Recomputation trades time for memory.
  CHECK(model.seconds(train, {2, 1, 4, true}, long_w) > model.seconds(train, {2, 1, 4, false}, long_w));
  CHECK(model.memory(train, {2, 1, 4, true}, long_w).transient < model.memory(train, {2, 1, 4, false}, long_w).transient);
  // Training state: 16 bytes a parameter, split over tp·pp.
  CHECK(model.memory(train, {1, 1, 1}, short_w).resident > 16.0 * 8e9);
  CHECK(model.memory(train, {4, 2, 1}, short_w).resident < model.memory(train, {1, 1, 1}, short_w).resident / 6);
  // A slower inter-node link slows a DP all-reduce across nodes.
  Workload slow_w = short_w;
  slow_w.link_slowdown = 4;
  CHECK(model.seconds(train, {8, 1, 8}, slow_w) > model.seconds(train, {8, 1, 8}, short_w));
  // Bad clusters are refused.
  ClusterSpec bad = load_cluster("h200-node");
  bad.hbm_gbps = 0;
  CHECK(has(error_of([&] { CostModel m(bad); }), "lacks positive"));
}

TEST_CASE("planner: plans grow with the pool and adapt to long responses") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const CostModel model(load_cluster("paper-cluster-3-h200"));
  const Workload w = Workload::of(job, 2000, 2400);
  double prev = 1e30;
  for (int g : {8, 16, 32, 64}) {
    const PlanChoice c = plan_job(model, job, g, w);
    REQUIRE(c.feasible);
    CHECK(c.step_seconds < prev);
    prev = c.step_seconds;
    CHECK(c.peak_memory_bytes <= model.budget() + model.overhead_bytes());
    // Each phase fits the pool; TP groups never leave a node.
    for (const auto& [name, spec] : c.plan.stages) {
      CHECK(spec.layout.tp <= 8);
      CHECK(spec.devices.back() < g);
      for (std::size_t i = 0; i < spec.devices.size(); i += static_cast<std::size_t>(spec.layout.tp))
        CHECK(spec.devices[i] / 8 == spec.devices[i + static_cast<std::size_t>(spec.layout.tp) - 1] / 8);
    }
  }
  // At 8 GPUs and very long responses something must give: the plan still fits.
  const PlanChoice tight = plan_job(model, job, 8, Workload::of(job, 12000, 16000));
  if (tight.feasible) CHECK(estimate_plan(model, job, tight.plan, Workload::of(job, 12000, 16000)).fits);
}

TEST_CASE("controller: a plan the corrected model ranks well ahead triggers a replan; it pays back over the steps the plan has stood") {
  // A job that began on a plan of its own for 16 GPUs runs on 32, and nothing drifts: the
  // model alone finds S* more than δ/3 ahead. No drift signal has
  // crossed yet, so the horizon is the steps since the first one, and the move waits
  // until it pays back within them.
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  const CostModel model(cluster);
  const Workload w = Workload::of(job, 500, 580);
  const GlobalPlan slow = plan_job(model, job, 16, w).plan;  // half the GPUs idle
  const PlanEstimate e = estimate_plan(model, job, slow, w);
  const OverlapGraph og = overlap_graph(job, slow);
  StepObservation o;
  for (std::size_t i = 0; i < og.stages.size(); ++i) o.stage_seconds.emplace_back(og.stages[i].name(), e.stage_seconds[i]);
  ControllerOptions options;
  options.gamma = 0.01;  // a transition must pay back a hundred times over: not within one step
  Controller ctl(job, cluster, options);
  double horizon = 0;
  long admitted_at = 0;
  for (long k = 1; k <= 60 && !admitted_at; ++k) {
    o.next = {k, 32, 500, 580, 1};
    const Decision d = ctl.step(slow, o);
    CAPTURE(k);
    CAPTURE(d.why);
    REQUIRE(d.trigger == "model");
    CHECK(d.horizon_steps == doctest::Approx(std::max(1L, k - 1)));  // the steps since the first
    horizon = d.horizon_steps;
    if (d.admitted) {
      admitted_at = k;
      CHECK(has(d.why, "pays back"));
      CHECK(d.transition_seconds <= options.gamma * d.horizon_steps * (d.current_seconds - d.target_seconds) + 1e-9);
    } else {
      CHECK(has(d.why, "does not pay back"));
    }
  }
  CHECK(admitted_at > 1);
  CHECK(horizon > 1);
}

TEST_CASE("controller: step() calibrates from a live job's stage times, then decides against the first step's signals") {
  const JobSpec job = load_job("ppo-tiny");
  ClusterSpec cluster = load_cluster("h200-node");
  Controller ctl(job, cluster);
  const GlobalPlan plan = load_global_plan(job, R"({"actor/generate": "tp=2,pp=1,dp=4,devices=0-7",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=4-5", "reward/infer": "tp=2,pp=1,dp=1,devices=6-7",
    "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})");
  StepObservation o;
  o.next = {1, 8, 128, 192, 1};
  for (const ModelStage& s : model_stages(job)) o.stage_seconds.emplace_back(s.name(), 0.5);
  const Decision first = ctl.step(plan, o);
  CHECK(ctl.calibrator().measurements() == model_stages(job).size());
  // The references are the first step's own signals: no drift. (The corrected model may
  // still rank another plan well ahead of this hand-written one: a "model" trigger.)
  CHECK((first.trigger.empty() || first.trigger == "model"));
  o.next = {2, 8, 1024, 1536, 1};  // responses 8x longer
  const Decision second = ctl.step(plan, o);
  CHECK(has(second.trigger, "length"));
  CHECK(second.replanned);
  o.stage_seconds = {{"actor/nothing", 1.0}};
  CHECK(has(error_of([&] { ctl.step(plan, o); }), "'actor/nothing' is not a model-stage"));
  o.stage_seconds = {{"actor/train", -1.0}};
  CHECK(has(error_of([&] { ctl.step(plan, o); }), "times are finite and >= 0"));
}

TEST_CASE("calibrator: with a faint prior, recovers the efficiencies that produced the measurements; unseen classes keep the prior") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> work(0.01, 2.0);
  std::array<double, kOpClasses> truth{};
  for (std::size_t c = 0; c < kOpClasses; ++c) truth[c] = 0.3 + 0.6 * static_cast<double>(c) / (kOpClasses - 1);  // within (0, 1]
  const std::size_t unseen = kOpClasses - 1;
  // The prior weighs as much as prior_weight measurements in which its class took all the
  // time, so it fades as measurements accumulate; the fit itself is checked with a faint
  // prior, and the default one is checked to fade below.
  Calibrator cal(conservative_efficiency(), 1e-6);
  std::vector<Measurement> held_out;
  for (int i = 0; i < 400; ++i) {
    Measurement m;
    for (std::size_t c = 0; c + 1 < kOpClasses; ++c) m.work.ideal[c] = rng() % 3 == 0 ? 0.0 : work(rng);
    m.seconds = m.work.seconds(truth);
    if (m.seconds == 0) continue;
    (i % 4 == 0 ? held_out.push_back(m) : cal.add(m));
  }
  const auto eff = cal.efficiency();
  for (std::size_t c = 0; c < unseen; ++c) CHECK(eff[c] == doctest::Approx(truth[c]).epsilon(0.01));
  CHECK(eff[unseen] == doctest::Approx(conservative_efficiency()[unseen]));
  CHECK(cal.seen()[unseen] == 0);
  const Fit f = Calibrator::fit(eff, held_out);
  CHECK(f.n == held_out.size());
  CHECK(f.mape < 0.005);
  // The default prior fades: after 1,500 such measurements (each class about a tenth of
  // each), within 2% of the truth.
  Calibrator usual;
  for (int i = 0; i < 1500; ++i) {
    Measurement m;
    for (std::size_t c = 0; c + 1 < kOpClasses; ++c) m.work.ideal[c] = rng() % 3 == 0 ? 0.0 : work(rng);
    m.seconds = m.work.seconds(truth);
    if (m.seconds > 0) usual.add(m);
  }
  for (std::size_t c = 0; c < unseen; ++c) CHECK(usual.efficiency()[c] == doctest::Approx(truth[c]).epsilon(0.02));
}

TEST_CASE("calibrator: efficiencies stay within (0, 1] inside the fit, and the other classes fit around a bound") {
  // Gemm alone took 0.8 s of work worth 1 s at peak (faster than peak: a model error),
  // gemm and attention together 2.8 s. Unbounded, gemm fits 1.25 and attention 0.5; a
  // clamp afterwards would leave attention at 0.5 and predict 3 s for the second run.
  // Bounded inside the fit, gemm is 1 and attention takes what is left: 1/1.8.
  Calibrator cal(conservative_efficiency(), 1e-9);
  Measurement alone, both;
  alone.work.ideal[static_cast<std::size_t>(OpClass::gemm)] = 1;
  alone.seconds = 0.8;
  both.work.ideal[static_cast<std::size_t>(OpClass::gemm)] = 1;
  both.work.ideal[static_cast<std::size_t>(OpClass::attention)] = 1;
  both.seconds = 2.8;
  cal.add(alone);
  cal.add(both);
  const auto eff = cal.efficiency();
  CHECK(eff[static_cast<std::size_t>(OpClass::gemm)] == doctest::Approx(1.0));
  CHECK(eff[static_cast<std::size_t>(OpClass::attention)] == doctest::Approx(1 / 1.8).epsilon(0.001));
  for (double e : eff) {
    CHECK(e > 0);
    CHECK(e <= 1.0);
  }
}

TEST_CASE("calibrator: a configuration measured a thousand times weighs as much as one measured once") {
  // A plan that runs for a thousand steps must not drown the profile of the others: the
  // fit takes each configuration's mean. A (gemm and attention) disagrees with B (gemm
  // alone) and C (attention alone), as a model error would make it.
  auto measurement = [](double gemm, double attention, double seconds, std::string config) {
    Measurement m;
    m.work.ideal[static_cast<std::size_t>(OpClass::gemm)] = gemm;
    m.work.ideal[static_cast<std::size_t>(OpClass::attention)] = attention;
    m.seconds = seconds;
    m.config = std::move(config);
    return m;
  };
  Calibrator once(conservative_efficiency(), 1e-9), often(conservative_efficiency(), 1e-9),
      anonymous(conservative_efficiency(), 1e-9);
  once.add(measurement(1, 1, 5, "A"));
  for (int i = 0; i < 1000; ++i) {
    often.add(measurement(1, 1, 5, "A"));
    anonymous.add(measurement(1, 1, 5, ""));
  }
  for (Calibrator* c : {&once, &often, &anonymous}) {
    c->add(measurement(1, 0, 2, "B"));
    c->add(measurement(0, 1, 2, "C"));
  }
  for (std::size_t k : {static_cast<std::size_t>(OpClass::gemm), static_cast<std::size_t>(OpClass::attention)}) {
    CHECK(often.efficiency()[k] == doctest::Approx(once.efficiency()[k]));
    // Without a configuration, each measurement is its own: A's thousand copies win.
    CHECK(anonymous.efficiency()[k] == doctest::Approx(0.4).epsilon(0.01));
    CHECK(once.efficiency()[k] > 0.42);
  }
  CHECK(often.measurements() == 1002);
}

TEST_CASE("controller: the first measured peak sets the memory scale; later ones raise it at once, lower it slowly") {
  const JobSpec job = load_job("ppo-tiny");
  Controller ctl(job, load_cluster("h200-node"));
  const std::uint64_t o = ctl.model().overhead_bytes();
  const std::uint64_t predicted = o + 1000000;  // 1 MB of stage memory at scale 1
  ctl.measure_memory(predicted, o + 600000);
  CHECK(ctl.model().memory_scale() == doctest::Approx(0.6));
  // The prediction at scale 0.6 was 0.6 MB: measuring 0.9 MB raises it to 0.9 at once.
  ctl.measure_memory(o + 600000, o + 900000);
  CHECK(ctl.model().memory_scale() == doctest::Approx(0.9));
  // Measuring 0.45 MB against 0.9 MB predicted lowers it a tenth of the way (0.9 → 0.855).
  ctl.measure_memory(o + 900000, o + 450000);
  CHECK(ctl.model().memory_scale() == doctest::Approx(0.855));
}

TEST_CASE("planner: equal to exhaustive search on small MoE jobs, which search ep and etp") {
  JobSpec grpo = testcase::tiny_ppo_job(true);  // actor and reference: 5 experts, Ie = 30
  grpo.algorithm = Algorithm::grpo;
  grpo.models.erase(grpo.models.begin() + 1);  // no critic
  std::mt19937_64 rng(11);
  int feasible = 0, with_ep = 0;
  for (int k = 0; k < 80; ++k) {
    const int gpus = std::uniform_int_distribution<int>(2, 4)(rng);
    const CostModel model(small_cluster(std::uniform_real_distribution<double>(0.003, 0.02)(rng), k % 2 ? 2 : 4));
    const double len = std::uniform_real_distribution<double>(16, 400)(rng);
    const Workload w = Workload::of(grpo, len, len * 1.3);
    const PlanChoice fast = plan_job(model, grpo, gpus, w);
    const PlanChoice all = plan_job_exhaustive(model, grpo, gpus, w);
    CAPTURE(k);
    REQUIRE(fast.feasible == all.feasible);
    if (!fast.feasible) continue;
    ++feasible;
    CHECK(fast.step_seconds == doctest::Approx(all.step_seconds).epsilon(1e-9));
    for (const PlannedStage& s : fast.stages) with_ep += s.candidate.ep > 1;
    CHECK(estimate_plan(model, grpo, fast.plan, w).fits);
  }
  // Tiny experts never pay for their all-to-all; Qwen3-30B-A3B's do (next test case).
  MESSAGE(feasible << " feasible, " << with_ep << " model-stages chosen with ep > 1");
  CHECK(feasible > 20);

  // Candidates: ep in powers of two, etp whole (1) or as TP, every one valid; dense: ep = 1.
  const auto stages = model_stages(grpo);
  const auto cands = stage_candidates(stages[0], 8, small_cluster(1, 8), 16);
  std::set<std::pair<int, int>> seen;
  for (const Candidate& c : cands) {
    CHECK_NOTHROW(validate_layout(stages[0].model->config(), c.layout()));
    seen.insert({c.ep, c.expert_tp()});
  }
  CHECK(seen.count({2, 1}));
  CHECK(seen.count({4, 1}));
  CHECK(seen.count({2, 2}));  // tp=2, ep=2, experts split like attention
  for (const Candidate& c : stage_candidates(model_stages(testcase::tiny_ppo_job())[0], 8, small_cluster(1, 8), 16))
    CHECK(c.ep == 1);
}

TEST_CASE("cost model: MoE FLOPs count active parameters, memory every expert, EP an all-to-all") {
  const JobSpec job = parse_job(R"({"algorithm":"grpo","models":{"actor":"qwen3-30b-a3b","reference":"qwen3-30b-a3b","reward":"rule"},
      "prompts_per_step":64,"samples_per_prompt":8,"prompt_len":1024,"max_response_len":8192})", "moe-job");
  const ClusterSpec cluster = load_cluster("paper-cluster-3-h200");
  const CostModel model(cluster);
  const auto stages = model_stages(job);
  auto find = [&](StageKind k) {
    for (const ModelStage& s : stages)
      if (s.kind == k) return s;
    FAIL("no stage");
    return stages[0];
  };
  const ModelStage gen = find(StageKind::generate), infer = find(StageKind::infer), train = find(StageKind::train);
  const Workload w = Workload::of(job, 2000, 2400);
  const auto ideal = [](const StageOps& o, OpClass c) { return o.ideal[static_cast<std::size_t>(c)]; };

  // Qwen3-30B-A3B activates 3.3 B parameters a token, 0.31 B of them the embedding lookup:
  // about 3.0 B in matrix multiplies, 1.8 B of those in the 8 experts it picks.
  const StageOps one = model.work(infer, {1, 1, 1}, w);
  const double tokens = static_cast<double>(w.sequences) * (w.prompt_len + w.response_len_mean);
  const double peak = cluster.gpu_bf16_tflops * 1e12;
  const double active = (ideal(one, OpClass::gemm) + ideal(one, OpClass::expert)) * peak / (2 * tokens);
  CHECK(active == doctest::Approx(3.04e9).epsilon(0.03));
  CHECK(ideal(one, OpClass::expert) * peak / (2 * tokens) == doctest::Approx(1.81e9).epsilon(0.03));
  CHECK(ideal(one, OpClass::alltoall_intra) + ideal(one, OpClass::alltoall_inter) == 0);  // one expert group: no dispatch
  // Memory holds all 30.5 B parameters; expert parallelism spreads the experts.
  CHECK(static_cast<double>(model.memory(gen, {1, 1, 1}, w).resident) == doctest::Approx(2 * 30.5e9).epsilon(0.02));
  const Candidate ep8{1, 1, 1, false, 8, 1};
  CHECK(model.memory(gen, ep8, w).resident < model.memory(gen, {1, 1, 1}, w).resident / 5);
  // The all-to-all crosses nodes once a stage's tp·ep GPUs leave one (8 GPUs a node):
  // slower per byte than inside, and a class of its own (NICs reach another share of
  // their bandwidth than NVLink), as its per-peer latency is.
  const StageOps in8 = model.work(infer, ep8, w), across16 = model.work(infer, {1, 1, 1, false, 16, 1}, w);
  const double inside = ideal(in8, OpClass::alltoall_intra);
  const double across = ideal(across16, OpClass::alltoall_inter);
  CHECK(inside > 0);
  CHECK(ideal(in8, OpClass::alltoall_inter) == 0);
  CHECK(ideal(across16, OpClass::alltoall_intra) == 0);
  CHECK(across > 2 * inside);
  CHECK(ideal(in8, OpClass::latency_intra) > 0);
  CHECK(ideal(across16, OpClass::latency_inter) > 0);
  // The ep attention replicas pipeline their own sequences side by side: an ep=2 stage's
  // hops are those of one replica with half the sequences, not of all of them in a row.
  Workload half = w;
  half.sequences = w.sequences / 2;
  for (const ModelStage& s : {infer, train})
    CHECK(ideal(model.work(s, {1, 2, 1, false, 2, 1}, w), OpClass::p2p_intra) ==
          doctest::Approx(ideal(model.work(s, {1, 2, 1}, half), OpClass::p2p_intra)));
  // Training: 16 bytes a parameter, experts over tp·ep GPUs.
  CHECK(model.memory(train, {1, 4, 1, false, 8, 1}, w).resident < model.memory(train, {1, 4, 1}, w).resident / 4);
  // On 32 H200s the planner spreads the experts of some model-stage over an ep group.
  const PlanChoice plan = plan_job(model, job, 32, w);
  REQUIRE(plan.feasible);
  CHECK(std::any_of(plan.stages.begin(), plan.stages.end(), [](const PlannedStage& s) { return s.candidate.ep > 1; }));
  // A dense model has no expert or all-to-all work.
  const JobSpec dense = load_job("ppo-llama-3.1-8b");
  const StageOps d = model.work(model_stages(dense)[1], {2, 1, 4}, Workload::of(dense, 500, 600));
  CHECK(ideal(d, OpClass::expert) == 0);
  CHECK(ideal(d, OpClass::alltoall_intra) + ideal(d, OpClass::alltoall_inter) == 0);
}

TEST_CASE("cost model: decode kernels replay from a graph, collectives' latencies are not launches") {
  // Kernel launches (eager), decode kernels replayed from a CUDA graph and a collective's
  // fixed per-step latency cost differently on a real cluster, so each has its class.
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const CostModel model(load_cluster("paper-cluster-2-a100"));
  const auto stages = model_stages(job);
  const Workload w = Workload::of(job, 500, 600);
  const auto ideal = [](const StageOps& o, OpClass c) { return o.ideal[static_cast<std::size_t>(c)]; };
  for (const ModelStage& s : stages) {
    const StageOps one = model.work(s, {1, 1, 1}, w);     // no collective, no hop
    const StageOps tp4 = model.work(s, {4, 1, 1}, w);     // TP all-reduces inside a node
    const StageOps tp16 = model.work(s, {16, 1, 1}, w);   // and across nodes
    CHECK(ideal(one, OpClass::latency_intra) + ideal(one, OpClass::latency_inter) == 0);
    CHECK(ideal(tp4, OpClass::latency_intra) > 0);
    CHECK(ideal(tp16, OpClass::latency_inter) > 0);
    // Launches do not depend on where the collectives run.
    CHECK(ideal(tp4, OpClass::launch) == doctest::Approx(ideal(tp16, OpClass::launch)));
    CHECK(ideal(tp4, OpClass::graph_launch) == doctest::Approx(ideal(tp16, OpClass::graph_launch)));
    if (s.kind == StageKind::generate) {
      // Decoding: a graph replay per iteration, 12 kernels a layer; prefill launches eagerly.
      CHECK(ideal(one, OpClass::graph_launch) > 10 * ideal(one, OpClass::launch));
    } else {
      CHECK(ideal(one, OpClass::graph_launch) == 0);
      CHECK(ideal(one, OpClass::launch) > 0);
    }
  }
}

TEST_CASE("cost model: decode GEMMs of few tiles leave compute units idle when the cluster names them") {
  // Thin per-GPU slices (high TP, a short running batch) fill few of a GPU's units: with
  // the units known, their FLOPs count as the GPU spends them; unknown, at the full rate.
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ModelStage gen = model_stages(job)[0];
  REQUIRE(gen.kind == StageKind::generate);
  ClusterSpec plain = load_cluster("paper-cluster-1-mi250x");
  REQUIRE(plain.gpu_compute_units == 110);  // an MI250X die's, from its data sheet
  ClusterSpec unknown = plain;
  unknown.gpu_compute_units = 0;
  unknown.hbm_gbps = plain.hbm_gbps * 100;  // make decoding compute-bound, so FLOPs show
  plain.hbm_gbps = unknown.hbm_gbps;
  const CostModel with(plain), without(unknown);
  const Workload w = Workload::of(job, 1000, 1200);
  auto decode = [&](const CostModel& m, Candidate c) { return m.work(gen, c, w).ideal[static_cast<std::size_t>(OpClass::decode)]; };
  // TP 8 splits every GEMM eight ways: far fewer tiles than units, so the GPU does the
  // work of about as many tiles as it has units.
  const double tp8 = decode(with, {8, 1, 1}) / decode(without, {8, 1, 1});
  const double tp1 = decode(with, {1, 1, 1}) / decode(without, {1, 1, 1});
  CHECK(tp1 >= 1.0);
  CHECK(tp1 < 1.5);
  CHECK(tp8 > 2.0);  // 2.5 here: attention FLOPs are not GEMM tiles
  // Never faster than the FLOPs at the full rate.
  for (int tp : {1, 2, 4, 8}) CHECK(decode(with, {tp, 1, 1}) >= decode(without, {tp, 1, 1}));
}

TEST_CASE("cost model: an expert's GEMM with few rows pays for its padded tile") {
  // Qwen3-30B-A3B: 128 experts, 8 a token. A sequence of 1,124 tokens gives an expert
  // about 70 rows, padded to two tiles of 64 (1.82x); one of 8,192 gives it 512, exactly
  // eight tiles. Per token, the short sequence's expert work costs 1.82x more.
  const JobSpec job = parse_job(R"({"algorithm":"grpo","models":{"actor":"qwen3-30b-a3b","reference":"qwen3-30b-a3b","reward":"rule"},
      "prompts_per_step":64,"samples_per_prompt":8,"prompt_len":1024,"max_response_len":8192})", "moe-job");
  const CostModel model(load_cluster("paper-cluster-3-h200"));
  ModelStage infer = model_stages(job)[0];
  for (const ModelStage& s : model_stages(job))
    if (s.kind == StageKind::infer) infer = s;
  REQUIRE(infer.kind == StageKind::infer);
  auto per_token = [&](double response) {
    const Workload w = Workload::of(job, response, response);
    const double tokens = static_cast<double>(w.sequences) * (w.prompt_len + response);
    return model.work(infer, {1, 1, 1}, w).ideal[static_cast<std::size_t>(OpClass::expert)] / tokens;
  };
  CHECK(per_token(100) / per_token(8192 - 1024) == doctest::Approx(128.0 / (1124.0 * 8 / 128)).epsilon(0.01));
  // A dense model's work has no expert class to pad.
  const JobSpec dense = load_job("ppo-llama-3.1-8b");
  CHECK(model.work(model_stages(dense)[1], {1, 1, 1}, Workload::of(dense, 100, 100)).ideal[static_cast<std::size_t>(OpClass::expert)] == 0);
}


TEST_CASE("cost model and planner: FSDP shares training state over its GPUs and pays for its gathers") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const CostModel model(load_cluster("paper-cluster-3-h200"));
  const auto stages = model_stages(job);
  const ModelStage& train = stages[5];
  REQUIRE(train.kind == StageKind::train);
  const Workload w = Workload::of(job, 500, 600);
  const Candidate whole{1, 1, 1}, dp8{1, 1, 8}, fsdp8{1, 1, 1, false, 1, 0, 8};
  // Training state (16 bytes a parameter) in eighths; a layer or two gathered at a time.
  CHECK(model.memory(train, fsdp8, w).resident == doctest::Approx(model.memory(train, whole, w).resident / 8.0).epsilon(0.01));
  CHECK(model.memory(train, fsdp8, w).transient > model.memory(train, whole, w).transient);
  CHECK(model.memory(train, dp8, w).resident > 7 * model.memory(train, fsdp8, w).resident);
  // The same FLOPs a GPU as eight DP replicas; gathering parameters twice and
  // reduce-scattering gradients moves 1.5 times DP's all-reduce, while Adam updates an
  // eighth of the state.
  auto ideal = [&](const Candidate& c, OpClass k) { return model.work(train, c, w).ideal[static_cast<std::size_t>(k)]; };
  CHECK(ideal(fsdp8, OpClass::gemm) == doctest::Approx(ideal(dp8, OpClass::gemm)));
  CHECK(ideal(fsdp8, OpClass::allreduce_intra) == doctest::Approx(1.5 * ideal(dp8, OpClass::allreduce_intra)));
  CHECK(ideal(fsdp8, OpClass::decode) == doctest::Approx(ideal(dp8, OpClass::decode) / 8));
  CHECK(model.seconds(train, fsdp8, w) < model.seconds(train, whole, w));
  // The planner weighs FSDP only when asked (a job that uses it), for training stages of
  // dense models; asked, it never plans slower, and its plans fit by the estimate.
  PlannerOptions with;
  with.fsdp = true;
  auto uses_fsdp = [](const PlanChoice& c) {
    for (const auto& [name, spec] : c.plan.stages)
      if (spec.layout.fsdp > 1) return true;
    return false;
  };
  for (int gpus : {8, 16, 32}) {
    const PlanChoice off = plan_job(model, job, gpus, w), on = plan_job(model, job, gpus, w, with);
    CAPTURE(gpus);
    REQUIRE(off.feasible);
    REQUIRE(on.feasible);
    CHECK_FALSE(uses_fsdp(off));
    CHECK(on.step_seconds <= off.step_seconds * (1 + 1e-9));
    CHECK(estimate_plan(model, job, on.plan, w).fits);
    for (const auto& [name, spec] : on.plan.stages)
      if (spec.layout.fsdp > 1) CHECK(name.ends_with("/train"));
  }
  bool fsdp_candidates = false, elsewhere = false;
  for (const ModelStage& s : stages)
    for (const Candidate& c : stage_candidates(s, 16, model.cluster(), 64, with)) {
      fsdp_candidates = fsdp_candidates || c.fsdp > 1;
      elsewhere = elsewhere || (c.fsdp > 1 && s.kind != StageKind::train);
    }
  CHECK(fsdp_candidates);
  CHECK_FALSE(elsewhere);
  // The planner's optimum with FSDP equals an exhaustive search on small jobs (GRPO: two
  // fewer stages, so the exhaustive product of candidates stays small).
  JobSpec tiny = testcase::tiny_ppo_job();
  tiny.algorithm = Algorithm::grpo;
  tiny.models.erase(tiny.models.begin() + 1);  // no critic
  std::mt19937_64 rng(11);
  int chosen = 0;
  for (int k = 0; k < 80; ++k) {
    const int gpus = std::uniform_int_distribution<int>(2, 4)(rng);
    const CostModel small(small_cluster(std::uniform_real_distribution<double>(0.003, 0.02)(rng), 4));
    const Workload tw = Workload::of(tiny, 64, 80);
    const PlanChoice fast = plan_job(small, tiny, gpus, tw, with), all = plan_job_exhaustive(small, tiny, gpus, tw, with);
    CAPTURE(k);
    REQUIRE(fast.feasible == all.feasible);
    if (fast.feasible) CHECK(fast.step_seconds == doctest::Approx(all.step_seconds).epsilon(1e-9));
    chosen += fast.feasible && uses_fsdp(fast);
  }
  MESSAGE(chosen << " of 80 small plans train with FSDP");
  CHECK(chosen > 0);
}
