// The job runtime: real bytes through transitions that run alongside stage work,
// cancellation and injected failures leaving complete collections, logical state
// (versions, counters, batch geometry) moving with the units, and random plan changes
// under random timing with every byte verified and no device over its budget.
#include <doctest/doctest.h>

#include <chrono>
#include <random>

#include "job_cases.hpp"
#include "run_async.hpp"
#include "nereus/runtime/job.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/chaos.hpp"
#include "nereus/transport/local.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testing::run_on;

namespace {


asio::awaitable<void> sleep_ms(double ms) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000)));
  co_await t.async_wait(asio::use_awaitable);
}

/// Stage work that sleeps and checks what it is given.
StageWork nap(double ms, std::vector<std::string>* log = nullptr) {
  return [ms, log](UnitContext& c) -> asio::awaitable<void> {
    REQUIRE(!c.buffers().empty());
    for (std::size_t b = 0; b < c.buffers().size(); ++b) CHECK(c.memory(b).size() >= c.buffers()[b].bytes());
    if (log) log->push_back(std::string(c.model_stage()) + "#" + std::to_string(c.replica()) + "@" + device_list_string(c.emu().gpus));
    co_await sleep_ms(ms);
  };
}

/// One synchronous RL step: every stage in phase order, then end_step.
asio::awaitable<void> run_step(Job& job, double ms) {
  for (const auto& phase : job.spec().phases())
    for (const ModelStage& s : phase) co_await job.run_stage(s.name(), nap(ms));
  co_await job.end_step();
}

JobOptions options(std::size_t capacity = 64 << 20) {
  JobOptions o;
  o.devices = 8;
  o.capacity = capacity;
  o.fill = true;
  o.copy_threads = 1;
  return o;
}

std::string spec_of(const GlobalPlan& p, const std::string& stage) { return to_string(*p.find(stage)); }

}  // namespace

TEST_CASE("job: a transition between steps moves real bytes and logical state") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const GlobalPlan a = load_global_plan(spec, testcase::kPlanA), b = load_global_plan(spec, testcase::kPlanB);
  Job job(io.get_executor(), spec, a, options());
  CHECK(job.verify().ok);
  run_on(io, [&]() -> asio::awaitable<int> { co_await run_step(job, 1); co_return 0; }());
  CHECK(job.state("actor/train").update_count == 1);
  CHECK(job.state("actor/generate").policy_version == 1);  // weight sync at the step's end
  const auto loader = job.state("actor/train").dataloader_position;
  const TransitionReport r = run_on(io, job.transition(b));
  CHECK(r.completed);
  CHECK(r.error.empty());
  CHECK(r.moved_bytes > 0);
  CHECK(r.copied_bytes >= r.moved_bytes);
  for (const auto& s : r.stages) CHECK(s.on_new_plan);
  const FillCheck v = job.verify();
  CHECK_MESSAGE(v.ok, v.first_error);
  for (const auto& [name, spec_b] : b.stages) CHECK(spec_of(job.plan(), name) == to_string(spec_b));
  // The counters move with the units; DP changes keep the global batch.
  const StageState& gen = job.state("actor/generate");
  CHECK(gen.dp == 8);
  CHECK(gen.micro_batch * gen.accumulation_steps * gen.dp == 64);
  CHECK(job.state("actor/train").update_count == 1);
  CHECK(job.state("actor/train").dataloader_position == loader);
  CHECK(job.cap_violations() == 0);
  // The next step runs on the new units.
  std::vector<std::string> log;
  run_on(io, [&]() -> asio::awaitable<int> {
    co_await job.run_stage("actor/generate", nap(0, &log));
    co_return 0;
  }());
  CHECK(log.size() == 8);
  CHECK(job.verify().ok);
}

TEST_CASE("job: a transition begun mid-step overlaps the rest of the step and takes effect at the next") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const GlobalPlan a = load_global_plan(spec, testcase::kPlanA), b = load_global_plan(spec, testcase::kPlanB);
  Job job(io.get_executor(), spec, a, options());
  std::vector<std::string> log;
  const TransitionReport r = run_on(io, [&]() -> asio::awaitable<TransitionReport> {
    co_await job.run_stage("actor/generate", nap(2));
    TransitionHandle h = job.begin_transition(b);
    CHECK(has(error_of([&] { job.begin_transition(b); }), "already in flight"));
    for (const char* s : {"actor/infer", "critic/infer", "reference/infer", "reward/infer", "actor/train", "critic/train"})
      co_await job.run_stage(s, nap(3, &log));
    // Still this step: the old plan. actor/train ran on its old unit.
    CHECK(std::find(log.begin(), log.end(), "actor/train#0@0-3") != log.end());
    co_await job.end_step();
    log.clear();
    co_await job.run_stage("actor/train", nap(1, &log));  // awaits exactly its new unit
    CHECK(log == std::vector<std::string>{"actor/train#0@4-7"});
    co_return co_await h.wait();
  }());
  CHECK(r.completed);
  CHECK(job.verify().ok);
  CHECK(job.cap_violations() == 0);
  // The stale generation stage was rebuilt from the updated training stage.
  CHECK(job.state("actor/generate").policy_version == 1);
  CHECK(has(error_of([&] { run_on(io, job.transition(a)); }), "already ran in this step"));
}

