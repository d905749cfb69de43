#pragma once
// What a job across daemons does next (job_service.hpp): connect, load, the steps (the
// controller decides, a transition runs when it admits one), the check; after every phase,
// a recovery from each node lost during it. The JobDriver (job_graph_run.hpp) talks to the
// nodes. A sync job's steps are here; an async job's two streams are job_async.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "job_graph_run.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/cluster/job_service.hpp"
#include "nereus/control/controller.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/runtime/async_scope.hpp"

namespace nereus::cluster::detail {

using json = nlohmann::json;

inline json plan_json(const GlobalPlan& p) {
  json out = json::object();
  for (const auto& [name, spec] : p.stages) out[name] = to_string(spec);
  return out;
}

inline json decision_json(const Decision& d) {
  auto finite = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  return {{"trigger", d.trigger},  {"urgent", d.urgent}, {"admitted", d.admitted}, {"blocked", d.blocked}, {"why", d.why},
          {"refused", d.refused},
          {"current_seconds", finite(d.current_seconds)}, {"target_seconds", finite(d.target_seconds)},
          {"transition_seconds", d.transition_seconds}, {"moved_bytes", d.moved_bytes}, {"decision_ms", d.decision_ms}};
}

inline Pool pool_of(const std::vector<int>& ranks, int per) {
  Pool p;
  for (int r : ranks)
    for (int i = 0; i < per; ++i) p.devices.push_back(static_cast<DeviceId>(r * per + i));
  return p;
}

/// The mean response length at step k of n: geometric from the first plan's to the last.
inline double length_at(long k, long n, double first, double last) {
  return first * std::pow(last / first, static_cast<double>(k) / static_cast<double>(n));
}

class JobLife {
 public:
  JobLife(JobDriver& d, Controller& ctl, const JobRequest& r, int per, Pool pool, double first_len, double last_len,
          detail::JobTimeline* timeline, std::function<std::vector<NodeAddress>()> roster, json& out)
      : d_(d), ctl_(ctl), r_(r), per_(per), pool_(std::move(pool)), first_len_(first_len), last_len_(last_len),
        timeline_(timeline), roster_(std::move(roster)), out_(out) {}

