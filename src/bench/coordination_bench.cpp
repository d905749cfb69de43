// `nereus bench coordination`: the three coordination types of the Nereus paper on a
// shared, nearly full pool of host devices. Each trial draws a plan for the PPO job and a
// new placement for the two model-stages the type names, on GPUs they swap or share; sets
// every device's capacity just above the smallest that admits the transition; then runs a
// step, begins the transition at a random point of it, finishes the step, runs the next
// one on the new plan, and checks the outcome: every unit where the new plan says, every
// byte equal to the fill, no allocation over a budget, nothing stuck.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "job_bench.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/trace_events.hpp"
#include "nereus/plan/geometry.hpp"
#include "nereus/runtime/job.hpp"
#include "nereus/transport/chaos.hpp"
#include "nereus/transport/local.hpp"

namespace nereus::bench {

bool drive(asio::io_context& io, asio::awaitable<void> work, std::chrono::duration<double> timeout,
           std::exception_ptr& error) {
  bool done = false;
  io.restart();
  asio::co_spawn(io, std::move(work), [&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  while (!done && std::chrono::steady_clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(50));
  return done;
}

namespace {

/// The two model-stages each coordination type moves.
std::pair<std::string, std::string> pair_of(const std::string& type) {
  if (type == "sm-cs") return {"actor/generate", "actor/train"};     // same model, cross stage
  if (type == "cm-ss") return {"critic/infer", "reference/infer"};   // cross model, same stage
  if (type == "cm-cs") return {"critic/train", "actor/generate"};    // cross model, cross stage
  throw Error("--type must be sm-cs, cm-ss or cm-cs, got '" + type + "'");
}

class PlanDraw {
 public:
  explicit PlanDraw(std::uint64_t seed) : rng_(seed) {}
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  /// A random layout and DP degree for a model on `gpus` (in the order given).
  CollectionSpec spec(const ModelConfig& c, std::vector<DeviceId> gpus, std::int64_t batch) {
    std::vector<std::pair<Layout, int>> options;
    for (int tp : {1, 2, 4, 8})
      for (int pp : {1, 2}) {
        if (!valid_tp(c, tp) || pp > c.layers) continue;
        Layout l;
        l.tp = tp;
        l.pp = pp;
        for (int dp = 1; dp * l.size() <= static_cast<int>(gpus.size()); dp *= 2)
          if (batch % dp == 0) options.emplace_back(l, dp);
      }
    const auto [l, dp] = options[static_cast<std::size_t>(uniform(0, static_cast<int>(options.size()) - 1))];
    gpus.resize(static_cast<std::size_t>(l.size() * dp));
    return {l, dp, gpus};
  }
  std::vector<DeviceId> shuffled(std::vector<DeviceId> v) {
    std::shuffle(v.begin(), v.end(), rng_);
    return v;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

struct Trial {
  GlobalPlan from, to;
  std::uint64_t capacity = 0;
  bool uncoordinated = false;  ///< both migrate at once, each building all its new units first: fits
  bool ordered = false;        ///< one model-stage after the other (either first), each all at once: fits
};

/// Draws plans until the transition is feasible on some capacity; finds the smallest.
Trial draw_trial(const JobSpec& job, const CoordinationConfig& c, PlanDraw& draw) {
  const auto [first, second] = pair_of(c.type);
  const std::int64_t batch = job.prompts_per_step * job.samples_per_prompt;
  std::vector<DeviceId> pool(static_cast<std::size_t>(c.devices));
  std::iota(pool.begin(), pool.end(), 0);
  for (int attempt = 0;; ++attempt) {
    if (attempt > 1000) throw Error("could not draw a feasible " + c.type + " trial");
    Trial t;
    // The other model-stages spread evenly over the whole pool (co-resident, idle during
    // the transition); the two that move sit on disjoint GPU sets.
    const auto shuffled = draw.shuffled(pool);
    const int split = draw.uniform(1, c.devices - 1);
    const std::vector<DeviceId> left(shuffled.begin(), shuffled.begin() + split), right(shuffled.begin() + split, shuffled.end());
    for (const ModelStage& s : model_stages(job)) {
      std::vector<DeviceId> gpus = s.name() == first ? left : s.name() == second ? right : draw.shuffled(pool);
      CollectionSpec spec = draw.spec(s.model->config(), gpus, batch);
      for (int k = 0; s.name() != first && s.name() != second && spec.devices.size() < pool.size() && k < 20; ++k)
        spec = draw.spec(s.model->config(), gpus, batch);
      t.from.stages.emplace_back(s.name(), spec);
    }
    // The two model-stages swap GPUs (in half the trials, each may also take more of the
    // pool): neither can simply go first when the pool is full.
    t.to = t.from;
    const CollectionSpec a = *t.from.find(first), b = *t.from.find(second);
    const bool spread = draw.uniform(0, 1) == 1;
    for (const auto& change : {std::pair{first, b}, std::pair{second, a}}) {
      const auto& name = change.first;  // not a structured binding: the lambda below uses it
      const auto& other = change.second;
      std::vector<DeviceId> gpus = draw.shuffled(other.devices);
      for (DeviceId d : draw.shuffled(pool))
        if (spread && std::find(gpus.begin(), gpus.end(), d) == gpus.end() && draw.uniform(0, 2) == 0) gpus.push_back(d);
      const auto stages = model_stages(job);
      const auto st = std::find_if(stages.begin(), stages.end(), [&](const ModelStage& m) { return m.name() == name; });
      for (auto& entry : t.to.stages)
        if (entry.first == name) entry.second = draw.spec(st->model->config(), gpus, batch);
    }
    if (to_string(*t.to.find(first)) == to_string(a) && to_string(*t.to.find(second)) == to_string(b)) continue;
    TransitionRequest req;
    req.job = &job;
    req.from = plan_collections(job, t.from);
    req.to = plan_collections(job, t.to);
    req.links.gpus_per_node = c.devices;
    // Feasible with the lower-bound graph whichever generation stages turn out stale (that
    // depends on where in the step the transition begins).
    std::vector<bool> stale;
    for (const ModelStage& st : model_stages(job))
      stale.push_back(st.kind != StageKind::train && (st.role == "actor" || st.role == "critic"));
    auto feasible = [&](std::uint64_t cap, const std::vector<Collection>& from, const std::vector<Collection>& to) {
      TransitionRequest r = req;
      r.from = from;
      r.to = to;
      r.memory.capacity = cap;
      r.allow_memory_first = false;
      if (!compile_transition(r).feasibility.ok) return false;
      r.stale = stale;
      return compile_transition(r).feasibility.ok;
    };
    // The smallest capacity that admits it, to 0.5%: between what the busier plan needs
    // and everything at once.
    const TransitionGraph open = compile_transition(req);
    std::uint64_t need = 0, all = 0;
    for (const GpuMemory& m : open.memory) need = std::max({need, m.before, m.after}), all = std::max(all, m.before + m.after);
    std::uint64_t lo = need * 10 / 9, hi = all * 10 / 9 + 1;
    if (!feasible(hi, req.from, req.to)) continue;
    while (hi - lo > hi / 200) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (feasible(mid, req.from, req.to) ? hi : lo) = mid;
    }
    t.capacity = static_cast<std::uint64_t>(static_cast<double>(hi) * (1.0 + c.slack));
    // The per-component baseline: one model-stage migrates, building all its new units
    // before freeing its old ones, then the other; either order may go first.
    const TransitionGraph g = compile_transition([&] {
      TransitionRequest r = req;
      r.memory.capacity = t.capacity;
      return r;
    }());
    const auto stages = model_stages(job);
    std::map<const ModelSpec*, std::unique_ptr<UnitGeometry>> geometries;  // one per model, not per unit
    auto bytes_on = [&](std::size_t i, bool target, std::uint32_t u, std::map<DeviceId, std::int64_t>& m, int sign) {
      const Collection& col = target ? g.to[i] : g.from[i];
      const Emu& e = col.units[u];
      auto& slot = geometries[col.model.get()];
      if (!slot) slot = std::make_unique<UnitGeometry>(col.model);
      UnitGeometry& geo = *slot;
      for (int s = 0; s < e.layout.pp; ++s)
        for (int r = 0; r < e.layout.stage_size(); ++r)
          m[e.device(s, r)] += sign * static_cast<std::int64_t>(geo.held({&e.layout, s, r}).bytes(col.train));
    };
    const std::int64_t budget = static_cast<std::int64_t>(g.feasibility.budget);
    auto index_of = [&](const std::string& name) {
      return static_cast<std::size_t>(
          std::find_if(stages.begin(), stages.end(), [&](const ModelStage& m) { return m.name() == name; }) - stages.begin());
    };
    auto add_new = [&](std::size_t i, std::map<DeviceId, std::int64_t>& mem) {
      for (std::uint32_t u = 0; u < g.to[i].units.size(); ++u)
        if (g.kept[i][u] < 0) bytes_on(i, true, u, mem, +1);
    };
    auto drop_old = [&](std::size_t i, std::map<DeviceId, std::int64_t>& mem) {
      std::vector<bool> kept_old(g.from[i].units.size(), false);
      for (std::int32_t k : g.kept[i])
        if (k >= 0) kept_old[static_cast<std::size_t>(k)] = true;
      for (std::uint32_t j = 0; j < g.from[i].units.size(); ++j)
        if (!kept_old[j]) bytes_on(i, false, j, mem, -1);
    };
    auto within = [&](const std::map<DeviceId, std::int64_t>& mem) {
      return std::all_of(mem.begin(), mem.end(), [&](const auto& x) { return x.second <= budget; });
    };
    std::map<DeviceId, std::int64_t> before;
    for (const GpuMemory& m : g.memory) before[m.device] = static_cast<std::int64_t>(m.before);
    {
      auto mem = before;
      add_new(index_of(first), mem);
      add_new(index_of(second), mem);
      t.uncoordinated = within(mem);
    }
    for (const auto& order : {std::pair{first, second}, std::pair{second, first}}) {
      auto mem = before;
      add_new(index_of(order.first), mem);
      bool fits = within(mem);
      drop_old(index_of(order.first), mem);
      add_new(index_of(order.second), mem);
      t.ordered = t.ordered || (fits && within(mem));
    }
    return t;
  }
}

}  // namespace

int run_coordination_bench(const CoordinationConfig& c) {
  pair_of(c.type);  // validates --type
  if (c.trials < 1) throw Error("--trials must be positive");
  if (c.devices < 2) throw Error("--devices must be at least 2");
  const JobSpec job = load_job("ppo-tiny");
  PlanDraw draw(c.seed);
  int succeeded = 0, deadlocks = 0, verified = 0, uncoordinated = 0, ordered = 0, run = 0;
  std::uint64_t cap_violations = 0;
  std::vector<double> seconds;
  std::vector<std::string> failures;
  TraceEvents trace;
  for (int trial = 0; trial < c.trials; ++trial) {
    const Trial t = draw_trial(job, c, draw);
    uncoordinated += t.uncoordinated;
    ordered += t.ordered;
    ++run;
    asio::io_context io;
    LocalTransport local({1, 1 << 20});
    ChaosTransport chaos(local, {0.002, -1, c.seed * 1000003 + static_cast<std::uint64_t>(trial)});
    JobOptions o;
    o.devices = c.devices;
    o.capacity = t.capacity;
    o.fill = true;
    o.transport = &chaos;
    o.links.gpus_per_node = c.devices;
    o.executor.chunk_bytes = 1 << 20;
    o.avoid_busy = draw.uniform(0, 1) == 1;
    Job j(io.get_executor(), job, t.from, o);
    const int begin_at = draw.uniform(0, 7);
    std::mt19937_64 rng(draw.rng()());
    TransitionReport report;
    std::string error;
    std::exception_ptr failure;
    auto nap = [&rng](UnitContext&) -> asio::awaitable<void> {
      asio::steady_timer timer(co_await asio::this_coro::executor);
      timer.expires_after(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
      co_await timer.async_wait(asio::use_awaitable);
    };
    // The trial's picture: every stage run, the transition and its nodes on their devices.
    const bool traced = !c.perfetto.empty() && trial < 20;
    const int pid = trial + 1;
    if (traced) trace.process(pid, fmt::format("trial {}", trial));
    const auto t0 = std::chrono::steady_clock::now();
    double began = 0;
    auto since = [&t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    auto stage = [&](const std::string& name, int step) -> asio::awaitable<void> {
      const double start = since();
      co_await j.run_stage(name, nap);
      if (traced) trace.complete(pid, "stage " + name, fmt::format("{} (step {})", name, step), start, since() - start);
    };
    const bool finished = drive(io, [&]() -> asio::awaitable<void> {
      TransitionHandle h;
      int k = 0;
      for (const auto& phase : job.phases())
        for (const ModelStage& s : phase) {
          if (k++ == begin_at) began = since(), h = j.begin_transition(t.to);
          co_await stage(s.name(), 1);
        }
      if (!h.valid()) began = since(), h = j.begin_transition(t.to);
      co_await j.end_step();
      for (const auto& phase : job.phases())
        for (const ModelStage& s : phase) co_await stage(s.name(), 2);
      co_await j.end_step();
      report = co_await h.wait();
    }(), std::chrono::duration<double>(c.timeout_seconds), failure);
    if (traced && finished) {
      trace.complete(pid, "transition", "transition", began, report.seconds, {{"copied_bytes", report.copied_bytes}});
      for (const NodeRun& n : report.nodes)
        for (DeviceId d : n.devices)
          trace.complete(pid, "device " + std::to_string(d), std::string(to_string(n.kind)) + " " + n.unit, began + n.start,
                         n.end - n.start, {{"bytes", n.bytes}, {"unit", n.unit}});
    }
    if (!finished) {
      ++deadlocks;
      // A stuck trial cannot be torn down safely (its coroutines still hold the units):
      // report what we have and stop.
      failures.push_back(fmt::format("trial {}: still running after {} s", trial, c.timeout_seconds));
      break;
    }
    if (failure) {
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    cap_violations += j.cap_violations();
    const FillCheck v = j.verify();
    verified += v.ok;
    bool on_target = true;
    const GlobalPlan now = j.plan();
    for (const auto& [name, spec] : t.to.stages) on_target = on_target && to_string(*now.find(name)) == to_string(spec);
    const bool ok = error.empty() && report.completed && v.ok && on_target && j.cap_violations() == 0;
    if (ok) {
      ++succeeded;
      seconds.push_back(report.seconds);
    } else if (failures.size() < 5) {
      failures.push_back(fmt::format("trial {}: {}", trial,
                                     !error.empty() ? error : !report.completed ? report.error
                                                          : !v.ok               ? v.first_error
                                                                                : std::string("not on the new plan")));
    }
  }
  if (!c.perfetto.empty()) {
    std::ofstream file(c.perfetto);
    file << trace.dump();
    if (!file) throw Error("--perfetto: cannot write '" + c.perfetto + "'");
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds.empty() ? 0 : seconds[seconds.size() / 2];
  nlohmann::json out = {{"type", c.type},
                        {"trials", c.trials},
                        {"run", run},
                        {"succeeded", succeeded},
                        {"deadlocks", deadlocks},
                        {"cap_violations", cap_violations},
                        {"verified", verified},
                        {"seconds_median", median},
                        {"uncoordinated_fits", uncoordinated},
                        {"one_after_other_fits", ordered},
                        {"devices", c.devices},
                        {"slack", c.slack},
                        {"failures", failures}};
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::cout << fmt::format("{}: {} of {} trials reached the new plan; {} deadlocks, {} cap violations, {} verified\n",
                             c.type, succeeded, c.trials, deadlocks, cap_violations, verified);
    std::cout << fmt::format("transition time median {:.4f} s\n", median);
    std::cout << fmt::format("per-component baselines at the same capacity: both at once fit in {} of {}, one after the other "
                             "in {} of {}\n", uncoordinated, run, ordered, run);
    for (const auto& f : failures) std::cout << "  " << f << "\n";
  }
  if (deadlocks > 0) {
    std::cout.flush();
    std::_Exit(1);
  }
  return succeeded == c.trials ? 0 : 1;
}

}  // namespace nereus::bench