TEST_CASE("job: cancellation and injected failures leave every model-stage a complete collection") {
  const JobSpec spec = load_job("ppo-tiny");
  const GlobalPlan a = load_global_plan(spec, testcase::kPlanA), b = load_global_plan(spec, testcase::kPlanB);
  for (int fail_at = 0; fail_at < 24; fail_at += 3) {
    CAPTURE(fail_at);
    asio::io_context io;
    LocalTransport local({1, 1 << 20});
    ChaosTransport chaos(local, {0.0005, -1, static_cast<std::uint64_t>(fail_at) + 1});
    JobOptions o = options();
    o.transport = &chaos;
    o.executor.chunk_bytes = 256 << 10;  // more posts, more places to fail
    Job job(io.get_executor(), spec, a, o);
    const bool cancel = fail_at % 2 == 1;
    if (!cancel) chaos.fail_after(fail_at);
    const TransitionReport r = run_on(io, [&]() -> asio::awaitable<TransitionReport> {
      TransitionHandle h = job.begin_transition(b);
      if (cancel) {
        co_await sleep_ms(fail_at * 0.2);
        h.cancel();
      }
      co_return co_await h.wait();
    }());
    CHECK(r.cancelled == cancel);
    if (!r.completed) CHECK(!r.error.empty());
    const FillCheck v = job.verify();
    CHECK_MESSAGE(v.ok, v.first_error);
    CHECK(job.cap_violations() == 0);
    const GlobalPlan now = job.plan();
    for (const StageOutcome& s : r.stages) {
      CAPTURE(s.model_stage);
      const std::string target = to_string(*b.find(s.model_stage));
      if (s.on_new_plan) CHECK(spec_of(now, s.model_stage) == target);
      // On the old plan: the old layout, maybe fewer replicas.
      else CHECK(now.find(s.model_stage)->layout == a.find(s.model_stage)->layout);
    }
    // The job carries on: a step, then the transition again, to the end.
    chaos.fail_after(-1);
    run_on(io, [&]() -> asio::awaitable<int> { co_await run_step(job, 0.2); co_return 0; }());
    const TransitionReport again = run_on(io, job.transition(b));
    CHECK(again.completed);
    CHECK(job.verify().ok);
  }
}

TEST_CASE("job: GPU memory where no GPU is, or no CUDA is built in: one error naming the device") {
  if (cuda_device_count() > 0) return;  // the GPU suite runs a job in GPU memory
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  JobOptions o = options();
  o.memory = MemoryKind::cuda;
  const std::string e = error_of([&] { Job(io.get_executor(), spec, load_global_plan(spec, testcase::kPlanA), o); });
  CHECK((has(e, "device 0: no CUDA device 0") || has(e, "device 0: no cuda backend")));
}

TEST_CASE("job: infeasible transitions and bad input are refused before any byte moves") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const GlobalPlan a = load_global_plan(spec, testcase::kPlanA);
  std::string swap = testcase::kPlanA;
  swap.replace(swap.find("\"actor/train\": \"tp=4,pp=1,dp=1,devices=0-3\""), 43, "\"actor/train\": \"tp=4,pp=1,dp=1,devices=4-7\"");
  swap.replace(swap.find("\"critic/train\": \"tp=4,pp=1,dp=1,devices=4-7\""), 44, "\"critic/train\": \"tp=4,pp=1,dp=1,devices=0-3\"");
  // Just enough for the plan, not for both training stages at once on a GPU.
  Job job(io.get_executor(), spec, a, options(12 << 20));
  const std::string e = error_of([&] { job.begin_transition(load_global_plan(spec, swap)); });
  CHECK(has(e, "infeasible"));
  CHECK(has(e, "cannot be built"));
  CHECK(job.verify().ok);
  CHECK(spec_of(job.plan(), "actor/train") == "tp=4,pp=1,dp=1,devices=0-3");
  CHECK(has(error_of([&] {
              run_on(io, [&]() -> asio::awaitable<int> {
                co_await job.run_stage("critic/generate", nap(0));
                co_return 0;
              }());
            }),
            "not a model-stage"));
  CHECK(has(error_of([&] { Job(io.get_executor(), spec, a, options(1 << 20)); }), "budget is free"));
}

