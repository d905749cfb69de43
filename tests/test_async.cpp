// Asynchronous jobs: generation and training as two streams under random timing, in-flight
// weight updates that never let a unit mix versions, staleness bounds, failures that keep
// the old version, and the refusals of bad input.
#include <doctest/doctest.h>

#include <random>

#include "nereus/runtime/weight_update.hpp"
#include "nereus/transport/chaos.hpp"
#include "nereus/transport/local.hpp"
#include "run_async.hpp"
#include "test_util.hpp"
#include "unit_values.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testing::run_on;
using testing::write_values;
using testing::wrong_values;

namespace {

const char* kJob = R"({"algorithm": "grpo", "models": {"actor": "tiny-llama", "reference": "tiny-llama", "reward": "rule"},
  "prompts_per_step": 8, "samples_per_prompt": 2, "prompt_len": 8, "max_response_len": 16, "mode": "async"})";
const char* kPlan = R"({"actor/generate": "tp=1,pp=1,dp=2,devices=0-1", "actor/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=2,pp=1,dp=1,devices=2-3", "actor/train": "tp=2,pp=1,dp=1,devices=4-5"})";

JobOptions opts(Transport* t) {
  JobOptions o;
  o.devices = 6;
  o.capacity = 64 << 20;
  o.transport = t;
  return o;
}

/// Elements of the generation units that differ from the values of the unit's own version.
std::int64_t mixed(const ModelSpec& m, const Job& job) {
  std::int64_t wrong = 0;
  for (const UnitView& u : job.units("actor/generate")) wrong += wrong_values(m, {u}, static_cast<int>(u.version));
  return wrong;
}

std::uint64_t used(const Job& job) {
  std::uint64_t n = 0;
  for (const DeviceUse& d : job.devices()) n += d.used;
  return n;
}

/// A job whose every unit holds version 0's values.
std::unique_ptr<Job> make_job(asio::io_context& io, const JobSpec& spec, Transport* t, const JobOptions* o = nullptr) {
  auto job = std::make_unique<Job>(io.get_executor(), spec, load_global_plan(spec, kPlan), o ? *o : opts(t));
  for (const std::string s : {"actor/generate", "actor/infer", "reference/infer", "actor/train"})
    write_values(*spec.model("actor"), job->units(s), 0);
  return job;
}

/// One training run: the trainer's units get the values of its next version.
asio::awaitable<bool> train_once(Job* job, const ModelSpec* m) {
  StageLease lease = co_await job->enter_stage("actor/train");
  write_values(*m, job->units("actor/train"), static_cast<int>(job->state("actor/train").policy_version + 1));
  lease.leave();
  co_return true;
}

/// Job::end_step() as a value for run_on.
asio::awaitable<bool> end_step(Job* job) {
  co_await job->end_step();
  co_return true;
}

/// One generation run that reads nothing: the version it started on.
std::int64_t generation_run(asio::io_context& io, Job& job) {
  StageLease l = run_on(io, job.enter_stage("actor/generate"));
  const std::int64_t v = l.units()[0].version();
  l.leave();
  return v;
}

/// WeightUpdate::wait() as a value for run_on.
asio::awaitable<bool> staged(WeightUpdate u) {
  co_await u.wait();
  co_return true;
}

/// The two streams of an async job, sharing what they observe.
struct Streams {
  Job* job = nullptr;
  const ModelSpec* m = nullptr;
  Notifier* produced = nullptr;
  int runs = 0;
  std::mt19937_64 rng{7};
  std::vector<std::int64_t> used;  ///< the version each generation run started with
  int generated = 0;               ///< generation runs finished (their rollouts handed over)
  std::vector<std::int64_t> staleness;
  WeightUpdate pending;
  std::vector<WeightUpdateReport> reports;
  std::int64_t reads = 0, mixed_elements = 0, expired_views = 0;
  bool done_training = false;
};

asio::awaitable<void> pause_randomly(Streams* s, double max_ms) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::microseconds(std::uniform_int_distribution<int>(0, static_cast<int>(max_ms * 1000))(s->rng)));
  co_await t.async_wait(asio::use_awaitable);
}

