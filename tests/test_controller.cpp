// The controller's mechanisms one by one (triggers, references, H_x, the urgent path,
// retries), the simulator's accounting of failed steps and transitions, and the ground
// truth: its realism where it matters to the controller, and its independence from the
// cost model it grades.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "nereus/control/controller.hpp"
#include "nereus/control/planner.hpp"
#include "nereus/core/presets.hpp"
#include "nereus/sim/simulator.hpp"
#include "nereus/sim/truth.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;

namespace {

std::string plan_text(const GlobalPlan& p) {
  std::string s;
  for (const auto& [name, spec] : p.stages) s += name + ":" + to_string(spec) + " ";
  return s;
}

bool uses_only(const GlobalPlan& p, int gpus) {
  for (const auto& [name, spec] : p.stages)
    for (DeviceId d : spec.devices)
      if (d < 0 || d >= gpus) return false;
  return true;
}

}  // namespace

TEST_CASE("controller: drift triggers a replan, references reset even when it is rejected, no trigger without drift") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  Controller ctl(job, load_cluster("paper-cluster-2-a100"));
  const GlobalPlan plan = ctl.initial({0, 32, 1000, 1160, 1});
  CHECK(uses_only(plan, 32));
  CHECK(ctl.decide({1, 32, 1100, 1276, 1}, plan).trigger.empty());  // 10% < δ = 30%
  const Decision d = ctl.decide({2, 32, 1500, 1740, 1}, plan);
  CHECK(has(d.trigger, "length"));
  CHECK(d.replanned);
  CHECK_FALSE(d.urgent);
  // The reference is now 1500 whatever was decided: the same length does not trigger again
  // (a retry may follow an admitted compromise, nothing else).
  const Decision again = ctl.decide({3, 32, 1500, 1740, 1}, d.admitted ? d.target : plan);
  CHECK((again.trigger.empty() || again.trigger == "retry"));
  CHECK(has(ctl.decide({4, 32, 1500, 1740, 1.5}, d.admitted ? d.target : plan).trigger, "link"));
}

TEST_CASE("controller: H_x is the moving average of steps between crossings of the triggering signal") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  ControllerOptions o;
  o.ema = 0.5;
  Controller ctl(job, load_cluster("paper-cluster-2-a100"), o);
  GlobalPlan plan = ctl.initial({0, 32, 1000, 1160, 1});
  // Lengths alternate beyond δ at steps 10, 20 and 40: H = 1 (no interval yet), then the
  // first interval 10, then 0.5·10 + 0.5·20 = 15.
  const std::vector<std::pair<long, double>> crossings = {{10, 2000}, {20, 1000}, {40, 2000}};
  const std::vector<double> want = {1, 10, 15};
  for (std::size_t i = 0; i < crossings.size(); ++i) {
    const auto [step, len] = crossings[i];
    const Decision d = ctl.decide({step, 32, len, len * 1.16, 1}, plan);
    REQUIRE(has(d.trigger, "length"));
    CHECK(d.horizon_steps == doctest::Approx(want[i]));
    if (d.admitted) plan = d.target;
    // Quiet steps in between (a retry may run once; it keeps H).
    ctl.decide({step + 1, 32, len, len * 1.16, 1}, plan);
  }
}

TEST_CASE("controller: a pool that loses the plan's GPUs is urgent and the target stays inside the pool") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  for (const char* policy : {"nereus", "static", "static-max", "greedy"}) {
    ControllerOptions o;
    o.policy = parse_policy(policy, o.every);
    Controller ctl(job, load_cluster("paper-cluster-2-a100"), o);
    const GlobalPlan plan = ctl.initial({0, 32, 1000, 1160, 1});
    const Decision d = ctl.decide({1, 16, 1000, 1160, 1}, plan);
    CAPTURE(policy);
    CHECK(has(d.trigger, "pool"));
    CHECK(d.urgent);
    REQUIRE(d.admitted);
    CHECK(uses_only(d.target, 16));
  }
}

TEST_CASE("controller: when no plan fits the GPUs left, the current layouts go onto them with fewer replicas") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  Controller ctl(job, load_cluster("paper-cluster-2-a100"));
  const GlobalPlan plan = ctl.initial({0, 32, 1000, 1160, 1});
  const Decision d = ctl.decide({1, 4, 1000, 1160, 1}, plan);
  CHECK(d.urgent);
  CHECK(has(d.why, "no plan fits"));
  CHECK(has(d.why, "fallback"));
  REQUIRE(d.admitted);
  CHECK(uses_only(d.target, 4));
  for (const auto& [name, spec] : d.target.stages) {
    CHECK(spec.layout.tp == plan.find(name)->layout.tp);
    CHECK(spec.layout.pp == plan.find(name)->layout.pp);
  }
}

