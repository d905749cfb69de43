// An async job's two streams across daemons (job_life.hpp; docs/cluster.md, "Async jobs
// across nodes"): generation steps on the generation units beside the training stream,
// versioned weight updates built into fresh units and switched in at a generation step's
// boundary, and plan changes and recoveries that drain generation first.
#include "job_life.hpp"

namespace nereus::cluster::detail {

using json = nlohmann::json;

asio::awaitable<void> JobLife::wait_until(std::function<bool()> ready) {
  while (!ready()) co_await d_.changed().wait();
}

asio::awaitable<void> JobLife::generation_idle() {
  while (gen_running_) co_await d_.changed().wait();
}

asio::awaitable<void> JobLife::run_async(long n, const std::optional<GlobalPlan>& forced) {
  AsyncScope scope(d_.executor());
  scope.spawn(generation_stream(n));
  std::exception_ptr failed;
  try {
    co_await training_stream(n, forced);
  } catch (...) {
    failed = std::current_exception();
  }
  gen_stop_ = true;
  d_.changed().notify();
  co_await scope.join();
  if (!failed && !gen_error_ && staged_) co_await switch_staged();  // the last version, for the check
  if (staged_) co_await drop_staged("the job stopped");
  if (failed) std::rethrow_exception(failed);
  if (gen_error_) std::rethrow_exception(gen_error_);
}

asio::awaitable<void> JobLife::generation_stream(long n) {
  const std::int64_t s = d_.job().max_staleness;
  for (long j = 1; j <= n; ++j) {
    // std::function rather than a lambda's own type: coroutine frames keep these, and
    // JobLife is shared by two sources (a lambda's type has no linkage).
    const std::function<bool()> may_start = [&] { return gen_stop_ || (hold_ == 0 && !lost_pending() && gen_version_ >= j - 1 - s); };
    while (!may_start()) {
      if (hold_ == 0 && !lost_pending() && !waiting_version_) {  // standing still for the next version only
        waiting_version_ = true;
        waiting_since_ = clock::now();
      }
      co_await d_.changed().wait();
    }
    waiting_version_ = false;
    if (gen_stop_) break;
    const std::int64_t v = gen_version_;
    const std::size_t lost_before = d_.lost().size();
    const auto t0 = clock::now();
    gen_running_ = true;
    std::vector<std::pair<int, StepDone>> reports;
    try {
      reports = co_await d_.step(j, length_at(j, n, first_len_, last_len_), StepStream::generation, v);
    } catch (...) {
      gen_error_ = std::current_exception();
    }
    gen_running_ = false;
    if (gen_error_) {
      gen_stop_ = true;
      d_.changed().notify();
      co_return;
    }
    json nodes = json::array();
    for (const auto& r : reports) nodes.push_back(r.first);
    json e{{"weight_version", v}, {"staleness", (j - 1) - v}, {"nodes", nodes},
           {"seconds", std::chrono::duration<double>(clock::now() - t0).count()}};
    if (d_.lost().size() != lost_before) e["lost_node"] = true;  // it calibrates nothing
    generated_[j] = {std::move(reports), std::move(e)};
    if (staged_ && hold_ == 0 && !lost_pending()) {
      try {
        co_await switch_staged();
      } catch (...) {
        gen_error_ = std::current_exception();
        gen_stop_ = true;
      }
    }
    d_.changed().notify();
  }
}

asio::awaitable<void> JobLife::training_stream(long n, const std::optional<GlobalPlan>& forced) {
  for (long k = 1; k <= n; ++k) {
    const double len = length_at(k, n, first_len_, last_len_);
    json step{{"step", k}, {"response_len", len}};
    // Step k's rollouts: generation step k answered (recovering from losses meanwhile).
    for (;;) {
      const std::function<bool()> rollouts = [&] { return generated_.count(k) || lost_pending() || gen_stop_; };
      co_await wait_until(rollouts);
      if (lost_pending()) {
        co_await recover_async(k, len);
        continue;
      }
      if (!generated_.count(k)) co_return;  // the generation stream stopped: run_async rethrows its error
      break;
    }
    auto [gen_reports, gen_entry] = std::move(generated_.at(k));
    generated_.erase(k);
    step["weight_version"] = gen_entry["weight_version"];
    step["staleness"] = gen_entry["staleness"];
    bool failed = gen_entry.contains("lost_node");
    step["generation"] = std::move(gen_entry);
    const GlobalPlan ran_on = d_.plan_of(pool_);
    const std::size_t lost_before = d_.lost().size();
    begin("step " + std::to_string(k) + " training", "idle");
    const auto t0 = clock::now();
    std::vector<std::pair<int, StepDone>> reports = co_await d_.step(k, len, StepStream::training, k - 1);
    end();
    json nodes = json::array();
    for (const auto& r : reports) nodes.push_back(r.first);
    step["training"] = {{"nodes", nodes}, {"seconds", std::chrono::duration<double>(clock::now() - t0).count()}};
    failed = failed || d_.lost().size() != lost_before;
    for (auto& r : reports) gen_reports.push_back(std::move(r));
    std::optional<StepObservation> seen = observation(gen_reports, k, len, step);
    trained_ = k;
    if (!lost_pending()) {
      // Weight sync in place for the training stream's own inference stages, then the
      // update of version k into fresh generation units beside generation.
      const std::function<bool(std::size_t, std::size_t)> rest = [&](std::size_t, std::size_t m) { return d_.stages()[m].kind != StageKind::generate; };
      step["weight_sync"] = co_await sync_in_place(rest, k, len);
      co_await build_update(k);
    }
    if (lost_pending()) co_await recover_async(k, len);
    failed = failed || d_.lost().size() != lost_before;
    if (failed) seen.reset();  // a step with a lost node calibrates nothing
    const Signals now = seen ? seen->next : signals(k, len);
    const GlobalPlan current = d_.plan_of(pool_);
    std::optional<GlobalPlan> target;
    if (forced && on_pool(*forced)) {
      target = pool_.to_indices(*forced);
      if (plan_json(*target) == plan_json(current)) target.reset();
    } else {
      if (seen) ctl_.observe(ran_on, *seen);
      const Decision dec = ctl_.decide(now, current);
      step["decision"] = decision_json(dec);
      if (dec.blocked) throw Error("controller: " + dec.why);
      if (dec.admitted) target = dec.target;
    }
    if (target && k < n) {
      step["target_plan"] = plan_json(pool_.to_devices(*target));
      co_await drain();
      begin("transition", "transition");
      json t = co_await transition(current, *target, now, "transition");
      end();
      t["drained"] = true;
      t["weight_sync"] = co_await resync_generation(k, len);  // the graph may have built them from older units
      step["transition"] = std::move(t);
      release();
    }
    steps_.push_back(std::move(step));
  }
}

asio::awaitable<void> JobLife::build_update(long k) {
  if (staged_) {  // the last one not switched yet (never with these streams; kept safe)
    co_await generation_idle();
    co_await switch_staged();
  }
  const auto t0 = clock::now();
  Staged st;
  st.version = k;
  std::uint64_t moved = 0;
  std::string error;
  begin("update " + std::to_string(k), "update");
  try {
    const std::vector<ModelStage>& stages = d_.stages();
    for (std::size_t t = 0; t < stages.size(); ++t) {
      if (stages[t].kind != StageKind::train) continue;
      const std::vector<std::vector<std::uint32_t>> from{d_.current()[t]};
      for (std::size_t m = 0; m < stages.size(); ++m) {
        if (stages[m].kind != StageKind::generate || stages[m].role != stages[t].role) continue;
        st.units.push_back({m, {}});
        const std::vector<std::uint32_t> old = d_.current()[m];
        for (std::uint32_t id : old) {
          const std::uint32_t fresh = d_.add_unit(m, d_.emu_of(id));
          st.units.back().second.push_back(fresh);
          co_await d_.allocate(fresh, false);
          const std::vector<RunDone> runs = co_await d_.build(fresh, from);
          for (const RunDone& r : runs) moved += r.link_bytes + r.local_bytes;
        }
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  end();
  json u{{"version", k}, {"seconds", std::chrono::duration<double>(clock::now() - t0).count()}, {"moved_bytes", moved},
         {"paused_seconds", 0.0}, {"switched", false}, {"units", json::array()}};
  for (const auto& unit : st.units)
    for (std::uint32_t id : unit.second) u["units"].push_back(id);
  updates_.push_back(u);
  st.entry = updates_.size() - 1;
  staged_ = std::move(st);
  if (!error.empty()) {
    if (!lost_pending()) throw Error("weight update " + std::to_string(k) + ": " + error);
    co_await drop_staged("a node was lost during it: " + error);
    co_return;
  }
  if (staged_->units.empty()) {  // no generation stage of a trained model
    updates_.erase(updates_.size() - 1);
    staged_.reset();
    co_return;
  }
  if (!gen_running_ && hold_ == 0) co_await switch_staged();
}

asio::awaitable<void> JobLife::switch_staged() {
  Staged st = std::move(*staged_);
  staged_.reset();
  std::vector<std::uint32_t> old;
  for (auto& [m, ids] : st.units) {
    for (std::uint32_t id : d_.current()[m]) old.push_back(id);
    d_.current()[m] = ids;
  }
  gen_version_ = st.version;
  json& u = updates_[st.entry];
  u["switched"] = true;
  if (waiting_version_) u["paused_seconds"] = std::chrono::duration<double>(clock::now() - waiting_since_).count();
  d_.changed().notify();  // generation may start on the new version
  for (std::uint32_t id : old) {
    try {
      co_await d_.release(id);
    } catch (const std::exception&) {
      if (!lost_pending()) throw;
    }
  }
}

asio::awaitable<void> JobLife::drop_staged(const std::string& why) {
  Staged st = std::move(*staged_);
  staged_.reset();
  updates_[st.entry]["dropped"] = why;
  for (const auto& unit : st.units)
    for (std::uint32_t id : unit.second) {
      try {
        co_await d_.release(id);
      } catch (const std::exception&) {  // on a lost node, or never allocated
      }
    }
}

asio::awaitable<void> JobLife::drain() {
  ++hold_;
  co_await generation_idle();
  if (staged_ && !lost_pending()) co_await switch_staged();
}
void JobLife::release() {
  --hold_;
  d_.changed().notify();
}

asio::awaitable<nlohmann::json> JobLife::resync_generation(long k, double len) {
  const std::function<bool(std::size_t, std::size_t)> generation = [&](std::size_t, std::size_t m) { return d_.stages()[m].kind == StageKind::generate; };
  json out = co_await sync_in_place(generation, k, len);
  gen_version_ = trained_;
  out["version"] = trained_;
  co_return out;
}

asio::awaitable<void> JobLife::recover_async(long k, double len) {
  ++hold_;
  co_await generation_idle();
  if (staged_) co_await drop_staged("a node was lost before it switched in");
  json versions = json::object();
  for (std::size_t m = 0; m < d_.stages().size(); ++m)
    if (d_.stages()[m].kind == StageKind::generate)
      for (std::uint32_t id : d_.current()[m])
        if (d_.intact(id)) versions[std::to_string(id)] = gen_version_;
  const std::size_t before = failures_.size();
  co_await recover(k, len);
  if (failures_.size() > before) failures_[before]["generation_versions"] = versions;
  json sync = co_await resync_generation(k, len);
  if (failures_.size() > before) failures_.back()["weight_sync"] = std::move(sync);
  release();
}

}  // namespace nereus::cluster::detail