/// Generation: runs of eight decode steps; each step reads every unit; between steps an
/// update whose staging is complete is switched in with `keep`.
asio::awaitable<void> generation(Streams* s) {
  for (int k = 0; k < s->runs; ++k) {
    StageLease lease = co_await s->job->enter_stage("actor/generate");
    std::int64_t v = std::numeric_limits<std::int64_t>::max();
    for (const UnitContext& c : lease.units()) v = std::min(v, c.version());
    s->used.push_back(v);
    for (int step = 0; step < 8; ++step) {
      co_await pause_randomly(s, 3);
      s->mixed_elements += mixed(*s->m, *s->job);
      ++s->reads;
      // A framework that wants the new weights before the run ends waits for the staging.
      if (step == 7 && k % 2 == 1 && s->pending.valid()) {
        try {
          co_await s->pending.wait();
        } catch (const Error&) {
        }
      }
      if (s->pending.valid() && s->pending.ready()) {
        try {
          s->reports.push_back(co_await s->pending.finish(PauseMode::keep));
          // The views taken when the run began show the old weights: they expired.
          for (const UnitContext& c : lease.units()) s->expired_views += c.lifetime().expired();
        } catch (const Error&) {
        }
        s->pending = {};
      }
    }
    lease.leave();
    ++s->generated;
    s->produced->notify();
  }
}

/// Training: run k trains on generation run k's rollouts once they are handed over, then
/// begins the update of its new version.
asio::awaitable<void> training(Streams* s) {
  for (int k = 0; k < s->runs; ++k) {
    while (s->generated <= k) co_await s->produced->wait();
    s->staleness.push_back(s->job->state("actor/train").policy_version - s->used[static_cast<std::size_t>(k)]);
    StageLease lease = co_await s->job->enter_stage("actor/train");
    co_await pause_randomly(s, 3);
    write_values(*s->m, s->job->units("actor/train"), k + 1);
    lease.leave();
    if (!s->pending.valid()) {
      try {
        s->pending = s->job->begin_weight_update("actor/generate");
      } catch (const Error&) {  // the job began one itself to keep generation within max_staleness
      }
    }
  }
  s->done_training = true;
}

}  // namespace

TEST_CASE("async: two streams under random timing keep max_staleness, and no unit ever mixes versions") {
  const JobSpec spec = parse_job(kJob, "job");
  CHECK(spec.async);
  CHECK(spec.max_staleness == 1);
  int keeps = 0;  // updates switched by the framework between two decode steps
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    asio::io_context io;
    LocalTransport local({1, 1 << 20});
    ChaosTransport chaos(local, {0.0001, -1, seed});
    auto job = make_job(io, spec, &chaos);
    const std::uint64_t before = used(*job);
    Notifier produced(io.get_executor());
    Streams s;
    s.job = job.get();
    s.m = spec.model("actor").get();
    s.produced = &produced;
    s.runs = 8;
    s.rng.seed(seed);
    bool gen_done = false, train_done = false;
    asio::co_spawn(io, generation(&s), [&](std::exception_ptr e) {
      CHECK(!e);
      gen_done = true;
    });
    asio::co_spawn(io, training(&s), [&](std::exception_ptr e) {
      CHECK(!e);
      train_done = true;
    });
    io.restart();
    while (!(gen_done && train_done) && io.run_one() > 0) {
    }
    REQUIRE((gen_done && train_done));
    // Generation run k read params of version k − 1 at least, and trained samples were at
    // most one version old.
    REQUIRE(s.used.size() == 8);
    for (std::size_t k = 0; k < s.used.size(); ++k) CHECK(s.used[k] >= static_cast<std::int64_t>(k) - 1);
    for (std::int64_t x : s.staleness) CHECK((x >= 0 && x <= 1));
    CHECK(s.reads == 64);
    CHECK(s.mixed_elements == 0);
    CHECK(!s.reports.empty());
    for (const WeightUpdateReport& r : s.reports) {
      CHECK(r.completed);
      CHECK((r.automatic ? r.pause == PauseMode::wait : r.pause == PauseMode::keep));
      keeps += !r.automatic;
      CHECK(r.moved_bytes > 0);
      CHECK(r.paused_seconds <= r.seconds);
      for (std::int64_t v : r.unit_versions) CHECK(v == r.version);
    }
    CHECK(s.expired_views == 2 * static_cast<std::int64_t>(std::count_if(s.reports.begin(), s.reports.end(),
                                                                       [](const WeightUpdateReport& r) { return !r.automatic; })));
    // Whatever is still in flight finishes; then no staging is left on any device.
    if (s.pending.valid()) (void)run_on(io, s.pending.finish(PauseMode::wait));
    CHECK(mixed(*s.m, *job) == 0);
    CHECK(used(*job) == before);
  }
  MESSAGE("updates switched with keep: " << keeps);
  CHECK(keeps > 0);
}