/// Random plan changes of `spec` under random timing, seeds 1..seeds; at least
/// `min_completed` complete (the rest are refused or cancelled cleanly).
void random_plan_changes(const JobSpec& spec, std::uint64_t seeds, int min_completed) {
  int completed = 0;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    testcase::JobGenerator gen(seed);
    const int pool = gen.uniform(4, 8);
    const GlobalPlan a = gen.plan(spec, pool);
    const GlobalPlan b = gen.plan(spec, pool, &a, 0.25);
    asio::io_context io;
    LocalTransport local({1, 1 << 20});
    ChaosTransport chaos(local, {0.001, -1, seed});
    JobOptions o = options(48 << 20);
    o.devices = pool;
    o.transport = &chaos;
    o.avoid_busy = gen.coin();
    o.workspace = {{"actor/train", 1 << 20}};
    Job job(io.get_executor(), spec, a, o);
    std::mt19937_64 rng(seed);
    const int begin_after = gen.uniform(0, 7);  // stages of the step run before the transition begins
    TransitionReport r;
    std::string refused;
    run_on(io, [&]() -> asio::awaitable<int> {
      TransitionHandle h;
      int k = 0;
      for (const auto& phase : job.spec().phases())
        for (const ModelStage& s : phase) {
          if (k++ == begin_after) {
            try {
              h = job.begin_transition(b);
            } catch (const Error& e) {
              refused = e.what();
            }
          }
          co_await job.run_stage(s.name(), nap(std::uniform_real_distribution<double>(0, 2)(rng)));
        }
      if (!h.valid() && refused.empty()) h = job.begin_transition(b);
      co_await job.end_step();
      if (h.valid()) {
        co_await run_step(job, 0.3);  // the next step runs on the new plan as units commit
        r = co_await h.wait();
      }
      co_return 0;
    }());
    if (!refused.empty()) {
      CHECK(has(refused, "infeasible"));
      continue;
    }
    CHECK_MESSAGE(r.completed, r.error);
    completed += r.completed;
    const FillCheck v = job.verify();
    CHECK_MESSAGE(v.ok, v.first_error);
    CHECK(job.cap_violations() == 0);
    for (const auto& [name, s] : b.stages) CHECK(spec_of(job.plan(), name) == to_string(s));
    for (const DeviceUse& d : job.devices()) CHECK(d.peak <= d.budget);
  }
  MESSAGE(completed << " of 30 random transitions completed");
  CHECK(completed >= min_completed);
}

TEST_CASE("job: random plan changes under random timing") { random_plan_changes(testcase::tiny_ppo_job(), 30, 20); }

TEST_CASE("job: ReMax — its four model-stages run, and random plan changes move them") {
  const JobSpec remax = testcase::tiny_remax_job();
  std::vector<std::string> stages;
  for (const ModelStage& s : model_stages(remax)) stages.push_back(s.name());
  CHECK(stages == std::vector<std::string>{"actor/generate", "reference/infer", "reward/infer", "actor/train"});
  random_plan_changes(remax, 12, 7);
}

TEST_CASE("job: random MoE plan changes (ep, etp) under random timing") {
  random_plan_changes(testcase::tiny_ppo_job(true), 12, 7);
}

TEST_CASE("job: a memory-first transition on full devices, completed or cancelled part-way") {
  const JobSpec spec = load_job("ppo-tiny");
  std::string from = testcase::kPlanA;
  from.replace(from.find("\"actor/train\": \"tp=4,pp=1,dp=1,devices=0-3\""), 43, "\"actor/train\": \"tp=2,pp=1,dp=2,devices=0-3\"");
  std::string to = from;
  to.replace(to.find("\"actor/train\": \"tp=2,pp=1,dp=2,devices=0-3\""), 43, "\"actor/train\": \"tp=1,pp=2,dp=2,devices=0-3\"");
  const GlobalPlan a = load_global_plan(spec, from), b = load_global_plan(spec, to);
  for (int stop_after = -1; stop_after < 6; ++stop_after) {
    CAPTURE(stop_after);
    asio::io_context io;
    LocalTransport local({1, 1 << 20});
    ChaosTransport chaos(local, {0.0005, -1, 3});
    JobOptions o = options(13 << 20);  // only one copy of actor/train fits where it lives
    o.transport = &chaos;
    o.executor.chunk_bytes = 256 << 10;
    Job job(io.get_executor(), spec, a, o);
    if (stop_after >= 0) chaos.fail_after(stop_after * 4);
    const TransitionReport r = run_on(io, job.transition(b));
    const FillCheck v = job.verify();
    CHECK_MESSAGE(v.ok, v.first_error);
    CHECK(job.cap_violations() == 0);
    for (const DeviceUse& d : job.devices()) CHECK(d.peak <= d.budget);
    if (stop_after < 0) {
      CHECK(r.completed);
      CHECK(to_string(*job.plan().find("actor/train")) == "tp=1,pp=2,dp=2,devices=0-3");
    }
    // Whatever happened, actor/train is a complete collection of one layout or the other.
    const CollectionSpec now = *job.plan().find("actor/train");
    CHECK(now.dp >= 1);
    CHECK((now.layout.tp == 2 || now.layout.tp == 1));
  }
}