TEST_CASE("controller: when S* does not pay back, a cheaper candidate that does is admitted") {
  // cluster-3, 8 -> 16 GPUs and responses 256 -> 2,048 tokens: S* is a little faster than
  // the current layouts with DP scaled to the pool, but its transition costs far more.
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  Controller ctl(job, load_cluster("paper-cluster-3-h200"));
  const GlobalPlan plan = ctl.initial({0, 8, 256, 256, 1});
  const Signals next{1, 16, 2048, 2048, 1};
  const Decision d = ctl.decide(next, plan);
  const PlanChoice best = plan_job(ctl.model(), job, 16, ctl.workload(next), {});
  REQUIRE(best.feasible);
  const TransitionGraph to_best = ctl.transition(plan, best.plan, next);
  const double gain = d.current_seconds - best.step_seconds, gamma = ControllerOptions{}.gamma;
  CHECK(to_best.feasibility.ok);
  CHECK(gain > 0);
  CHECK(to_best.summary.l_tran_seconds / gain > gamma * d.horizon_steps);  // S* alone would be rejected
  REQUIRE(d.admitted);
  CHECK(plan_text(d.target) != plan_text(best.plan));
  CHECK(plan_text(d.target) == plan_text(ctl.rescale(plan, 16)));
  CHECK(d.transition_seconds < to_best.summary.l_tran_seconds);
  CHECK(d.transition_seconds / (d.current_seconds - d.target_seconds) <= gamma * d.horizon_steps);
  CHECK(has(d.why, "pays back"));
}

TEST_CASE("controller: beside the steps, admission charges what the next step waits for, not all of L_tran") {
  // The same change as above (cluster-3, 8 -> 16 GPUs, responses 256 -> 2,048 tokens).
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-3-h200");
  ControllerOptions o;
  o.beside_steps = true;
  Controller ctl(job, cluster, o);
  const GlobalPlan plan = ctl.initial({0, 8, 256, 256, 1});
  const Signals next{1, 16, 2048, 2048, 1};
  const Workload w = ctl.workload(next);
  // No transition, no wait.
  CHECK(ctl.exposed_seconds(plan, plan, ctl.transition(plan, plan, next), w) == 0);
  const PlanChoice best = plan_job(ctl.model(), job, 16, w, {});
  REQUIRE(best.feasible);
  const TransitionGraph g = ctl.transition(plan, best.plan, next);
  const double wait = ctl.exposed_seconds(plan, best.plan, g, w);
  // Beside the steps the copies cannot be hidden more than entirely, nor wait longer than
  // they run at the shared links' slowdown.
  CHECK(wait >= 0);
  CHECK(wait <= o.shared_link_slowdown * g.summary.l_tran_seconds + 1e-9);
  // Units of a role that trains move only after its optimizer step, and the actor's
  // generation is the next step's first stage: what it waits for cannot be hidden.
  CHECK(wait > 0);
  const Decision d = ctl.decide(next, plan);
  REQUIRE(d.admitted);
  CHECK(d.transition_seconds == doctest::Approx(ctl.transition(plan, d.target, next).summary.l_tran_seconds));
  CHECK(d.charged_seconds == doctest::Approx(ctl.exposed_seconds(plan, d.target, ctl.transition(plan, d.target, next), w)));
  CHECK(d.charged_seconds / (d.current_seconds - d.target_seconds) <= o.gamma * d.horizon_steps);
  CHECK(has(d.why, "charged"));
  // Between steps (the default), all of L_tran is charged.
  Controller between(job, cluster);
  const Decision b = between.decide(next, between.initial({0, 8, 256, 256, 1}));
  CHECK(b.charged_seconds == doctest::Approx(b.transition_seconds));
}