TEST_CASE("async: a plan change between training steps, beside a generation run; the next run gets new units holding one whole version") {
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  auto job = make_job(io, spec, &local);
  const ModelSpec* m = spec.model("actor").get();
  const GlobalPlan target = load_global_plan(spec, R"({"actor/generate": "tp=2,pp=1,dp=1,devices=0-1",
    "actor/infer": "tp=1,pp=1,dp=2,devices=2-3", "reference/infer": "tp=1,pp=1,dp=2,devices=2-3",
    "actor/train": "tp=1,pp=1,dp=2,devices=4-5"})");
  auto gen_run = [&] { return generation_run(io, *job); };
  CHECK(gen_run() == 0);
  CHECK(gen_run() == 0);  // runs 0 and 1 may use version 0
  // While training runs, between a training run and end_step, with an update in flight:
  // refused, nothing changed.
  StageLease training = run_on(io, job->enter_stage("actor/train"));
  CHECK(has(error_of([&] { job->begin_transition(target); }), "'actor/train' is running; an async job changes plan"));
  write_values(*m, job->units("actor/train"), 1);  // the run trains version 1
  training.leave();
  CHECK(has(error_of([&] { job->begin_transition(target); }), "'actor/train' ran in this step"));
  run_on(io, end_step(job.get()));
  WeightUpdate u = job->begin_weight_update("actor/generate");
  CHECK(has(error_of([&] { job->begin_transition(target); }), "weight update of 'actor/generate' is in flight"));
  u.cancel();
  (void)error_of([&] { (void)run_on(io, u.finish(PauseMode::keep)); });
  const GlobalPlan together = load_global_plan(spec, R"({"actor/generate": "tp=2,pp=1,dp=1,devices=4-5",
    "actor/infer": "tp=1,pp=1,dp=2,devices=2-3", "reference/infer": "tp=1,pp=1,dp=2,devices=2-3",
    "actor/train": "tp=1,pp=1,dp=2,devices=4-5"})");
  CHECK(has(error_of([&] { job->begin_transition(together); }), "share device 4"));
  CHECK(job->units("actor/generate")[0].version == 0);
  // Between training steps, while a generation run goes on (run 2, on version 1: the job
  // updated it itself): its old units stay until it leaves; the new ones hold version 1,
  // whole.
  StageLease generating = run_on(io, job->enter_stage("actor/generate"));
  CHECK(generating.units()[0].version() == 1);
  TransitionHandle h = job->begin_transition(target);
  io.restart();
  for (int k = 0; k < 200; ++k) io.poll();
  CHECK(!h.done());
  CHECK(mixed(*m, *job) == 0);
  generating.leave();
  const TransitionReport r = run_on(io, h.wait());
  CHECK(r.completed);
  CHECK(r.moved_bytes > 0);
  CHECK(to_string(job->plan()) == to_string(target));
  for (const UnitView& v : job->units("actor/generate")) CHECK(v.version == 1);
  CHECK(mixed(*m, *job) == 0);
  CHECK(wrong_values(*m, job->units("actor/train"), 1) == 0);
  // The streams go on, on the new plan, within max_staleness.
  run_on(io, train_once(job.get(), m));
  run_on(io, end_step(job.get()));
  CHECK(gen_run() == 2);  // run 3 needs version 2: updated by the job, on the new layout
  CHECK(mixed(*m, *job) == 0);
  CHECK(job->weight_updates().back().automatic);
}

