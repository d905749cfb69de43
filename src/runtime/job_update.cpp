// Asynchronous jobs: in-flight weight updates into generation stages (weight_update.hpp),
// and the bound on how stale generation's params may be (JobSpec::max_staleness).
#include <algorithm>
#include <limits>

#include "job_state.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/packing.hpp"

namespace nereus {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// A buffer's shape as an engine allocates it: its parts stacked by rows.
std::vector<std::int64_t> buffer_shape(const BufferSpec& b) {
  const Box& first = b.parts.front().shard;
  std::int64_t elements = 0, row = 1;
  for (const BufferSpec::Part& p : b.parts) elements += p.shard.elements();
  std::vector<std::int64_t> shape;
  for (int d = 0; d < first.rank; ++d) shape.push_back(first.dims[static_cast<std::size_t>(d)].size());
  for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  if (!shape.empty() && row > 0) shape[0] = elements / row;
  return shape;
}

std::vector<EngineTensor> engine_tensors(const ModelSpec& m, const std::vector<UnitPtr>& units) {
  std::vector<EngineTensor> out;
  for (const UnitPtr& u : units)
    for (const BufferSpec& b : u->buffers) {
      const bool scale = b.key.slot == Slot::scale;  // an FP8 weight's block scales: named as checkpoints name them
      out.push_back({b.key.device,
                     scale ? scale_buffer_name(m, b.key.buffer, b.packing) : buffer_name(m, b.key.buffer, b.packing, b.expert_groups),
                     b.dtype, buffer_shape(b), std::string(to_string(b.key.slot))});
    }
  std::stable_sort(out.begin(), out.end(), [](const EngineTensor& a, const EngineTensor& b) { return a.device < b.device; });
  return out;
}

bool held(const StageSlot& s) { return s.claimed || s.running || s.leaving; }

/// Copies the trainer's params into the staging; the update is then ready, or failed with
/// its staging freed (the units never saw a byte of it).
asio::awaitable<void> copy_update(std::shared_ptr<JobState> s, std::shared_ptr<UpdateRun> u) {
  std::exception_ptr failure;
  ExecutionReport r;
  const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>> from{{u->trainer, u->sources}};  // GCC 12: not inside co_await
  try {
    r = co_await s->copy_units(from, u->stage, u->staging, &u->active);
  } catch (const std::exception& e) {
    failure = std::current_exception();
    u->report.error = e.what();
  } catch (...) {
    failure = std::current_exception();
    u->report.error = "unknown error";
  }
  for (const UnitPtr& x : u->sources) --x->readers;
  u->report.copy_seconds = since(u->began);
  if (failure || u->cancelled) {
    if (u->cancelled) u->report.error = "cancelled";
    u->phase = UpdateRun::Phase::failed;
    for (const UnitPtr& x : u->staging) s->free_unit(*x);
    u->staging.clear();
    s->slots[u->stage].update.reset();
    log(LogLevel::warn, "job", "weight update of {} to version {} failed: {}; its units keep their version",
        s->stages[u->stage].name(), u->report.version, u->report.error);
  } else {
    u->phase = UpdateRun::Phase::ready;
    u->report.moved_bytes = r.link_bytes;
    u->report.copied_bytes = r.local_bytes;
  }
  s->changed.notify();
}

}  // namespace

std::string_view to_string(PauseMode p) {
  switch (p) {
    case PauseMode::wait: return "wait";
    case PauseMode::keep: return "keep";
    case PauseMode::abort: return "abort";
  }
  return "?";
}

PauseMode parse_pause_mode(std::string_view s) {
  for (PauseMode p : {PauseMode::wait, PauseMode::keep, PauseMode::abort})
    if (to_string(p) == s) return p;
  throw Error("pause mode '" + std::string(s) + "' is not one a generation stage knows (wait, keep, abort)");
}

std::optional<std::size_t> JobState::trainer_of(std::size_t i) const {
  for (std::size_t t = 0; t < stages.size(); ++t)
    if (t != i && stages[t].kind == StageKind::train && stages[t].role == stages[i].role) return t;
  return std::nullopt;
}

std::string JobState::shared_device(const std::vector<Collection>& plan) const {
  if (!spec.async) return {};
  for (std::size_t g = 0; g < stages.size(); ++g) {
    if (stages[g].kind != StageKind::generate) continue;
    const std::vector<DeviceId> gen = plan[g].devices();
    for (std::size_t t = 0; t < stages.size(); ++t) {
      if (stages[t].kind != StageKind::train) continue;
      for (DeviceId d : plan[t].devices())
        if (std::find(gen.begin(), gen.end(), d) != gen.end())
          return "async job: " + stages[g].name() + " and " + stages[t].name() + " share device " + std::to_string(d) +
                 "; generation and training run at the same time in an async job, so its plan keeps them on separate devices";
    }
  }
  return {};
}