  asio::awaitable<void> run(const std::vector<NodeAddress>& nodes, const GlobalPlan& initial, const std::optional<GlobalPlan>& forced) {
    begin("connect", "connect");
    co_await d_.connect(nodes);
    end();
    begin("load", "load");
    co_await d_.load(initial, pool_);  // nodes lost while connecting: their units never load
    end();
    co_await recover(0, first_len_);
    const long n = std::max<long>(1, r_.steps);
    if (d_.job().async) {
      co_await run_async(n, forced);
      out_["plan"] = plan_json(pool_.to_devices(d_.plan_of(pool_)));
      if (r_.verify) co_await check(n, last_len_);
      co_return;
    }
    for (long k = 1; k <= n; ++k) {
      const double len = length_at(k, n, first_len_, last_len_);
      json step{{"step", k}, {"response_len", len}};
      std::optional<StepObservation> seen;  // what the nodes' frameworks measured
      const std::size_t lost_before = d_.lost().size();
      const GlobalPlan ran_on = d_.plan_of(pool_);  // the units this step computes on
      if (r_.node_steps) {
        begin("step " + std::to_string(k), "idle");
        std::vector<std::pair<int, StepDone>> reports;  // GCC 12: no co_await inside ?:
        if (beside_)
          reports = co_await step_beside(k, len);
        else
          reports = co_await d_.step(k, len);
        end();
        seen = observation(reports, k, len, step);
        co_await recover(k, len);
        if (seen) step["weight_sync"] = co_await sync_weights(*seen, k, len);
      } else if (r_.step_seconds > 0) {
        begin("step " + std::to_string(k), "idle");
        co_await wait_or_loss(r_.step_seconds);
        end();
        co_await recover(k, len);
      }
      co_await rejoin(step);
      co_await recover(k, len);
      if (d_.lost().size() != lost_before) seen.reset();  // a failed step calibrates nothing; the plan changed
      if (seen) seen->next.gpus = static_cast<int>(pool_.devices.size());  // nodes may have joined
      const Signals now = seen ? seen->next : signals(k, len);
      const GlobalPlan current = d_.plan_of(pool_);
      // The plan the request names (global device ids) holds from step 1 on; the controller
      // decides only without one, or once a lost node took some of its devices.
      std::optional<GlobalPlan> target;
      if (forced && on_pool(*forced)) {
        target = pool_.to_indices(*forced);
        if (plan_json(*target) == plan_json(current)) target.reset();  // there already
      } else {
        if (seen) ctl_.observe(ran_on, *seen);  // a transition beside the step changed the plan since
        const Decision dec = ctl_.decide(now, current);
        step["decision"] = decision_json(dec);
        if (dec.blocked) throw Error("controller: " + dec.why);
        if (dec.admitted) target = dec.target;
      }
      if (target) {
        step["target_plan"] = plan_json(pool_.to_devices(*target));
        if (r_.overlap && r_.node_steps && k < n) {
          beside_ = Beside{current, *target, now, steps_.size()};
          step["transition"] = {{"overlapped", true}, {"pending", true}};  // replaced once it ran beside step k + 1
        } else {
          begin("transition", "transition");
          step["transition"] = co_await transition(current, *target, now, "transition");
          end();
        }
      }
      steps_.push_back(std::move(step));
      co_await recover(k, len);
      if (beside_ && plan_json(d_.plan_of(pool_)) != plan_json(beside_->from)) {  // a recovery changed the plan
        steps_[beside_->index]["transition"] = {{"overlapped", true}, {"dropped", "a node was lost before it began"}};
        beside_.reset();
      }
    }
    out_["plan"] = plan_json(pool_.to_devices(d_.plan_of(pool_)));
    if (r_.verify) co_await check(n, last_len_);
  }

  /// What the report keeps of the steps and failures, also when the job stopped early.
  void report() {
    out_["steps"] = steps_;
    if (d_.job().async) {
      out_["mode"] = "async";
      out_["max_staleness"] = d_.job().max_staleness;
      out_["weight_updates"] = updates_;
    }
    if (!failures_.empty()) out_["failures"] = failures_;
  }

 private:
  bool on_pool(const GlobalPlan& p) const {
    for (const auto& [name, spec] : p.stages)
      for (DeviceId d : spec.devices)
        if (std::find(pool_.devices.begin(), pool_.devices.end(), d) == pool_.devices.end()) return false;
    return true;
  }

  Signals signals(long step, double len) const { return {step, static_cast<int>(pool_.devices.size()), len, len, 1}; }