TEST_CASE("async: generation that the framework never updates is kept within max_staleness by the job") {
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  auto job = make_job(io, spec, &local);
  const ModelSpec* m = spec.model("actor").get();
  auto gen_run = [&] { return generation_run(io, *job); };
  CHECK(gen_run() == 0);  // run 0
  CHECK(gen_run() == 0);  // run 1 may use version 0
  run_on(io, train_once(job.get(), m));
  CHECK(gen_run() == 1);  // run 2 needs version 1: the job updated it itself
  CHECK(mixed(*m, *job) == 0);
  CHECK(job->state("actor/generate").policy_version == 1);
}

TEST_CASE("async: finish(wait) switches once the run in flight ends; keep switches at once and expires the run's views") {
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  auto job = make_job(io, spec, &local);
  const ModelSpec* m = spec.model("actor").get();
  run_on(io, train_once(job.get(), m));
  StageLease held = run_on(io, job->enter_stage("actor/generate"));
  WeightUpdate u = job->begin_weight_update("actor/generate");
  CHECK(u.version() == 1);
  CHECK(!u.metadata().empty());
  for (const EngineTensor& t : u.metadata()) CHECK((t.device == 0 || t.device == 1));
  run_on(io, staged(u));
  CHECK(u.ready());
  std::optional<WeightUpdateReport> report;
  asio::co_spawn(io, u.finish(PauseMode::wait), [&](std::exception_ptr e, WeightUpdateReport r) {
    CHECK(!e);
    report = r;
  });
  io.restart();
  io.poll();
  CHECK(!report);  // the run in flight still reads version 0
  CHECK(job->units("actor/generate")[0].version == 0);
  held.leave();
  io.restart();
  while (!report && io.run_one() > 0) {
  }
  REQUIRE(report);
  CHECK(report->completed);
  CHECK(report->paused_seconds < report->seconds);
  CHECK(job->units("actor/generate")[0].version == 1);
  CHECK(mixed(*m, *job) == 0);

  run_on(io, train_once(job.get(), m));
  StageLease running = run_on(io, job->enter_stage("actor/generate"));
  WeightUpdate k = job->begin_weight_update("actor/generate");
  const WeightUpdateReport kr = run_on(io, k.finish(PauseMode::abort));
  CHECK(kr.version == 2);
  CHECK(running.units()[0].aborted());
  CHECK(running.units()[0].lifetime().expired());
  CHECK(mixed(*m, *job) == 0);
  running.leave();
  StageLease next = run_on(io, job->enter_stage("actor/generate"));
  CHECK(!next.units()[0].aborted());
  CHECK(next.units()[0].version() == 2);
  next.leave();
}

TEST_CASE("async: a failed or cancelled update leaves every unit on its old version and frees its staging") {
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  ChaosTransport chaos(local, {0.0002, -1, 5});
  auto job = make_job(io, spec, &chaos);
  const ModelSpec* m = spec.model("actor").get();
  run_on(io, train_once(job.get(), m));
  const std::uint64_t before = used(*job);
  chaos.fail_after(3);
  WeightUpdate u = job->begin_weight_update("actor/generate");
  CHECK(used(*job) > before);  // the staging
  CHECK(has(error_of([&] { run_on(io, staged(u)); }), "failed"));
  CHECK(has(error_of([&] { (void)run_on(io, u.finish(PauseMode::keep)); }), "its units keep their version"));
  CHECK(used(*job) == before);
  for (const UnitView& v : job->units("actor/generate")) CHECK(v.version == 0);
  CHECK(mixed(*m, *job) == 0);

  chaos.fail_after(-1);
  WeightUpdate c = job->begin_weight_update("actor/generate");
  c.cancel();
  CHECK(has(error_of([&] { (void)run_on(io, c.finish(PauseMode::keep)); }), "cancelled"));
  CHECK(used(*job) == before);
  CHECK(mixed(*m, *job) == 0);

  WeightUpdate ok = job->begin_weight_update("actor/generate");
  CHECK(run_on(io, ok.finish(PauseMode::keep)).version == 1);
  CHECK(mixed(*m, *job) == 0);
  for (const UnitView& v : job->units("actor/generate")) CHECK(v.version == 1);
}