std::shared_ptr<UpdateRun> JobState::begin_update(std::size_t i) {
  const std::string name = stages[i].name();
  if (!spec.async) throw Error("begin_weight_update: the job is not async (its job file has no \"mode\": \"async\")");
  if (stages[i].kind != StageKind::generate) throw Error("begin_weight_update: '" + name + "' is not a generation model-stage");
  const std::optional<std::size_t> t = trainer_of(i);
  if (!t) throw Error("begin_weight_update: the " + stages[i].role + " model of '" + name + "' is not trained in this job");
  StageSlot& gen = slots[i];
  const StageSlot& trainer = slots[*t];
  if (gen.update) throw Error("begin_weight_update: an update of '" + name + "' is already in flight (finish or cancel it first)");
  if (held(trainer))
    throw Error("begin_weight_update: '" + stages[*t].name() + "' is running; begin the update after it leaves");
  if (transition && !transition->finished) throw Error("begin_weight_update: a transition is in flight");
  const std::int64_t version = trainer.state.policy_version;
  if (std::all_of(gen.units.begin(), gen.units.end(), [&](const UnitPtr& u) { return u->version >= version; }))
    throw Error("begin_weight_update: '" + name + "' already holds version " + std::to_string(version) + ", the trainer's latest");
  auto u = std::make_shared<UpdateRun>();
  u->stage = i;
  u->trainer = *t;
  u->targets = gen.units;
  u->sources = trainer.units;
  u->began = Clock::now();
  u->report.started = std::chrono::duration<double>(u->began.time_since_epoch()).count();
  u->report.model_stage = name;
  u->report.version = version;
  for (const UnitPtr& x : gen.units) u->staging.push_back(allocate_unit(i, x->emu));  // a throw frees what was allocated
  u->metadata = engine_tensors(*stages[i].model, gen.units);
  for (const UnitPtr& x : u->sources) ++x->readers;
  gen.update = u;
  asio::co_spawn(ex, copy_update(shared_from_this(), u), asio::detached);
  return u;
}

asio::awaitable<void> JobState::switch_in(std::shared_ptr<UpdateRun> u, PauseMode p, Clock::time_point pause_from,
                                          std::vector<std::shared_ptr<DeviceEvent>> after) {
  auto self = shared_from_this();  // keeps the state alive across suspension
  StageSlot& slot = slots[u->stage];
  slot.switch_pending = true;  // no run starts until every unit has switched
  co_await until_ready(ex, std::move(after));
  std::exception_ptr failure;
  for (std::size_t k = 0; k < u->targets.size() && !failure; ++k) {
    LiveUnit& target = *u->targets[k];
    LiveUnit& staged = *u->staging[k];
    const bool framework_memory =
        std::any_of(target.memory.begin(), target.memory.end(), [](const DeviceBuffer& m) { return m.borrowed(); });
    if (framework_memory) {
      // The framework's memory stays the unit's: the staged params are copied into it.
      const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>> from{{u->stage, {u->staging[k]}}};
      const std::vector<UnitPtr> into{u->targets[k]};  // GCC 12: no braced lists inside co_await
      try {
        const ExecutionReport r = co_await copy_units(from, u->stage, into);
        u->report.copied_bytes += r.local_bytes + r.link_bytes;
      } catch (...) {
        failure = std::current_exception();
      }
      if (failure) break;
    } else {
      std::swap(target.memory, staged.memory);
      std::swap(target.lifetime, staged.lifetime);  // the old memory's views expire when it is freed below
    }
    target.version = u->report.version;
  }
  for (const UnitPtr& x : u->staging) free_unit(*x);
  u->staging.clear();
  slot.switch_pending = false;
  slot.update.reset();
  if (failure) {
    // Only an in-place copy into framework memory can fail here; the unit it failed on
    // keeps its old version number, so the mix is visible, not silent.
    u->phase = UpdateRun::Phase::failed;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      u->report.error = e.what();
    }
    changed.notify();
    std::rethrow_exception(failure);
  }
  slot.state.policy_version = std::max(slot.state.policy_version, u->report.version);
  if (p == PauseMode::abort) ++*slot.aborts;
  u->phase = UpdateRun::Phase::switched;
  u->report.completed = true;
  u->report.pause = p;
  const auto now = Clock::now();
  u->report.seconds = std::chrono::duration<double>(now - u->began).count();
  u->report.paused_seconds = std::chrono::duration<double>(now - std::max(pause_from, u->began)).count();
  for (const UnitPtr& x : u->targets) u->report.unit_versions.push_back(x->version);
  update_log.push_back(u->report);
  log(LogLevel::debug, "job", "{} switched to version {} ({}): {:.4f} s, paused {:.6f} s", stages[u->stage].name(),
      u->report.version, to_string(p), u->report.seconds, u->report.paused_seconds);
  changed.notify();
}