  /// The step as the nodes' frameworks measured it: each model-stage's time is its slowest
  /// node's (a stage ends when its last replica does), the response length the mean of the
  /// nodes that measured one (then it is the signal the decision sees), the peak the
  /// busiest node's. None when no node measured anything (daemons without a framework).
  /// Throws Error naming the node of a report that is not of this job.
  std::optional<StepObservation> observation(const std::vector<std::pair<int, StepDone>>& reports, long k, double len, json& step) const {
    std::map<std::string, double> slowest;
    double len_sum = 0, p95 = 0;
    int lens = 0;
    std::uint64_t peak = 0;
    json nodes = json::array();
    for (const auto& [rank, d] : reports) {
      const std::string who = "node " + std::to_string(rank);
      for (const auto& measured : d.stage_seconds) {
        const std::string& stage = measured.first;  // not a structured binding: the lambda below uses it
        const double seconds = measured.second;
        const auto& stages = d_.stages();
        if (std::none_of(stages.begin(), stages.end(), [&](const ModelStage& m) { return m.name() == stage; }))
          throw Error(who + " reported a time for '" + stage + "', which is not a model-stage of the job");
        if (!(seconds >= 0 && std::isfinite(seconds)))
          throw Error(who + " reported " + std::to_string(seconds) + " s for '" + stage + "'");
        slowest[stage] = std::max(slowest[stage], seconds);
      }
      if (!(d.response_len_mean >= 0 && std::isfinite(d.response_len_mean) && d.response_len_p95 >= 0 && std::isfinite(d.response_len_p95)))
        throw Error(who + " reported a response length that is not a length");
      if (d.response_len_mean > 0) {
        len_sum += d.response_len_mean;
        ++lens;
      }
      p95 = std::max({p95, d.response_len_p95, d.response_len_mean});
      peak = std::max(peak, d.peak_bytes);
      if (std::find(nodes.begin(), nodes.end(), rank) == nodes.end()) nodes.push_back(rank);  // async: both streams' reports
    }
    if (slowest.empty() && lens == 0) return std::nullopt;
    StepObservation o;
    o.next = signals(k, len);
    if (lens > 0) o.next.response_len_mean = o.next.response_len_p95 = len_sum / lens;
    if (p95 > 0) o.next.response_len_p95 = p95;
    o.stage_seconds.assign(slowest.begin(), slowest.end());
    o.response_len_mean = o.next.response_len_mean;
    o.response_len_p95 = o.next.response_len_p95;
    o.peak_bytes = peak;
    step["measured"] = {{"nodes", nodes}, {"stage_seconds", slowest}, {"response_len_mean", o.response_len_mean},
                        {"response_len_p95", o.response_len_p95}, {"peak_bytes", peak}};
    return o;
  }

  /// A phase of the job: `name` on the timeline; `kind` is what a failure during it says
  /// (connect, load, idle (no graph runs: the stages' work), sync, update, transition, recovery, verify).
  void begin(const std::string& name, const char* kind) {
    log(LogLevel::debug, "job", "{} begins ({})", name, kind);
    phase_ = name;
    kind_ = kind;
    phase_start_ = clock::now();
    phase_end_ = clock::time_point::max();
    if (timeline_) phase_at_ = timeline_->now();
  }
  void end() {
    log(LogLevel::debug, "job", "{} ends", phase_);
    phase_end_ = clock::now();
    if (timeline_) timeline_->phase(phase_, phase_at_, timeline_->now());
  }

  /// A transition admitted after a step, to run beside the next one (`--overlap`).
  struct Beside {
    GlobalPlan from, to;
    Signals signals;
    std::size_t index;  // the admitting step's entry in steps_
  };
  struct Ran {
    json report;
    std::exception_ptr error;
    clock::time_point end;
  };
  /// Step k with the transition admitted after step k − 1 running beside it (`--overlap`):
  /// the frameworks compute on the old units while the graph builds what reads no training
  /// state; the rest of the graph runs once every node answered. The transition's report
  /// goes to step k − 1's entry, with how much of it outlasted the step (`exposed_seconds`).
  asio::awaitable<std::vector<std::pair<int, StepDone>>> step_beside(long k, double len) {
    const Beside b = std::move(*beside_);
    beside_.reset();
    Ran graph;
    AsyncScope scope(d_.executor());
    d_.set_stepping(true);
    scope.spawn(run_beside(b, &graph));
    std::vector<std::pair<int, StepDone>> reports;
    std::exception_ptr failed;
    try {
      reports = co_await d_.step(k, len);
    } catch (...) {
      failed = std::current_exception();
    }
    const auto step_end = clock::now();
    d_.set_stepping(false);
    co_await scope.join();
    json& t = steps_[b.index]["transition"];
    t = graph.report;
    t["overlapped"] = true;
    t["beside_step"] = k;
    const double after = std::chrono::duration<double>(graph.end - step_end).count();  // the graph's time past the step
    t["exposed_seconds"] = std::max(0.0, after);
    if (t.contains("seconds")) t["step_end"] = t["seconds"].get<double>() - after;  // on the graph nodes' clock
    if (failed) std::rethrow_exception(failed);
    if (graph.error) std::rethrow_exception(graph.error);
    co_return reports;
  }