TEST_CASE("async: framework memory behind generation units receives the update in place") {
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  const ModelSpec& m = *spec.model("actor");
  std::vector<std::vector<float>> owned;
  JobOptions o = opts(&local);
  {
    Job look(io.get_executor(), spec, load_global_plan(spec, kPlan), o);
    for (const UnitView& u : look.units("actor/generate"))
      for (const ShardView& v : u.shards) {
        owned.emplace_back((v.bytes() + 3) / 4);
        o.adopt.push_back({"actor/generate", u.replica, v.device, m.tensor(v.tensor).name, Slot::param,
                           reinterpret_cast<std::byte*>(owned.back().data()), owned.back().size() * 4});
      }
  }
  auto job = make_job(io, spec, &local, &o);
  run_on(io, train_once(job.get(), &m));
  WeightUpdate u = job->begin_weight_update("actor/generate");
  const WeightUpdateReport r = run_on(io, u.finish(PauseMode::keep));
  CHECK(r.copied_bytes > 0);
  std::size_t k = 0;
  for (const UnitView& v : job->units("actor/generate"))
    for (const ShardView& s : v.shards) CHECK(s.data == reinterpret_cast<const std::byte*>(owned[k++].data()));
  CHECK(mixed(m, *job) == 0);
  CHECK(job->units("actor/generate")[0].version == 1);
}

TEST_CASE("async: bad input gets one clear error and changes nothing") {
  CHECK(has(error_of([] { parse_job(R"({"algorithm": "grpo", "models": {"actor": "tiny-llama", "reference": "tiny-llama",
    "reward": "rule"}, "prompts_per_step": 8, "samples_per_prompt": 2, "prompt_len": 8, "max_response_len": 16,
    "mode": "async", "max_staleness": 0})", "job.json"); }), "job.json: field 'max_staleness' is 0; it must be at least 1"));
  CHECK(has(error_of([] { parse_job(R"({"algorithm": "grpo", "models": {"actor": "tiny-llama", "reference": "tiny-llama",
    "reward": "rule"}, "prompts_per_step": 8, "samples_per_prompt": 2, "prompt_len": 8, "max_response_len": 16,
    "max_staleness": 2})", "job.json"); }), "'max_staleness' is for async jobs"));
  CHECK(has(error_of([] { parse_pause_mode("pause"); }), "pause mode 'pause' is not one a generation stage knows"));
  const JobSpec spec = parse_job(kJob, "job");
  asio::io_context io;
  LocalTransport local({1, 1 << 20});
  const char* together = R"({"actor/generate": "tp=1,pp=1,dp=2,devices=4-5", "actor/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=2-3", "actor/train": "tp=2,pp=1,dp=1,devices=4-5"})";
  CHECK(has(error_of([&] { Job(io.get_executor(), spec, load_global_plan(spec, together), opts(&local)); }),
            "async job: actor/generate and actor/train share device 4"));
  auto job = make_job(io, spec, &local);
  CHECK(has(error_of([&] { job->begin_weight_update("actor/generate"); }), "already holds version 0"));
  CHECK(has(error_of([&] { job->begin_weight_update("actor/infer"); }), "'actor/infer' is not a generation model-stage"));
  StageLease training = run_on(io, job->enter_stage("actor/train"));
  CHECK(has(error_of([&] { job->begin_weight_update("actor/generate"); }), "'actor/train' is running"));
  training.leave();
  WeightUpdate u = job->begin_weight_update("actor/generate");
  CHECK(has(error_of([&] { job->begin_weight_update("actor/generate"); }), "already in flight"));
  (void)run_on(io, u.finish(PauseMode::keep));

  const JobSpec sync = load_job("ppo-tiny");
  Job lockstep(io.get_executor(), sync, load_global_plan(sync, R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})"), [] {
    JobOptions o;
    o.capacity = 64 << 20;
    return o;
  }());
  CHECK(has(error_of([&] { lockstep.begin_weight_update("actor/generate"); }), "the job is not async"));
}