TEST_CASE("simulator: on flapping links, payback beats greedy at step boundaries and is no worse beside the steps") {
  // Inter-node links 4x slower every other 3 steps (scripts/make_link_flap_trace.py): a
  // greedy controller follows every flap.
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE(source);
  auto trace = load_trace(std::string(source) + "/examples/traces/link-flap-32gpu.jsonl");
  trace.resize(std::min<std::size_t>(trace.size(), 60));
  auto run = [&](const char* policy, bool overlap) {
    SimulationOptions o;
    o.overlap = overlap;
    o.controller.policy = parse_policy(policy, o.controller.every);
    return simulate(cluster, job, trace, o);
  };
  const SimulationResult nereus_b = run("nereus", false), greedy_b = run("greedy", false);
  CHECK(greedy_b.transitions > nereus_b.transitions);
  CHECK(nereus_b.mean_step_seconds < greedy_b.mean_step_seconds);
  const SimulationResult nereus_o = run("nereus", true), greedy_o = run("greedy", true);
  CHECK(nereus_o.mean_step_seconds <= greedy_o.mean_step_seconds * 1.001);
}

TEST_CASE("controller: a layout at a response length a factor 2 apart is a calibration point of its own") {
  // Each configuration weighs as one measurement, the mean of its own. A plan that ran many
  // steps at one length and a few at four times it must not have the long ones averaged
  // away: ten measurements at L and one at 4L calibrate as one of each. (Were the length
  // not part of the point, the ten would outweigh the one.)
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  const ModelStage stage = model_stages(job).front();
  const Candidate c = candidate_of(*Controller(job, cluster).initial({0, 32, 1000, 1160, 1}).find(stage.name()));
  Controller many(job, cluster), once(job, cluster);
  const Workload short_w = many.workload({0, 32, 1000, 1160, 1}), long_w = many.workload({0, 32, 4000, 4640, 1});
  for (int i = 0; i < 10; ++i) many.measure(stage, c, short_w, 30.0);
  many.measure(stage, c, long_w, 200.0);
  once.measure(stage, c, short_w, 30.0);
  once.measure(stage, c, long_w, 200.0);
  const auto a = many.model().efficiency(), b = once.model().efficiency();
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(a[k] == doctest::Approx(b[k]));
}

TEST_CASE("controller: memory is planned for the longest p95 of the recent steps") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  ControllerOptions o;
  o.memory_window = 3;
  Controller ctl(job, load_cluster("paper-cluster-2-a100"), o);
  GlobalPlan plan = ctl.initial({0, 32, 1000, 4000, 1});
  const Signals quiet{1, 32, 1000, 1160, 1};
  CHECK(ctl.workload(quiet).response_len_p95 == doctest::Approx(4000));
  CHECK(ctl.workload(quiet).response_len_mean == doctest::Approx(1000));  // time uses the mean
  for (long k = 1; k <= 3; ++k) ctl.decide({k, 32, 1000, 1160, 1}, plan);
  CHECK(ctl.workload(quiet).response_len_p95 == doctest::Approx(1160));  // 4000 left the window
}

TEST_CASE("controller: static keeps the first step's TP/PP; static-max plans for max_response_len") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  ControllerOptions a, b;
  a.policy = parse_policy("static", a.every);
  b.policy = parse_policy("static-max", b.every);
  Controller fixed(job, load_cluster("paper-cluster-2-a100"), a), worst(job, load_cluster("paper-cluster-2-a100"), b);
  const Signals first{0, 32, 500, 580, 1};
  const GlobalPlan p = fixed.initial(first), q = worst.initial(first);
  Controller nereus(job, load_cluster("paper-cluster-2-a100"));
  CHECK(plan_text(p) == plan_text(nereus.initial(first)));  // the planner's plan for the first step
  CHECK(plan_text(p) != plan_text(q));                       // not the one for 8,192-token responses
  // Responses grow 8x: static does not replan; on a pool change it keeps every TP and PP.
  CHECK_FALSE(fixed.decide({1, 32, 4000, 4640, 1}, p).replanned);
  const Decision grow = fixed.decide({2, 64, 4000, 4640, 1}, p);
  REQUIRE(grow.admitted);
  for (const auto& [name, spec] : grow.target.stages) {
    CHECK(spec.layout.tp == p.find(name)->layout.tp);
    CHECK(spec.layout.pp == p.find(name)->layout.pp);
  }
  // A kept unit larger than the pool cannot stay whole: static plans again for the first
  // step's signals on the GPUs present, never leaving a unit outside the pool.
  std::vector<PlannedStage> big;
  for (const auto& [name, spec] : p.stages)
    big.push_back({name, {spec.layout.tp, spec.layout.pp, spec.dp, false, spec.layout.ep, spec.layout.etp}, 0, {}});
  for (PlannedStage& s : big)
    if (s.model_stage == "actor/train") s.candidate = {8, 4, 1};  // 32 GPUs a unit
  const GlobalPlan wide = place(job, big);
  Controller kept(job, load_cluster("paper-cluster-2-a100"), a);
  REQUIRE(plan_text(kept.initial(first)) == plan_text(p));
  const Decision shrink = kept.decide({1, 16, 4000, 4640, 1}, wide);
  REQUIRE(shrink.admitted);
  CHECK(has(shrink.why, "larger than the pool of 16"));
  CHECK(uses_only(shrink.target, 16));
  Controller again(job, load_cluster("paper-cluster-2-a100"));
  CHECK(plan_text(shrink.target) == plan_text(again.initial({0, 16, 500, 580, 1})));  // sized for the first step, not 4,000 tokens
  CHECK(has(error_of([] {
          int k = 0;
          parse_policy("static-min", k);
        }),
        "static, static-max, every:K, greedy, nereus"));
}

