// `nereus bench overlap`: how much of a transition stays exposed when it runs beside
// stage work. A PPO job whose actor and critic share devices 0-3 and whose reference and
// reward models (qwen2.5-0.5b) sit on 4 and 6, while actor/train does CPU work on 0-3.
// Two cases, each on a fresh job:
// - disjoint: the transition extends the reference to a second replica on 5 and reshards
//   the reward to tp=2 on 6-7, devices the stage does not use;
// - shared: the same changes land on devices 0, 1 and 2, where the stage runs. The
//   transition begins first, so its builds are under way when the stage claims the
//   devices and copy beside it, contending for memory bandwidth and cores; a build not yet
//   started would wait for the stage (JobOptions::avoid_busy).
// Measured per repetition: the transition alone, the stage work alone (a fixed amount of
// work sized to about twice the transition), and both together; exposed = together −
// stage alone, reported against the transition alone.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <boost/asio/thread_pool.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "job_bench.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/trace_events.hpp"
#include "nereus/core/fill.hpp"
#include "nereus/runtime/job.hpp"

namespace nereus::bench {

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// CPU work standing in for a training stage: `rounds` passes of mixing over a buffer.
std::uint64_t crunch(std::span<const std::byte> mem, std::uint64_t rounds) {
  std::uint64_t h = 0;
  const std::size_t n = std::min<std::size_t>(mem.size(), 1 << 20) / 8;
  for (std::uint64_t k = 0; k < rounds; ++k)
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t x;
      std::memcpy(&x, mem.data() + i * 8, 8);
      h = splitmix64(h ^ x);
    }
  return h;
}

JobSpec overlap_job(bool smoke) {
  JobSpec j;
  j.algorithm = Algorithm::ppo;
  auto small = load_model("tiny-llama");
  auto big = load_model(smoke ? "tiny-qwen2-tied" : "qwen2.5-0.5b");
  j.models = {{"actor", small}, {"critic", small}, {"reference", big}, {"reward", big}};
  j.prompts_per_step = 64;
  j.samples_per_prompt = 1;
  j.prompt_len = 64;
  j.max_response_len = 256;
  return j;
}

const char* kFrom = R"({"actor/generate": "tp=4,pp=1,dp=1,devices=0-3", "actor/infer": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/infer": "tp=4,pp=1,dp=1,devices=0-3", "reference/infer": "tp=1,pp=1,dp=1,devices=4",
  "reward/infer": "tp=1,pp=1,dp=1,devices=6", "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/train": "tp=4,pp=1,dp=1,devices=0-3"})";
const char* kTo = R"({"actor/generate": "tp=4,pp=1,dp=1,devices=0-3", "actor/infer": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/infer": "tp=4,pp=1,dp=1,devices=0-3", "reference/infer": "tp=1,pp=1,dp=2,devices=4-5",
  "reward/infer": "tp=2,pp=1,dp=1,devices=6-7", "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/train": "tp=4,pp=1,dp=1,devices=0-3"})";
const char* kToShared = R"({"actor/generate": "tp=4,pp=1,dp=1,devices=0-3", "actor/infer": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/infer": "tp=4,pp=1,dp=1,devices=0-3", "reference/infer": "tp=1,pp=1,dp=2,devices=4:0",
  "reward/infer": "tp=2,pp=1,dp=1,devices=1:2", "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
  "critic/train": "tp=4,pp=1,dp=1,devices=0-3"})";

}  // namespace