  asio::awaitable<void> run_beside(Beside b, Ran* out) {
    try {
      out->report = co_await transition(b.from, b.to, b.signals, "transition");
    } catch (...) {
      out->error = std::current_exception();
    }
    out->end = clock::now();
  }

  asio::awaitable<json> transition(const GlobalPlan& from, const GlobalPlan& to, const Signals& s, const char* what) {
    const TransitionGraph g = ctl_.transition(from, to, s);
    if (!g.feasibility.ok) throw Error(std::string("the ") + what + " does not fit device memory: " + g.feasibility.reason);
    co_return co_await detail::run_graph(d_, g, pool_);
  }

  /// Weight sync after a step the frameworks ran, as the embedded job's end_step: each
  /// generation and inference stage of a model whose training stage reported a time (it
  /// trained) gets the training units' params, unit by unit (a build from them, param
  /// slot only). A node lost meanwhile is recovered from, then the sync runs again over
  /// what is left; any other failure ends the job.
  asio::awaitable<json> sync_weights(const StepObservation& o, long k, double len) {
    const auto trained = [&](std::size_t t, std::size_t) {
      const std::string stage = d_.stages()[t].name();
      return std::any_of(o.stage_seconds.begin(), o.stage_seconds.end(), [&](const auto& x) { return x.first == stage; });
    };
    co_return co_await sync_in_place(trained, k, len);
  }