TEST_CASE("simulator: failed steps cost time, never calibrate, and every second is accounted for") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(source, "NEREUS_SOURCE names the source tree");
  const auto trace = load_trace(std::string(source) + "/examples/traces/spot-16-64gpu.jsonl");
  SimulationOptions o;
  o.controller.policy = parse_policy("static", o.controller.every);
  const SimulationResult fixed = simulate(cluster, job, trace, o);
  o.controller.policy = Policy::nereus;
  const SimulationResult adaptive = simulate(cluster, job, trace, o);
  for (const SimulationResult* r : {&fixed, &adaptive}) {
    double sum = 0, exposed = 0, lost = 0;
    int failed = 0, oom = 0;
    for (const StepRecord& s : r->records) {
      sum += s.seconds;
      exposed += s.exposed_seconds;
      lost += s.failure_seconds;
      failed += s.failed;
      oom += s.oom;
      CHECK(s.exposed_seconds <= s.transition_seconds + 1e-9);  // a step waits at most for its whole transition
      CHECK(s.exposed_seconds >= 0);
      if (s.failed) {
        CHECK(s.predicted_seconds == 0);        // a failed step never calibrates
        CHECK(s.failure_seconds >= 60);         // a restart at least
        CHECK(s.seconds >= s.failure_seconds);  // and the step again on a plan that fits
        CHECK_FALSE(s.failure.empty());
      }
    }
    CHECK(r->total_seconds == doctest::Approx(sum));
    CHECK(r->mean_step_seconds == doctest::Approx(sum / double(r->steps)));
    CHECK(r->mean_compute_seconds <= r->mean_step_seconds + 1e-9);
    CHECK(r->exposed_transition_seconds == doctest::Approx(exposed));
    CHECK(r->failure_seconds == doctest::Approx(lost));
    CHECK(r->failed_steps == failed);
    CHECK(r->oom_steps == oom);
    // The urgent path: a step that cannot run on the current plan gets a switch or a
    // blocked decision, never "stay".
    for (const Decision& d : r->decisions) CHECK((!d.urgent || d.admitted || d.blocked));
  }
  // The cost model's memory is calibrated, not exact: on this trace a step runs out of
  // memory, so the failure path above was taken.
  CHECK(fixed.failed_steps + adaptive.failed_steps >= 1);
}

TEST_CASE("simulator: at step boundaries every transition is exposed; beside the steps at most all of it") {
  const JobSpec job = load_job("ppo-llama-3.1-8b");
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(source, "NEREUS_SOURCE names the source tree");
  auto trace = load_trace(std::string(source) + "/examples/traces/spot-16-64gpu.jsonl");
  trace.resize(120);
  SimulationOptions o;
  o.overlap = false;
  const SimulationResult boundary = simulate(load_cluster("paper-cluster-2-a100"), job, trace, o);
  REQUIRE(boundary.transitions > 0);
  CHECK(boundary.exposed_transition_seconds == doctest::Approx(boundary.transition_seconds));
  o.overlap = true;
  const SimulationResult beside = simulate(load_cluster("paper-cluster-2-a100"), job, trace, o);
  REQUIRE(beside.transitions > 0);
  CHECK(beside.exposed_transition_seconds < beside.transition_seconds);
}