asio::awaitable<void> JobState::within_staleness(std::size_t i) {
  if (!spec.async || stages[i].kind != StageKind::generate) co_return;
  const std::optional<std::size_t> t = trainer_of(i);
  if (!t) co_return;
  auto self = shared_from_this();
  StageSlot& slot = slots[i];
  // The run about to start is number `runs`: it may use params `max_staleness` versions
  // older than that at most (run k of a one-step off-policy job reads version k − 1).
  const std::int64_t need = slot.runs - spec.max_staleness;
  const auto arrived = Clock::now();  // from here generation stands still until it may run
  bool began = false;
  for (;;) {
    std::int64_t have = std::numeric_limits<std::int64_t>::max();
    for (const UnitPtr& u : slot.units) have = std::min(have, u->version);
    if (have >= need) co_return;
    if (auto u = slot.update) {
      if (u->phase == UpdateRun::Phase::ready && !slot.switch_pending) {
        // Between runs: nothing of the stage is running. Generation stood still for what
        // of the copy it waited out, and for the switch.
        u->report.automatic = true;
        co_await switch_in(u, PauseMode::wait, std::max(arrived, u->began), {});
        continue;
      }
    } else if (began) {
      throw Error(stages[i].name() + " needs params of version " + std::to_string(need) +
                  " (max_staleness " + std::to_string(spec.max_staleness) + ") and the update to them failed");
    } else if (slots[*t].state.policy_version >= need && !held(slots[*t]) && !(transition && !transition->finished)) {
      begin_update(i);
      slots[i].update->report.automatic = true;
      began = true;
      continue;
    }
    co_await changed.wait();  // the trainer's next version, or the copy
  }
}

WeightUpdate Job::begin_weight_update(std::string_view model_stage) {
  return WeightUpdate(s_, s_->begin_update(s_->index(model_stage)));
}

std::int64_t Job::max_staleness() const { return s_->spec.max_staleness; }
std::vector<WeightUpdateReport> Job::weight_updates() const { return s_->update_log; }

bool UnitContext::aborted() const { return aborts_ && *aborts_ != aborts_at_entry_; }

WeightUpdate::WeightUpdate(std::shared_ptr<JobState> job, std::shared_ptr<UpdateRun> run)
    : s_(std::move(job)), run_(std::move(run)) {}

std::int64_t WeightUpdate::version() const { return run_->report.version; }
const std::string& WeightUpdate::model_stage() const { return run_->report.model_stage; }
const std::vector<EngineTensor>& WeightUpdate::metadata() const { return run_->metadata; }
bool WeightUpdate::ready() const { return run_->phase != UpdateRun::Phase::copying; }
bool WeightUpdate::switched() const { return run_->phase == UpdateRun::Phase::switched; }

asio::awaitable<void> WeightUpdate::wait() {
  auto s = s_;
  auto u = run_;
  while (u->phase == UpdateRun::Phase::copying) co_await s->changed.wait();
  if (u->phase == UpdateRun::Phase::failed)
    throw Error("weight update of " + u->report.model_stage + " to version " + std::to_string(u->report.version) +
                " failed: " + u->report.error);
}

asio::awaitable<WeightUpdateReport> WeightUpdate::finish(PauseMode pause, std::vector<FrameworkStream> streams) {
  auto s = s_;
  auto u = run_;
  const auto called = Clock::now();
  while (u->phase == UpdateRun::Phase::copying) co_await s->changed.wait();
  if (u->phase == UpdateRun::Phase::failed)
    throw Error("finish: the weight update of " + u->report.model_stage + " to version " + std::to_string(u->report.version) +
                " failed (" + u->report.error + "); its units keep their version");
  if (u->phase == UpdateRun::Phase::switched) co_return u->report;  // the job switched it to keep within max_staleness
  StageSlot& slot = s->slots[u->stage];
  auto from = called;
  if (pause == PauseMode::wait) {
    slot.switch_pending = true;  // the next run waits for the switch
    while ((slot.running || slot.leaving) && u->phase == UpdateRun::Phase::ready) co_await s->changed.wait();
    if (u->phase == UpdateRun::Phase::switched) co_return u->report;
    from = Clock::now();  // the run in flight has ended: from here the stage stands still
  }
  std::vector<DeviceId> on;
  for (const UnitPtr& x : u->targets) on.insert(on.end(), x->emu.gpus.begin(), x->emu.gpus.end());
  co_await s->switch_in(u, pause, from, s->framework_events(streams, on));
  co_return u->report;
}

void WeightUpdate::cancel() {
  auto& u = *run_;
  if (u.phase == UpdateRun::Phase::copying) {
    u.cancelled = true;
    for (Executor* e : u.active) e->cancel();
    return;
  }
  if (u.phase == UpdateRun::Phase::ready && !s_->slots[u.stage].switch_pending) {
    for (const UnitPtr& x : u.staging) s_->free_unit(*x);
    u.staging.clear();
    u.phase = UpdateRun::Phase::failed;
    u.report.error = "cancelled";
    s_->slots[u.stage].update.reset();
    s_->changed.notify();
  }
}

}  // namespace nereus