  /// Rebuilds in place each unit of model-stage m from training stage t of its model where
  /// `pick(t, m)`; recovers from a node lost meanwhile and runs again over what is left.
  asio::awaitable<json> sync_in_place(std::function<bool(std::size_t, std::size_t)> pick, long k, double len) {
    for (;;) {
      const std::size_t lost = d_.lost().size();
      begin("weight sync", "sync");
      const auto t0 = clock::now();
      std::uint64_t builds = 0, between = 0, inside = 0;
      std::string error;
      try {
        const std::vector<ModelStage>& st = d_.stages();
        for (std::size_t t = 0; t < st.size(); ++t) {
          if (st[t].kind != StageKind::train) continue;
          const std::vector<std::vector<std::uint32_t>> from{d_.current()[t]};
          for (std::size_t m = 0; m < st.size(); ++m) {
            if (m == t || st[m].role != st[t].role || !pick(t, m)) continue;
            const std::vector<std::uint32_t> targets = d_.current()[m];
            for (std::uint32_t id : targets) {
              const std::vector<RunDone> runs = co_await d_.build(id, from);
              for (const RunDone& r : runs) {
                between += r.link_bytes;
                inside += r.local_bytes;
              }
              ++builds;
            }
          }
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      end();
      if (error.empty())
        co_return json{{"builds", builds}, {"link_bytes", between}, {"local_bytes", inside},
                       {"seconds", std::chrono::duration<double>(clock::now() - t0).count()}};
      if (d_.lost().size() == lost) throw Error("weight sync: " + error);
      if (d_.job().async)
        co_await recover_async(k, len);  // generation drains first: it may be running beside this sync
      else
        co_await recover(k, len);
    }
  }

  /// Nodes alive again (restarted after a loss) join the job; the next decision sees their
  /// devices in the pool. A node that cannot join now is tried again next step.
  asio::awaitable<void> rejoin(json& step) {
    if (!roster_) co_return;
    json joined = json::array();
    for (const NodeAddress& n : roster_()) {
      if (d_.in_job(n.rank)) continue;
      begin("join", "join");
      bool in = false;
      try {
        in = co_await d_.admit(n);
      } catch (const std::exception& e) {
        step["join_errors"][std::to_string(n.rank)] = e.what();
      }
      end();
      if (!in) continue;
      handled_.erase(n.rank);  // lost again later: recovered from again
      if (timeline_) timeline_->rejoined(n);
      joined.push_back(n.rank);
    }
    if (joined.empty()) co_return;
    step["joined_nodes"] = joined;
    pool_ = pool_of(d_.alive(), per_);
  }

  /// Waits `seconds` (the stages' work, which daemon jobs do not run), less if a node is lost.
  asio::awaitable<void> wait_or_loss(double seconds) {
    asio::steady_timer t(d_.executor());
    const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
    while (clock::now() < until && d_.lost().size() == handled_.size()) {
      t.expires_after(std::min<clock::duration>(until - clock::now(), std::chrono::milliseconds(20)));
      co_await t.async_wait(asio::use_awaitable);
    }
  }

  /// From every node lost since the last recovery: each model-stage keeps its intact units,
  /// one left with none is rebuilt from a model-stage that holds its state, or the job
  /// stops with an error naming the state whose only copies were on lost nodes;
  /// then the controller decides on the survivors' devices (the pool trigger) and a
  /// transition it admits runs. Again while nodes are lost during it.
  asio::awaitable<void> recover(long step, double len) {
    while (d_.lost().size() > handled_.size()) {
      std::vector<int> fresh;
      for (int rank : d_.lost())
        if (handled_.insert(rank).second) fresh.push_back(rank);
      co_await d_.drop_lost_units();  // a graph's run already did; a loss outside one did not
      const Pool survivors = pool_of(d_.alive(), per_);
      // The phase it was lost in: the last one begun, or none (idle) when that had ended.
      clock::time_point at = clock::time_point::max();
      for (int rank : fresh) at = std::min(at, d_.lost_at(rank));
      const bool during = at <= phase_end_;
      json why = json::object();
      for (int rank : fresh) why[std::to_string(rank)] = d_.lost_why(rank);
      const double detected = std::chrono::duration<double>(at - (during ? phase_start_ : phase_end_)).count();
      const auto wall = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(clock::now() - at);
      json f{{"phase", during ? kind_ : "idle"},
             {"step", step},
             {"lost_nodes", fresh},
             {"why", why},
             {"detected_seconds", std::max(0.0, detected)},
             {"noticed_at", std::chrono::duration<double>(wall.time_since_epoch()).count()}};
      failures_.push_back(f);
      json rebuilt;
      try {
        rebuilt = co_await d_.rebuild_lost_stages();
      } catch (const std::exception&) {
        if (d_.lost().size() > handled_.size()) continue;  // another node lost meanwhile: start over
        throw;
      }
      json& rec = failures_.back();
      if (!rebuilt.empty()) rec["rebuilt"] = rebuilt;
      const GlobalPlan intact = d_.plan_of(survivors);
      rec["intact_plan"] = plan_json(survivors.to_devices(intact));
      pool_ = survivors;
      const Signals now = signals(step, len);
      const Decision dec = ctl_.decide(now, intact);
      rec["decision"] = decision_json(dec);
      if (dec.blocked) throw Error("recovery: controller: " + dec.why);
      if (dec.admitted) {
        rec["target_plan"] = plan_json(survivors.to_devices(dec.target));
        begin("recovery", "recovery");
        rec["transition"] = co_await transition(intact, dec.target, now, "recovery");
        end();
      }
      rec["recovery_seconds"] = std::chrono::duration<double>(clock::now() - at).count();
    }
  }

  /// Every unit against the fill; a node lost meanwhile is recovered from and the check
  /// runs again on what is left.
  asio::awaitable<void> check(long step, double len) {
    for (;;) {
      begin("verify", "verify");
      std::optional<json> got;
      try {
        got = co_await d_.verify();
      } catch (const std::exception&) {
        if (d_.lost().size() == handled_.size()) throw;
      }
      end();
      if (got && d_.lost().size() == handled_.size()) {
        out_.update(*got);
        co_return;
      }
      co_await recover(step, len);
      out_["plan"] = plan_json(pool_.to_devices(d_.plan_of(pool_)));
    }
  }

  // ---- Async jobs (job_async.cpp; docs/cluster.md, "Async jobs across nodes") ----
  // Two streams on one event loop: generation steps on the generation units, and the
  // training stream (the other phases, then the versioned update into fresh generation
  // units). A stream's step goes to the nodes holding its units; an update switches in at
  // a generation step's boundary, all units of a model-stage at once, so no step ever sees
  // two versions. Plan changes and recoveries drain generation first.

  /// A weight update built into fresh units, not yet switched in.
  struct Staged {
    std::int64_t version = 0;
    std::vector<std::pair<std::size_t, std::vector<std::uint32_t>>> units;  // generation stage → its new units
    std::size_t entry = 0;  // in updates_
  };
  bool lost_pending() const { return d_.lost().size() > handled_.size(); }
  asio::awaitable<void> wait_until(std::function<bool()> ready);
  asio::awaitable<void> generation_idle();  ///< until no generation step runs
  asio::awaitable<void> run_async(long n, const std::optional<GlobalPlan>& forced);
  /// Generation step j starts once its weights are at most max_staleness versions behind
  /// step j − 1's (the trainer's at the time), and never while the training stream drains
  /// it (a plan change, a recovery).
  asio::awaitable<void> generation_stream(long n);
  asio::awaitable<void> training_stream(long n, const std::optional<GlobalPlan>& forced);
  /// Builds version k of every generation model-stage of a trained model into fresh units
  /// on the current units' GPUs (the planner counts a generation GPU's next version), and
  /// switches them in now if no generation step runs, else at that step's end. A node lost
  /// meanwhile drops what was built: the generation units stay on their whole version.
  asio::awaitable<void> build_update(long k);
  /// The staged version becomes the generation units' (the old units are freed).
  asio::awaitable<void> switch_staged();
  /// Frees the units of an update that will not switch in.
  asio::awaitable<void> drop_staged(const std::string& why);
  /// Stops generation from starting steps and waits for the one running; an update staged
  /// meanwhile switches in. release() lets generation go on (drains nest: a recovery may
  /// run inside another's weight sync).
  asio::awaitable<void> drain();
  void release();
  /// Every generation unit rebuilt in place from the trainer's units: version trained_.
  asio::awaitable<nlohmann::json> resync_generation(long k, double len);
  /// A node lost: generation drains, an update in flight is dropped (each surviving
  /// generation unit keeps its whole version, recorded in the failure), the job recovers
  /// as a sync job does, and generation resumes on the trainer's version.
  asio::awaitable<void> recover_async(long k, double len);

  JobDriver& d_;
  Controller& ctl_;
  const JobRequest& r_;
  int per_;
  Pool pool_;
  double first_len_, last_len_;
  detail::JobTimeline* timeline_;
  std::function<std::vector<NodeAddress>()> roster_;
  json& out_;
  json steps_ = json::array();
  std::optional<Beside> beside_;
  json failures_ = json::array();
  std::set<int> handled_;  // lost nodes already recovered from
  std::string phase_;
  const char* kind_ = "connect";
  clock::time_point phase_start_{}, phase_end_ = clock::time_point::max();
  double phase_at_ = 0;
  // Async jobs: the streams' state, on the job's event loop.
  std::int64_t gen_version_ = 0;  // the version the current generation units hold
  long trained_ = 0;              // training steps done: the trainer's units hold version trained_
  std::map<long, std::pair<std::vector<std::pair<int, StepDone>>, json>> generated_;  // generation steps answered, not yet trained on
  bool gen_running_ = false, gen_stop_ = false;
  int hold_ = 0;  // drains in progress (a recovery may run inside another's weight sync)
  bool waiting_version_ = false;  // generation stands still for the next version only, since waiting_since_
  clock::time_point waiting_since_{};
  std::exception_ptr gen_error_;
  std::optional<Staged> staged_;
  json updates_ = json::array();
};

}  // namespace nereus::cluster::detail