TEST_CASE("ground truth: generation slows down rather than fails when the KV cache is short; training does fail") {
  const ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  GroundTruth truth(cluster, 1, 0);
  const ModelConfig m = load_model("llama-3.1-8b")->config();
  TruthLoad w{1024, 512, 1000, 1160, 8192, 1};
  const TruthLayout tp1{1, 1, 4, false}, tp2{2, 1, 2, false};
  const std::uint64_t pool = 24ull << 30;
  const std::int64_t c1 = truth.concurrency(m, tp1, w, pool);
  CHECK(c1 > 0);
  CHECK(c1 < 256);  // memory, not the engine's limit, binds
  CHECK(truth.concurrency(m, tp2, w, pool) > c1);  // half the KV heads per GPU
  TruthLoad longer = w;
  longer.response_mean = 4000, longer.response_p95 = 4640;
  CHECK(truth.concurrency(m, tp1, longer, pool) < c1);
  const double short_pool = truth.expected_seconds(m, StageKind::generate, tp1, w, 8ull << 30);
  const double long_pool = truth.expected_seconds(m, StageKind::generate, tp1, w, pool);
  CHECK(std::isfinite(short_pool));
  CHECK(short_pool > long_pool);
  CHECK(truth.concurrency(m, tp1, w, 1ull << 20) == 0);  // not one response fits: fails
  // Training: recomputation trades time for activation memory (Korthikanti et al.).
  const TruthLayout full{1, 4, 4, false}, re{1, 4, 4, true};
  CHECK(truth.memory(m, StageKind::train, re, longer).working < truth.memory(m, StageKind::train, full, longer).working);
  CHECK(truth.expected_seconds(m, StageKind::train, re, longer, 0) > truth.expected_seconds(m, StageKind::train, full, longer, 0));
  // The longest of 1,024 lognormal responses lies beyond their p95.
  CHECK(expected_max_length(1000, 1160, 1024) > 1160);
  CHECK(expected_max_length(1000, 1000, 1024) == doctest::Approx(1000));
}