namespace {

/// One case: the transition from `from` to `to` alone, the stage alone, both together.
nlohmann::json measure(const OverlapConfig& c, const JobSpec& spec, const GlobalPlan& from, const GlobalPlan& to,
                       asio::thread_pool& cpu, TraceEvents& trace, int pid) {
  asio::io_context io;
  JobOptions o;
  o.devices = 8;
  o.capacity = c.smoke ? (64 << 20) : (std::size_t{3} << 30);
  o.fill = true;
  o.copy_threads = 1;
  Job job(io.get_executor(), spec, from, o);
  std::exception_ptr error;
  auto run = [&](asio::awaitable<void> a) {
    if (!drive(io, std::move(a), std::chrono::seconds(600), error)) throw Error("overlap bench: stuck");
    if (error) std::rethrow_exception(error);
  };
  std::uint64_t rounds = 1, sink = 0;
  auto stage = [&](UnitContext& u) -> asio::awaitable<void> {
    const std::span<const std::byte> mem = u.memory(0);
    sink += co_await asio::co_spawn(cpu, [mem, &rounds]() -> asio::awaitable<std::uint64_t> { co_return crunch(mem, rounds); },
                                    asio::use_awaitable);
  };
  std::vector<double> tran, alone, both, moved;
  // Warm-up, untimed: the first transition also commits fresh arena pages.
  run([&]() -> asio::awaitable<void> {
    co_await job.transition(to);
    co_await job.transition(from);
  }());
  for (int rep = 0; rep < c.repeat; ++rep) {
    // The transition alone, then back (untimed).
    double t_tran = 0;
    run([&]() -> asio::awaitable<void> {
      const auto t0 = clock::now();
      const TransitionReport r = co_await job.transition(to);
      t_tran = seconds_since(t0);
      if (!r.completed) throw Error("transition failed: " + r.error);
      moved.push_back(static_cast<double>(r.moved_bytes));
      co_await job.transition(from);
    }());
    tran.push_back(t_tran);
    // Size the stage work to about twice the transition (once), then time it alone.
    if (rep == 0) {
      const double target = c.stage_seconds > 0 ? c.stage_seconds : std::max(0.01, 2 * t_tran);
      double t = 0;
      while (t < target / 4) {
        rounds *= 2;
        run([&]() -> asio::awaitable<void> {
          const auto t0 = clock::now();
          co_await job.run_stage("actor/train", stage);
          t = seconds_since(t0);
          co_await job.end_step();
        }());
      }
      rounds = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(rounds) * target / t));
    }
    run([&]() -> asio::awaitable<void> {
      const auto t0 = clock::now();
      co_await job.run_stage("actor/train", stage);
      alone.push_back(seconds_since(t0));
      co_await job.end_step();
    }());
    // Both: the transition begins, the stage runs beside it.
    run([&]() -> asio::awaitable<void> {
      const auto t0 = clock::now();
      TransitionHandle h = job.begin_transition(to);
      co_await job.run_stage("actor/train", stage);
      const double stage_end = seconds_since(t0);
      const TransitionReport r = co_await h.wait();
      both.push_back(seconds_since(t0));
      if (!r.completed) throw Error("transition failed: " + r.error);
      if (rep + 1 == c.repeat) {  // the picture: the stage, the transition and its nodes per device
        trace.complete(pid, "stage actor/train (devices 0-3)", "actor/train", 0, stage_end);
        trace.complete(pid, "transition", "transition", 0, r.seconds,
                       {{"copied_bytes", r.copied_bytes}, {"exposed_seconds", std::max(0.0, both.back() - stage_end)}});
        for (const NodeRun& n : r.nodes)
          for (DeviceId d : n.devices)
            trace.complete(pid, "device " + std::to_string(d), std::string(to_string(n.kind)) + " " + n.unit, n.start, n.end - n.start,
                           {{"bytes", n.bytes}, {"unit", n.unit}});
      }
      co_await job.end_step();
      co_await job.transition(from);
    }());
  }
  const FillCheck v = job.verify();
  const double t_tran = median(tran), t_alone = median(alone), t_both = median(both);
  const double exposed = std::max(0.0, t_both - t_alone);
  return {{"moved_bytes", median(moved)},
          {"transition_seconds", t_tran},
          {"stage_seconds", t_alone},
          {"together_seconds", t_both},
          {"serialized_seconds", t_alone + t_tran},
          {"exposed_seconds", exposed},
          {"exposed_ratio", t_tran > 0 ? exposed / t_tran : 0.0},
          {"verified", v.ok},
          {"cap_violations", job.cap_violations()},
          {"checksum", sink & 0xff}};
}

}  // namespace

int run_overlap_bench(const OverlapConfig& c) {
  if (c.repeat < 1) throw Error("--repeat must be positive");
  const JobSpec spec = overlap_job(c.smoke);
  const GlobalPlan from = load_global_plan(spec, kFrom);
  asio::thread_pool cpu(1);  // where the stage's CPU work runs, off the event loop
  // The disjoint case's figures at the top level, the shared case's under "shared".
  TraceEvents trace;
  trace.process(1, "disjoint devices");
  trace.process(2, "shared devices");
  nlohmann::json out = measure(c, spec, from, load_global_plan(spec, kTo), cpu, trace, 1);
  out["shared"] = measure(c, spec, from, load_global_plan(spec, kToShared), cpu, trace, 2);
  if (!c.perfetto.empty()) {
    std::ofstream file(c.perfetto);
    file << trace.dump();
    if (!file) throw Error("--perfetto: cannot write '" + c.perfetto + "'");
  }
  out["repeat"] = c.repeat;
  out["smoke"] = c.smoke;
  cpu.join();
  const bool ok = out["verified"].get<bool>() && out["shared"]["verified"].get<bool>() && out["cap_violations"] == 0 &&
                  out["shared"]["cap_violations"] == 0;
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    for (const auto& [name, r] : {std::pair<const char*, const nlohmann::json&>{"disjoint devices", out},
                                  std::pair<const char*, const nlohmann::json&>{"shared devices", out["shared"]}}) {
      const double t_tran = r["transition_seconds"];
      std::cout << fmt::format("{}: transition alone {:.3f} s ({:.2f} GB), stage work alone {:.3f} s, together {:.3f} s\n", name,
                               t_tran, r["moved_bytes"].get<double>() / 1e9, r["stage_seconds"].get<double>(),
                               r["together_seconds"].get<double>());
      std::cout << fmt::format("  exposed {:.3f} s = {:.1f}% of the transition (serialized would add {:.3f} s); bytes {}\n",
                               r["exposed_seconds"].get<double>(), 100 * r["exposed_ratio"].get<double>(), t_tran,
                               r["verified"].get<bool>() ? "verified" : "WRONG");
    }
  }
  return ok ? 0 : 1;
}

}  // namespace nereus::bench