namespace {
/// The nereus headers `file` includes, directly or not, each checked against `forbidden`
/// prefixes; none of them but plan/'s (what moves, which names its estimates) may name the
/// cost model or its estimates.
std::set<std::string> includes_of(const std::string& src, const std::string& file, const std::vector<std::string>& forbidden) {
  const std::regex include(R"re(#include\s+"(nereus/[^"]+)")re");
  std::set<std::string> seen;
  std::vector<std::string> pending = {src + file};
  while (!pending.empty()) {
    const std::string path = pending.back();
    pending.pop_back();
    std::ifstream in(path);
    REQUIRE_MESSAGE(in, path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string body = text.str();
    if (path.find("/include/nereus/plan/") == std::string::npos)
      for (const char* name : {"CostModel", "estimate_plan", "Controller", "beside_steps", "l_tran_seconds", "critical_path_seconds"})
        CHECK_MESSAGE(body.find(name) == std::string::npos, (path + " names " + name));
    for (std::sregex_iterator it(body.begin(), body.end(), include), end; it != end; ++it) {
      const std::string header = (*it)[1];
      for (const std::string& prefix : forbidden) CHECK_MESSAGE(header.rfind(prefix, 0) != 0, (path + " includes " + header));
      if (seen.insert(header).second) pending.push_back(src + "/include/" + header);
    }
  }
  return seen;
}
}  // namespace

TEST_CASE("ground truth of transitions: what moves from plan/, nothing of control/, not the graph's estimated times") {
  const char* root = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(root, "NEREUS_SOURCE names the source tree");
  const std::set<std::string> seen = includes_of(root, "/src/sim/truth_transition.cpp", {"nereus/control/"});
  CHECK(seen.count("nereus/plan/transition_graph.hpp") == 1);
  std::ifstream in(std::string(root) + "/src/sim/truth_transition.cpp");
  std::stringstream text;
  text << in.rdbuf();
  const std::string body = text.str();
  CHECK(body.find(".seconds") == std::string::npos);  // GraphNode::seconds: the cost model's estimate
  CHECK(body.find("node.start") == std::string::npos);
}

TEST_CASE("ground truth: written apart from the cost model (no include of control/ or plan/, directly or not)") {
  const char* root = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(root, "NEREUS_SOURCE names the source tree");
  const std::set<std::string> seen = includes_of(root, "/src/sim/truth.cpp", {"nereus/control/", "nereus/plan/"});
  CHECK(seen.count("nereus/sim/truth.hpp") == 1);
}

TEST_CASE("ground truth: mixture of experts — expert parallelism, grouped GEMMs, an all-to-all that crosses nodes") {
  const ClusterSpec cluster = load_cluster("paper-cluster-3-h200");
  GroundTruth truth(cluster, 1, 0);
  const ModelConfig m = load_model("qwen3-30b-a3b")->config();
  const TruthLoad w{512, 1024, 2000, 2400, 8192, 1};
  const TruthLayout whole{1, 1, 1, false}, ep8{1, 1, 1, false, 8, 1}, ep16{1, 1, 1, false, 16, 1};
  // Every expert on the GPU: 30.5 B bf16 parameters; over 8 groups about an eighth of the experts.
  CHECK(double(truth.memory(m, StageKind::infer, whole, w).resident) == doctest::Approx(61e9).epsilon(0.02));
  CHECK(truth.memory(m, StageKind::infer, ep8, w).resident < truth.memory(m, StageKind::infer, whole, w).resident / 5);
  // Eight attention replicas share the sequences; 16 ep ranks leave the node and the
  // all-to-all over cluster-3's one NIC a node dominates.
  const double t1 = truth.expected_seconds(m, StageKind::infer, whole, w, 0);
  const double t8 = truth.expected_seconds(m, StageKind::infer, ep8, w, 0);
  const double t16 = truth.expected_seconds(m, StageKind::infer, ep16, w, 0);
  CHECK(t8 < t1);
  CHECK(t16 > t8);
  // A dense model reads no expert fields: an expert TP degree (here 1, not tp) changes
  // none of its figures.
  const ModelConfig dense = load_model("qwen3-8b")->config();
  const TruthLayout plain{2, 1, 1, false}, with_etp{2, 1, 1, false, 1, 1};
  CHECK(truth.expected_seconds(dense, StageKind::infer, with_etp, w, 0) == truth.expected_seconds(dense, StageKind::infer, plain, w, 0));
  CHECK(truth.memory(dense, StageKind::train, with_etp, w).resident == truth.memory(dense, StageKind::train, plain, w).resident);
}

TEST_CASE("simulator: an MoE job replays a trace with expert-parallel plans") {
  const JobSpec job = parse_job(R"({"algorithm":"grpo","models":{"actor":"qwen3-30b-a3b","reference":"qwen3-30b-a3b","reward":"rule"},
      "prompts_per_step":128,"samples_per_prompt":8,"prompt_len":1024,"max_response_len":8192})", "moe-job");
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(source, "NEREUS_SOURCE names the source tree");
  auto trace = load_trace(std::string(source) + "/examples/traces/length-growth-64gpu.jsonl");
  trace.resize(200);
  const SimulationResult r = simulate(load_cluster("paper-cluster-3-h200"), job, trace, SimulationOptions{});
  CHECK(r.failed_steps == 0);
  CHECK(r.mean_step_seconds > 0);
  CHECK(std::any_of(r.records.begin(), r.records.end(), [](const StepRecord& s) { return s.plan.find('e') != std::string::npos; }));
}

TEST_CASE("simulator: a ReMax job (actor, reference, reward; no critic, no old log-probs) replays a trace") {
  const JobSpec job = parse_job(R"({"algorithm":"remax","models":{"actor":"llama-3.1-8b","reference":"llama-3.1-8b",
      "reward":"llama-3.1-8b-score"},"prompts_per_step":256,"samples_per_prompt":1,"prompt_len":512,"max_response_len":8192})",
                                "remax-job");
  std::vector<std::string> stages;
  for (const ModelStage& s : model_stages(job)) stages.push_back(s.name());
  CHECK(stages == std::vector<std::string>{"actor/generate", "reference/infer", "reward/infer", "actor/train"});
  const char* source = std::getenv("NEREUS_SOURCE");
  REQUIRE_MESSAGE(source, "NEREUS_SOURCE names the source tree");
  auto trace = load_trace(std::string(source) + "/examples/traces/spot-16-64gpu.jsonl");
  trace.resize(120);
  const SimulationResult r = simulate(load_cluster("paper-cluster-2-a100"), job, trace, SimulationOptions{});
  CHECK(r.steps == 120);
  CHECK(r.mean_step_seconds > 0);
  CHECK(r.transitions >= 1);  // spot GPUs come and go: the plan follows the pool
  for (const StepRecord& s : r.records) {  // short form: "ag=T/P/D ri=... ri=... at=..."
    CHECK(std::count(s.plan.begin(), s.plan.end(), '=') == 4);
    CHECK(s.plan.rfind("ag=", 0) == 0);
    CHECK_FALSE(has(s.plan, "ci="));
    CHECK_FALSE(has(s.plan, "ai="));
  }
}

TEST_CASE("controller: every plan it proposes holds each model-stage as the job does (FP8, fused packing)") {
  // A GRPO job on tiny-deepseek-v3 (16×16 FP8 blocks; TP 4 cuts its shared experts' 32
  // rows inside a block): generation held in FP8, training in fused packing.
  const JobSpec job = parse_job(R"({"algorithm": "grpo", "prompts_per_step": 16, "samples_per_prompt": 2,
    "prompt_len": 64, "max_response_len": 256,
    "models": {"actor": "tiny-deepseek-v3", "reference": "tiny-deepseek-v3", "reward": "rule"}})", "test");
  auto held_as_job = [&](const GlobalPlan& p) {
    CAPTURE(plan_text(p));
    CHECK(p.find("actor/generate")->layout.fp8);
    CHECK(p.find("actor/train")->layout.packing == Packing::fused);
    CHECK_FALSE(p.find("actor/infer")->layout.fp8);
    // Every FP8 split, and the training stage's that syncs into it, on block boundaries.
    CHECK_NOTHROW(plan_collections(job, p));
  };
  ControllerOptions o;
  o.planner.representation = {{"actor/generate", {Packing::hf, true}}, {"actor/train", {Packing::fused, false}}};
  Controller ctl(job, load_cluster("paper-cluster-3-h200"), o);
  const GlobalPlan plan = ctl.initial({0, 8, 64, 80, 1});
  held_as_job(plan);
  // A controller told nothing takes the representation from the plan it is on, through a
  // length drift, a lost GPU (urgent) and the fallback's rescale.
  Controller fresh(job, load_cluster("paper-cluster-3-h200"));
  GlobalPlan on = plan;
  int admitted = 0;
  for (const Signals& s : {Signals{1, 8, 200, 240, 1}, Signals{2, 4, 200, 240, 1}, Signals{3, 1, 200, 240, 1}}) {
    const Decision d = fresh.decide(s, on);
    CAPTURE(s.step);
    CAPTURE(d.why);
    if (!d.admitted) continue;
    ++admitted;
    held_as_job(d.target);
    on = d.target;
  }
  CHECK(admitted >= 2);
}

namespace {
/// Two nodes of four GPUs, the ppo-tiny job, and every stage on a GPU of its own.
struct TinyMove {
  ClusterSpec cluster = load_cluster("paper-cluster-2-a100");
  JobSpec job = load_job("ppo-tiny");
  TinyMove() { cluster.nodes = 2; }
  GlobalPlan plan(const std::string& moved, const std::string& devices) const {
    std::string text = "{";
    int gpu = 0;
    for (const ModelStage& s : model_stages(job)) {
      const std::string at = s.name() == moved ? devices : std::to_string(gpu % 4);
      text += (text.size() > 1 ? ", \"" : "\"") + s.name() + "\": \"tp=1,pp=1,dp=1,devices=" + at + "\"";
      ++gpu;
    }
    return parse_global_plan(job, text + "}", "test plan");
  }
  TransitionGraph graph(const GlobalPlan& from, const GlobalPlan& to) const {
    const Controller ctl(job, cluster);
    return ctl.transition(from, to, Signals{1, static_cast<int>(cluster.gpus()), 128, 128, 1});
  }
};

/// The graph's builds one after another, alone on the links, computed here from their
/// transfers: each build's messages' setup on its busiest GPU, and its busiest link's bytes
/// at the link's rate.
struct Alone {
  double setup = 0, bytes = 0;
};
Alone alone_seconds(const TransitionGraph& g, const ClusterSpec& c, double intra_eff, double inter_eff) {
  Alone span;
  for (const GraphNode& n : g.nodes) {
    if (!n.is_build()) continue;
    std::map<int, double> setup, port_out, port_in, nic_out, nic_in, hbm;
    for (const Transfer& t : plan_build(g, n, LinkModel::of(c)).plan.transfers()) {
      const int a = int(t.src), b = int(t.dst), ga = a / c.gpus_per_node, gb = b / c.gpus_per_node;
      if (a == b) {
        hbm[a] += double(t.bytes) / (c.hbm_gbps * 1e9 * 0.85 / 2);
        continue;
      }
      const double m = ga == gb ? 3e-6 : 8e-6;
      setup[a] += m, setup[b] += m;
      if (ga == gb) {
        port_out[a] += double(t.bytes) / (c.intra_node_gbps * 1e9 * intra_eff);
        port_in[b] += double(t.bytes) / (c.intra_node_gbps * 1e9 * intra_eff);
      } else {
        nic_out[ga] += double(t.bytes) / (c.inter_node_gbps * 1e9 * c.nics_per_node * inter_eff);
        nic_in[gb] += double(t.bytes) / (c.inter_node_gbps * 1e9 * c.nics_per_node * inter_eff);
      }
    }
    double s = 0, busiest = 0;
    for (const auto& [gpu, x] : setup) s = std::max(s, x);
    for (const auto* side : {&port_out, &port_in, &nic_out, &nic_in, &hbm})
      for (const auto& [k, x] : *side) busiest = std::max(busiest, x);
    span.setup += s;
    span.bytes += busiest;
  }
  return span;
}
}  // namespace

TEST_CASE("ground truth of transitions: one build alone takes its setup plus its busiest link's bytes; beside the steps, "
          "frozen models move before the boundary at a share of the links, trained ones from the boundary") {
  const TinyMove m;
  // actor/generate from GPU 0 to GPU 5 (the other node): one build, its bytes over the NICs.
  const GlobalPlan from = m.plan("", ""), gen_to = m.plan("actor/generate", "5");
  const TransitionGraph g = m.graph(from, gen_to);
  REQUIRE(g.feasibility.ok);
  REQUIRE(std::count_if(g.nodes.begin(), g.nodes.end(), [](const GraphNode& n) { return n.is_build(); }) == 1);
  GroundTruth quiet(m.cluster, 1, 0);  // no jitter
  const Alone parts = alone_seconds(g, m.cluster, quiet.intra_efficiency(), quiet.inter_efficiency());
  const double want = parts.setup + parts.bytes;
  REQUIRE(parts.bytes > 0);
  const TruthTransition alone = quiet.run_transition(g, m.job, {});
  CHECK(alone.span == doctest::Approx(want).epsilon(1e-6));
  CHECK(alone.ready.at("actor/generate") == doctest::Approx(want).epsilon(1e-6));
  // NICs twice as slow: the bytes take twice as long, the setup not.
  TruthTransitionOptions slow;
  slow.link_slowdown = 2;
  CHECK(quiet.run_transition(g, m.job, slow).span == doctest::Approx(parts.setup + 2 * parts.bytes).epsilon(1e-6));
  // Beside the steps: actor trains, so its copy starts at the boundary, and generation
  // copies after it run alone — the same time, from 0.
  TruthTransitionOptions beside;
  beside.beside = true;
  beside.early = -1;
  const TruthTransition trained = quiet.run_transition(g, m.job, beside);
  CHECK(trained.ready.at("actor/generate") == doctest::Approx(want).epsilon(1e-6));
  // reference/infer (frozen) moves from 1 s before the boundary, sharing the links with
  // the stages then: between 1.25 and 5 times slower (they take 20–80% of the links).
  const TransitionGraph r = m.graph(from, m.plan("reference/infer", "6"));
  const Alone ref = alone_seconds(r, m.cluster, quiet.intra_efficiency(), quiet.inter_efficiency());
  CHECK(quiet.run_transition(r, m.job, {}).span == doctest::Approx(ref.setup + ref.bytes).epsilon(1e-6));
  std::set<double> seen;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    GroundTruth t(m.cluster, seed, 0);
    const double took = t.run_transition(r, m.job, beside).ready.at("reference/infer") + 1;  // from 1 s before the boundary
    CHECK(took > ref.setup + 1.25 * ref.bytes - 1e-9);
    CHECK(took < ref.setup + 5.0 * ref.bytes + 1e-9);
    seen.insert(took);
  }
  CHECK(seen.size() == 8);  // the stages' share is drawn per transition
  // Two builds over the same NICs at once (reference/infer and reward/infer to node 1):
  // they share the links, so together they take their bytes' time summed, not the max.
  GlobalPlan both = m.plan("reference/infer", "6");
  for (auto& [name, spec] : both.stages)
    if (name == "reward/infer") spec.devices = {7};
  const TransitionGraph two = m.graph(from, both);
  const Alone each = alone_seconds(two, m.cluster, quiet.intra_efficiency(), quiet.inter_efficiency());
  const double together = quiet.run_transition(two, m.job, {}).span;
  CHECK(together > each.bytes - 1e-9);
  CHECK(together <= each.setup + each.bytes + 1e-9);
}
